"""The write path: events into the log, chunks out of it, records into the store."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from memsvc.domain import validation
from memsvc.domain.errors import InvalidArgument
from memsvc.domain.limits import MAX_TURN_CHARS
from memsvc.domain.records import EventRow
from memsvc.domain.text import clean_text
from memsvc.domain.types import (
    AppendResult,
    BuildResult,
    ChunkRecord,
    MemoryEvent,
    RecordError,
    TurnRange,
    UpsertResult,
)
from memsvc.ports import ChunkStore, Embedder, EventLog, LogWriter, WriterLocks
from memsvc.services.projection import Projector, Replan

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ChunkPage:
    chunks: list[ChunkRecord]
    next_page_token: str


class IngestService:
    """The write path's public operations. Every change to a conversation's layout or
    stored chunks runs under that conversation's writer lock; the projector keeps the store
    equal to the layout of the live turns."""

    def __init__(
        self,
        log: EventLog,
        store: ChunkStore,
        embedder: Embedder,
        projector: Projector,
        locks: WriterLocks,
        default_version: int,
        max_turn_chars: int = MAX_TURN_CHARS,
    ) -> None:
        self.log = log
        self.store = store
        self.embedder = embedder
        self.projector = projector
        self.locks = locks
        self.default_version = default_version
        self.max_turn_chars = max_turn_chars

    # -- BuildIncrementalChunks ---------------------------------------------------------
    def build(
        self,
        events: Sequence[MemoryEvent],
        chunk_version: int = 0,
        allow_gaps: bool = False,
        conversation_id: str = "",
    ) -> BuildResult:
        """Log the events, re-plan the conversation and return every chunk of its layout
        not yet stored (so re-sending after a lost response recovers)."""
        if chunk_version < 0:
            raise InvalidArgument("chunk_version", "must be >= 0 (0 = server default)")
        version = chunk_version or self.default_version
        if events:
            conv = validation.events(events, self.max_turn_chars)
            if conversation_id and conversation_id != conv:
                raise InvalidArgument("conversation_id", "differs from the events' conversation_id")
        elif not conversation_id:
            raise InvalidArgument(
                "events", "must not be empty (or set conversation_id to get its pending chunks)"
            )
        else:
            conv = validation.conversation_id(conversation_id, "conversation_id")
        rows = self._event_rows(events)
        with self.locks.hold(conv):
            if rows:
                with self.log.transaction() as tx:
                    _store_events(tx, conv, rows, allow_gaps)
            plan = self.projector.replan(conv, version)
            self._retire_unreplaced(plan)
            return self._build_result(plan)

    def build_for_index(self, conversation_id: str, chunk_version: int) -> BuildResult:
        """The worker's plan step: the conversation's pending chunks."""
        with self.locks.hold(conversation_id):
            plan = self.projector.replan(conversation_id, chunk_version)
            self._retire_unreplaced(plan)
            return self._build_result(plan)

    def _build_result(self, plan: Replan) -> BuildResult:
        with self.log.snapshot() as r:
            lo, hi, count = r.turn_stats(plan.conversation_id)
        return BuildResult(
            plan.conversation_id,
            TurnRange(lo, hi) if count else None,
            plan.pending,
            plan.superseded,
        )

    def _retire_unreplaced(self, plan: Replan) -> None:
        """Superseded chunks with nothing pending to replace them get no upsert to retire
        them on: retire them now (the caller holds the conversation's lock)."""
        if plan.superseded and not plan.pending:
            self.projector.retire_superseded(plan.conversation_id)

    # -- AppendEvents ---------------------------------------------------------------------
    def append(self, events: Sequence[MemoryEvent], allow_gaps: bool = False) -> AppendResult:
        """Durably log events of any number of conversations and queue them for indexing.
        A conversation with a bad event is rejected whole (its events are listed in
        `errors`); the others are written."""
        validation.event_count(events)
        by_conv: dict[str, list[tuple[int, MemoryEvent]]] = {}
        for i, e in enumerate(events):
            by_conv.setdefault(e.conversation_id, []).append((i, e))
        errors: list[RecordError] = []
        good: dict[str, list[EventRow]] = {}
        for conv, items in by_conv.items():
            try:
                validation.conversation_events(items, conv, self.max_turn_chars)
            except InvalidArgument as exc:
                errors += [RecordError(_event_ref(e), str(exc)) for _, e in items]
                continue
            good[conv] = self._event_rows([e for _, e in items])
        accepted = duplicates = 0
        with self.log.transaction() as tx:
            for conv, rows in good.items():
                try:
                    with tx.savepoint():
                        changed = _store_events(tx, conv, rows, allow_gaps)
                except InvalidArgument as exc:
                    errors += [RecordError(_event_ref(r), str(exc)) for r in rows]
                    continue
                accepted += len(changed)
                duplicates += len(rows) - len(changed)
                if changed:
                    version = tx.queued_version(conv) or self.default_version
                    tx.enqueue(conv, len(changed), version)
        return AppendResult(accepted, duplicates, errors)

    def _event_rows(self, events: Sequence[MemoryEvent]) -> list[EventRow]:
        cleaned = [clean_text(e.text) for e in events]
        tokens = self.embedder.count_tokens(cleaned)
        return [
            EventRow(
                conversation_id=e.conversation_id,
                turn_id=e.turn_id,
                speaker=e.speaker,
                speaker_name=clean_text(e.speaker_name),
                text=e.text,
                clean_text=c,
                timestamp=e.timestamp,
                participants=tuple(clean_text(p) for p in e.participants),
                tokens=n,
            )
            for e, c, n in zip(events, cleaned, tokens, strict=True)
        ]

    # -- UpsertVectorRecords --------------------------------------------------------------
    def upsert(
        self, records: Sequence[ChunkRecord], register_versions: bool = True
    ) -> UpsertResult:
        """Embed and store records the server built. A record is stored only if it equals
        the chunk the conversation's current layout holds for its id; anything else is a
        per-record error with a reason, and the other records are written."""
        errors: list[RecordError] = []
        valid: list[ChunkRecord] = []
        seen: set[str] = set()
        for i, r in enumerate(records):
            try:
                validation.record(r, f"records[{i}]")
                if r.chunk_id in seen:
                    raise InvalidArgument(f"records[{i}].chunk_id", "duplicate in this batch")
            except InvalidArgument as exc:
                errors.append(RecordError(r.chunk_id or f"records[{i}]", str(exc)))
                continue
            seen.add(r.chunk_id)
            valid.append(r)
        if not valid:
            return UpsertResult(errors=errors)
        return self.projector.store_records(valid, errors, register_versions)

    # -- ListChunks -----------------------------------------------------------------------
    def list_chunks(
        self,
        conversation_id: str,
        include_deleted: bool,
        page_size: int,
        page_token: str,
        chunk_version: int = 0,
    ) -> ChunkPage:
        conv = validation.conversation_id(conversation_id, "conversation_id")
        if page_size < 0 or page_size > 1000:
            raise InvalidArgument("page_size", "must be 0 (= 100) to 1000")
        size = page_size or 100
        offset = _decode_page_token(page_token)
        stored = self.store.chunks_of(
            conv, deleted=None if include_deleted else False, version=chunk_version or None
        )
        rows = sorted(
            (c.record for c in stored),
            key=lambda r: (
                r.metadata.turn_range.start,
                r.metadata.chunk_version,
                r.metadata.part_index,
                r.metadata.turn_range.end,
            ),
        )
        page = rows[offset : offset + size]
        more = offset + size < len(rows)
        return ChunkPage(page, _encode_page_token(offset + size) if more else "")


def _store_events(
    tx: LogWriter, conv: str, rows: list[EventRow], allow_gaps: bool
) -> list[EventRow]:
    """Write new and edited turns; identical re-sends are no-ops and deleted turns stay
    deleted (after a purge, as tombstones). Returns the rows written."""
    stored = tx.events(conv, (r.turn_id for r in rows))
    changed = [
        r
        for r in rows
        if r.turn_id not in stored
        or (not stored[r.turn_id].deleted and not stored[r.turn_id].same_content(r))
    ]
    new_ids = sorted(r.turn_id for r in rows if r.turn_id not in stored)
    if not allow_gaps and new_ids:
        _check_no_gap(tx, conv, new_ids)
    tx.put_events(changed)
    return changed


def _check_no_gap(tx: LogWriter, conv: str, new_ids: list[int]) -> None:
    lo, hi, count = tx.turn_stats(conv)
    all_lo = min([*new_ids, lo] if count else new_ids)
    all_hi = max([*new_ids, hi] if count else new_ids)
    if all_hi - all_lo + 1 != count + len(new_ids):
        have = f"turns {lo}..{hi}" if count else "no turns"
        raise InvalidArgument(
            "events.turn_id",
            f"turn ids {new_ids[0]}..{new_ids[-1]} leave a gap (conversation has {have});"
            " send the missing turns or set allow_gaps",
        )


def _event_ref(e: MemoryEvent | EventRow) -> str:
    return f"{e.conversation_id}#{e.turn_id}"


def _encode_page_token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"o:{offset}".encode()).decode()


def _decode_page_token(token: str) -> int:
    if not token:
        return 0
    try:
        raw = base64.urlsafe_b64decode(token.encode()).decode()
        if raw.startswith("o:") and raw[2:].isdigit():
            return int(raw[2:])
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise InvalidArgument("page_token", "not a token from a previous ListChunks response")
