"""The write path: events into the log, chunks out of it, records into the store."""

from __future__ import annotations

import base64
import binascii
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from memsvc import metrics, validation
from memsvc.chunking import ChunkRenderer
from memsvc.embedder import Embedder, EmbeddingCache
from memsvc.errors import InvalidArgument
from memsvc.eventlog import EventLog, EventRow, IndexQueue
from memsvc.filters import quote
from memsvc.limits import MAX_TURN_CHARS
from memsvc.locks import ConversationLocks
from memsvc.projection import Projector, Replan
from memsvc.store import ChunkStore
from memsvc.text import clean_text
from memsvc.types import (
    REASON_UNKNOWN,
    AppendResult,
    BuildResult,
    ChunkRecord,
    DeleteResult,
    MemoryEvent,
    RecordError,
    TurnRange,
    UpsertResult,
)

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class ChunkPage:
    chunks: list[ChunkRecord]
    next_page_token: str


class IngestService:
    """The write path's public operations. Every change to a conversation's layout or
    stored chunks runs under that conversation's lock (memsvc.locks); the projector keeps
    the store equal to the layout of the live turns."""

    def __init__(
        self,
        events: EventLog,
        store: ChunkStore,
        embedder: Embedder,
        cache: EmbeddingCache,
        renderer: ChunkRenderer,
        default_version: int,
        locks: ConversationLocks | None = None,
        max_turn_chars: int = MAX_TURN_CHARS,
    ) -> None:
        self.events = events
        self.queue = IndexQueue(events)
        self.store = store
        self.embedder = embedder
        self.cache = cache
        self.locks = locks or ConversationLocks()
        self.projector = Projector(events, store, embedder, cache, renderer, self.locks)
        self.default_version = default_version
        self.max_turn_chars = max_turn_chars
        self._recount_tokens_if_tokenizer_changed()

    def _recount_tokens_if_tokenizer_changed(self) -> None:
        """Token counts in the log belong to one tokenizer; recount them after a model change."""
        tokenizer = self.embedder.tokenizer_id
        if self.events.get_meta("tokenizer") == tokenizer:
            return
        with self.events.transaction() as db:
            rows = self.events.all_event_texts(db)
            counts = self.embedder.count_tokens([text for _, _, text in rows])
            self.events.set_tokens(
                db, [(n, conv, turn) for (conv, turn, _), n in zip(rows, counts, strict=True)]
            )
            self.events.set_meta(db, "tokenizer", tokenizer)
        if rows:
            log.info("event_tokens_recounted", events=len(rows), tokenizer=tokenizer)

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
                with self.events.transaction() as db:
                    self._store_events(db, conv, rows, allow_gaps)
            plan = self.projector.replan(conv, version)
            self._retire_unreplaced(plan)
            return self._build_result(plan)

    def build_for_index(self, conversation_id: str, chunk_version: int) -> BuildResult:
        """The worker's build: the conversation's pending chunks."""
        with self.locks.hold(conversation_id):
            plan = self.projector.replan(conversation_id, chunk_version)
            self._retire_unreplaced(plan)
            return self._build_result(plan)

    def _build_result(self, plan: Replan) -> BuildResult:
        with self.events.snapshot() as db:
            lo, hi, count = self.events.turn_stats(db, plan.conversation_id)
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

    def _store_events(
        self, db: sqlite3.Connection, conv: str, rows: list[EventRow], allow_gaps: bool
    ) -> list[EventRow]:
        """Write new and edited turns; identical re-sends are no-ops and deleted turns stay
        deleted (after a purge, as tombstones). Returns the rows written."""
        stored = self.events.get_events(db, conv, (r.turn_id for r in rows))
        changed = [
            r
            for r in rows
            if r.turn_id not in stored
            or (not stored[r.turn_id].deleted and not stored[r.turn_id].same_content(r))
        ]
        new_ids = sorted(r.turn_id for r in rows if r.turn_id not in stored)
        if not allow_gaps and new_ids:
            self._check_no_gap(db, conv, new_ids)
        self.events.put_events(db, changed)
        return changed

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
        with self.events.transaction() as db:
            for conv, rows in good.items():
                savepoint = f"sp_{accepted}_{duplicates}"
                db.execute(f"SAVEPOINT {savepoint}")
                try:
                    changed = self._store_events(db, conv, rows, allow_gaps)
                except InvalidArgument as exc:
                    db.execute(f"ROLLBACK TO {savepoint}")
                    errors += [RecordError(_event_ref(r), str(exc)) for r in rows]
                    continue
                db.execute(f"RELEASE {savepoint}")
                accepted += len(changed)
                duplicates += len(rows) - len(changed)
                if changed:
                    version = self.queue.version_of(db, conv) or self.default_version
                    self.queue.enqueue(db, conv, len(changed), version)
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

    def _check_no_gap(self, db: sqlite3.Connection, conv: str, new_ids: list[int]) -> None:
        lo, hi, count = self.events.turn_stats(db, conv)
        all_lo = min([*new_ids, lo] if count else new_ids)
        all_hi = max([*new_ids, hi] if count else new_ids)
        if all_hi - all_lo + 1 != count + len(new_ids):
            have = f"turns {lo}..{hi}" if count else "no turns"
            raise InvalidArgument(
                "events.turn_id",
                f"turn ids {new_ids[0]}..{new_ids[-1]} leave a gap (conversation has {have});"
                " send the missing turns or set allow_gaps",
            )

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

    # -- LogicalDeleteBySource ------------------------------------------------------------
    def delete(
        self, conversation_id: str, turn_range: TurnRange | None, chunk_ids: Sequence[str]
    ) -> DeleteResult:
        """Delete turns: a range, the turns the listed chunks cover, or (neither) the whole
        conversation. The layout is re-planned without them: chunks that covered them are
        marked deleted (kept for audit until purged), surviving neighbours get new chunks,
        stored before this returns."""
        conv = validation.conversation_id(conversation_id, "conversation_id")
        if turn_range is not None:
            validation.turn_range(turn_range, "turn_range")
            if chunk_ids:
                raise InvalidArgument("chunk_ids", "give turn_range or chunk_ids, not both")
        errors: list[RecordError] = []
        with self.locks.hold(conv):
            spans: list[tuple[int, int]] | None
            if chunk_ids:
                spans = self._spans_of_chunks(conv, chunk_ids, errors)
                if not spans:
                    return DeleteResult(0, 0, errors)
            elif turn_range is not None:
                spans = [(turn_range.start, turn_range.end)]
            else:
                spans = None
            with self.events.transaction() as db:
                events_deleted = self.events.mark_events_deleted(db, conv, spans)
                versions = self.events.layout_versions(db, conv)
            plans = [self.projector.replan(conv, v) for v in versions]
            newly = {cid for p in plans for cid in p.deleted}
            hidden = self.projector.hide_deleted_turns(conv, spans)
            # Surviving neighbours: server-built, stored now so the conversation stays
            # searchable. If the model or store fails, the worker retries them.
            pending = [r for p in plans for r in p.pending]
            if pending:
                try:
                    result = self.projector.store_records(pending, [])
                    if result.errors:
                        raise RuntimeError(result.errors[0].message)
                except Exception as exc:
                    log.warning("delete_neighbours_deferred", error=str(exc)[:300])
                    with self.events.transaction() as db:
                        version = self.queue.version_of(db, conv) or self.default_version
                        self.queue.enqueue(db, conv, 1, version)
            for p in plans:
                if p.superseded:
                    self.projector.retire_superseded(conv)
                    break
        # the replans hid their gone chunks; hide_deleted_turns counted only the others
        metrics.CHUNKS_WRITTEN.labels("deleted").inc(len(newly) + hidden)
        return DeleteResult(len(newly) + hidden, events_deleted, errors)

    def _spans_of_chunks(
        self, conv: str, chunk_ids: Sequence[str], errors: list[RecordError]
    ) -> list[tuple[int, int]]:
        """Turn spans of the listed chunks of this conversation (any version, deleted ones
        included); an id the conversation never had is an error and changes nothing."""
        with self.events.snapshot() as db:
            layout = self.events.conversation_layout(db, conv)
        spans: list[tuple[int, int]] = []
        for i, cid in enumerate(dict.fromkeys(chunk_ids)):
            row = layout.get(cid)
            if row is None:
                errors.append(
                    RecordError(
                        cid,
                        f"chunk_ids[{i}]: no chunk with this id in conversation {conv!r}",
                        REASON_UNKNOWN,
                    )
                )
            else:
                spans.append((row.start_turn, row.end_turn))
        return spans

    # -- ListChunks / RetireChunkVersion / PurgeDeleted -------------------------------------
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
        expr = f"conversation_id == {quote(conv)}"
        if not include_deleted:
            expr += " and deleted == false"
        if chunk_version:
            expr += f" and chunk_version == {int(chunk_version)}"
        rows = sorted(
            (c.record for c in self.store.query(expr)),
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

    def retire_version(self, conversation_id: str, chunk_version: int) -> int:
        conv = validation.conversation_id(conversation_id, "conversation_id")
        if chunk_version < 1:
            raise InvalidArgument("chunk_version", "must be >= 1")
        with self.locks.hold(conv):
            ids = [
                c.record.chunk_id
                for c in self.store.query(
                    f"conversation_id == {quote(conv)} and chunk_version == {chunk_version}"
                )
            ]
            self.store.delete(ids)
            with self.events.transaction() as db:
                self.events.drop_layout_version(db, conv, chunk_version)
                self.events.remove_store_version(db, conv, chunk_version)
        metrics.CHUNKS_WRITTEN.labels("retired").inc(len(ids))
        return len(ids)

    def purge_deleted(self, conversation_id: str) -> tuple[int, int]:
        """Physically erase deleted chunks and turns: from the store, the event log (a
        tombstone keeps each turn id, so numbering continues) and the embedding cache."""
        if conversation_id:
            targets = [validation.conversation_id(conversation_id, "conversation_id")]
        else:
            stored = {
                c.record.metadata.conversation_id for c in self.store.query("deleted == true")
            }
            targets = sorted(stored | set(self.events.conversations_with_deleted()))
        chunks = events = 0
        for conv in targets:
            with self.locks.hold(conv):
                ids = [
                    c.record.chunk_id
                    for c in self.store.query(
                        f"conversation_id == {quote(conv)} and deleted == true"
                    )
                ]
                self.store.delete(ids)
                with self.events.transaction() as db:
                    turns = self.events.purge_events(db, conv)
                    hashes = self.events.purge_layout(db, conv, turns)
                self.cache.forget(sorted(hashes))
            chunks += len(ids)
            events += len(turns)
        metrics.CHUNKS_WRITTEN.labels("purged").inc(chunks)
        return chunks, events


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
