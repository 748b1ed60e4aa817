"""The write path: events into the log, chunks out of it, records into the store."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import structlog

from memsvc.domain import oversize, validation
from memsvc.domain.access import FULL, Access
from memsvc.domain.errors import InvalidArgument
from memsvc.domain.limits import MAX_TURN_CHARS
from memsvc.domain.oversize import Oversize
from memsvc.domain.pages import cut, token_position, utf8_size
from memsvc.domain.pages import page_token as make_token
from memsvc.domain.records import Conversation, EventRow
from memsvc.domain.text import clean_text, normal_id, normal_name
from memsvc.domain.types import (
    REASON_DELETED,
    REASON_LAST_TURN_MOVED,
    AppendResult,
    BuildResult,
    ChunkRecord,
    MemoryEvent,
    RecordError,
    Truncation,
    TurnRange,
    UpsertResult,
)
from memsvc.ports import ChunkStore, Embedder, EventLog, LogReader, LogWriter, WriterLocks
from memsvc.services.keyed_writes import KeyedWrite
from memsvc.services.projection import Projector, Replan
from memsvc.services.turns import (
    LastTurnMoved,
    TurnsDeleted,
    after_last_turn,
    changed_events,
    check_last_turn,
    provisional_ids,
)

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
        build_grace_s: float = 30.0,
        oversize: Oversize = Oversize.REFUSE,
    ) -> None:
        self.log = log
        self.store = store
        self.embedder = embedder
        self.projector = projector
        self.locks = locks
        self.default_version = default_version
        self.max_turn_chars = max_turn_chars
        self.oversize = oversize
        # Turns a caller builds synchronously are its to upsert: the worker takes them
        # over only after this long (a caller that died between Build and Upsert).
        self.build_grace_s = build_grace_s

    # -- BuildIncrementalChunks ---------------------------------------------------------
    def build(
        self,
        events: Sequence[MemoryEvent],
        chunk_version: int = 0,
        allow_gaps: bool = False,
        conversation_id: str = "",
        access: Access = FULL,
        restore: bool = False,
    ) -> BuildResult:
        """Log the events, re-plan the conversation and return every chunk of its layout
        not yet stored (so re-sending after a lost response recovers).

        `chunk_version` 0 is the conversation's version (a new conversation's: the server
        default). Another version starts a rebuild under it, beside the current one, which
        keeps answering searches until the rebuild is wholly stored. `restore` (admin):
        turns sent for deleted ones bring them back (TurnsDeleted without it)."""
        if restore:
            access.need_admin("restoring deleted turns", "restore")
        if chunk_version < 0:
            raise InvalidArgument("chunk_version", "must be >= 0 (0 = the conversation's)")
        events, truncated = self._fit(events)
        if events:
            conv, events = validation.events(events, self.max_turn_chars)
            if (
                conversation_id
                and validation.conversation_id(conversation_id, "conversation_id") != conv
            ):
                raise InvalidArgument("conversation_id", "differs from the events' conversation_id")
        elif not conversation_id:
            raise InvalidArgument(
                "events", "must not be empty (or set conversation_id to get its pending chunks)"
            )
        else:
            conv = validation.conversation_id(conversation_id, "conversation_id")
        access.check(conv, "events[0].conversation_id" if events else "conversation_id")
        rows = self._event_rows(events)
        with self.locks.hold(conv):
            with self.log.transaction() as tx:
                row = tx.open_conversation(conv, chunk_version or self.default_version)
                version = _build_version(tx, row, chunk_version)
                if rows:
                    changed = changed_events(tx, conv, rows, allow_gaps, restore)
                    if changed:
                        seq = tx.record_change(conv, turns=len(changed), delay_s=self.build_grace_s)
                        tx.put_events(changed, seq)
            plan = self.projector.replan(conv, version)
            if plan.superseded and not plan.pending:
                # nothing pending to replace them: no upsert would retire them
                self.projector.retire_superseded(conv)
            self.projector.settle(conv)
            return self._build_result(plan, truncated)

    def _build_result(self, plan: Replan, truncated: list[Truncation]) -> BuildResult:
        with self.log.snapshot() as r:
            lo, hi, count = r.turn_stats(plan.conversation_id)
        return BuildResult(
            plan.conversation_id,
            TurnRange(lo, hi) if count else None,
            plan.pending,
            plan.superseded,
            truncated,
        )

    def _fit(self, events: Sequence[MemoryEvent]) -> tuple[list[MemoryEvent], list[Truncation]]:
        """Turns over the character limit cut to fit, when MEMSVC_OVERSIZE=truncate (else
        validation refuses them, naming the field)."""
        if self.oversize is Oversize.TRUNCATE:
            return oversize.truncate(events, self.max_turn_chars)
        return list(events), []

    # -- AppendEvents ---------------------------------------------------------------------
    def append(
        self,
        events: Sequence[MemoryEvent],
        allow_gaps: bool = False,
        access: Access = FULL,
        restore: bool = False,
        assign_turn_ids: bool = False,
        idempotency_key: str = "",
        expected_last_turn: Mapping[str, int] | None = None,
    ) -> AppendResult:
        """Durably log events of any number of conversations and record their indexing
        work. A conversation with a bad event is rejected whole (its events are listed in
        `errors`; a re-sent deleted turn with reason `deleted`, unless `restore`, admin
        only, brings it back); the others are written. `assign_turn_ids`: the server numbers
        each conversation's events after its last turn, in the order sent, inside the
        transaction that holds the conversation's row (concurrent appenders never collide),
        and stamps events without a timestamp with the time of receipt.
        `idempotency_key`: a retry of this write returns its first answer and writes
        nothing (memsvc.services.keyed_writes). `expected_last_turn`: compare-and-append,
        a conversation named there is written only if its last turn id is still that one
        (else its events are refused with reason `last_turn_moved`)."""
        if restore:
            access.need_admin("restoring deleted turns", "restore")
        validation.event_count(events)
        expected = validation.expected_last_turns(expected_last_turn or {}, events)
        flags: list[object] = [allow_gaps, restore, assign_turn_ids]
        if expected:  # a key's request hash from before this field stays the same without it
            flags.append(sorted(expected.items()))
        keyed = KeyedWrite.of(idempotency_key, events, flags) if idempotency_key else None
        if assign_turn_ids:
            events = provisional_ids(events)
        events, truncated = self._fit(events)
        by_conv: dict[str, list[tuple[int, MemoryEvent]]] = {}
        errors: list[RecordError] = []
        for i, e in enumerate(events):
            try:
                conv = validation.conversation_id(e.conversation_id, f"events[{i}].conversation_id")
            except InvalidArgument as exc:
                errors.append(RecordError(_event_ref(e), str(exc)))
                continue
            access.check(conv, f"events[{i}].conversation_id")
            by_conv.setdefault(conv, []).append((i, e))
        good: dict[str, list[EventRow]] = {}
        for conv, items in by_conv.items():
            try:
                normal = validation.conversation_events(items, conv, self.max_turn_chars)
            except InvalidArgument as exc:
                errors += [RecordError(_event_ref(e), str(exc)) for _, e in items]
                continue
            good[conv] = self._event_rows(normal)
        accepted = duplicates = 0
        numbered: dict[str, int] = {}  # conversation -> the turn id its first event got
        with self.log.transaction() as tx:
            earlier = keyed.claim(tx) if keyed is not None else None
            if earlier is not None:
                return earlier  # a retry: the first answer, nothing written again
            # Rows are locked in id order: two appends naming the same conversations never
            # wait on each other in a cycle (a database that locks rows).
            for conv, rows in sorted(good.items()):
                try:
                    with tx.savepoint():
                        tx.open_conversation(conv, self.default_version)
                        if conv in expected:
                            check_last_turn(tx, conv, expected[conv])
                        if assign_turn_ids:
                            rows = after_last_turn(tx, conv, rows)
                            numbered[conv] = rows[0].turn_id
                        changed = changed_events(tx, conv, rows, allow_gaps, restore)
                        if changed:
                            tx.put_events(changed, tx.record_change(conv, turns=len(changed)))
                except InvalidArgument as exc:
                    errors += [RecordError(_event_ref(r), str(exc)) for r in rows]
                    continue
                except TurnsDeleted as exc:
                    errors += [RecordError(_event_ref(r), str(exc), REASON_DELETED) for r in rows]
                    continue
                except LastTurnMoved as exc:
                    errors += [
                        RecordError(_event_ref(r), str(exc), REASON_LAST_TURN_MOVED) for r in rows
                    ]
                    continue
                accepted += len(changed)
                duplicates += len(rows) - len(changed)
            refused = {e.chunk_id for e in errors}
            turn_ids = []
            if assign_turn_ids:  # events[i] carries its provisional id: its place in its conv
                for e in events:
                    first = numbered.get(normal_id(e.conversation_id))
                    turn_ids.append(-1 if first is None else first + e.turn_id)
            result = AppendResult(
                accepted,
                duplicates,
                errors,
                [t for t in truncated if t.event not in refused],
                turn_ids,
            )
            if keyed is not None:
                keyed.answer(tx, result)  # with the events, in one transaction
        return result

    def _event_rows(self, events: Sequence[MemoryEvent]) -> list[EventRow]:
        cleaned = [clean_text(e.text) for e in events]
        tokens = self.embedder.count_tokens(cleaned)
        return [
            EventRow(
                conversation_id=e.conversation_id,
                turn_id=e.turn_id,
                speaker=e.speaker,
                speaker_name=normal_name(e.speaker_name),
                text=e.text,
                clean_text=c,
                timestamp=e.timestamp,
                participants=tuple(normal_name(p) for p in e.participants),
                tokens=n,
                payload=e.payload,
            )
            for e, c, n in zip(events, cleaned, tokens, strict=True)
        ]

    # -- UpsertVectorRecords --------------------------------------------------------------
    def upsert(self, records: Sequence[ChunkRecord], access: Access = FULL) -> UpsertResult:
        """Embed and store records the server built. A record is stored only if it equals
        the chunk the conversation's current layout holds for its id; anything else is a
        per-record error with a reason, and the other records are written."""
        errors: list[RecordError] = []
        valid: list[ChunkRecord] = []
        seen: set[str] = set()
        for i, r in enumerate(records):
            access.check(r.metadata.conversation_id, f"records[{i}].metadata.conversation_id")
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
        return self.projector.store_records(valid, errors)

    # -- ExportEvents ---------------------------------------------------------------------
    def export_events(
        self,
        conversation_id: str,
        page_size: int,
        page_token: str,
        access: Access = FULL,
        last: int = 0,
        turns: TurnRange | None = None,
    ) -> tuple[list[MemoryEvent], str]:
        """A page of the conversation's live events as appended (only the newest `last`,
        when set; only those with ids in `turns`, when given), and the next page's token
        (empty at the end)."""
        conv = validation.conversation_id(conversation_id, "conversation_id")
        access.check(conv, "conversation_id")
        if not 0 <= page_size <= 5000:
            raise InvalidArgument("page_size", "must be 0 (= 500) to 5000")
        if last < 0:
            raise InvalidArgument("last", "must be 0 (= every event) or more")
        if turns is not None:
            validation.turn_range(turns, "turn_range")
        size = page_size or 500
        after = _number(page_token, "t", "ExportEvents", -1)
        if turns is not None:
            after = max(after, turns.start - 1)
        with self.log.snapshot() as r:
            # The first page fixes where the newest `last` begin; later pages follow the
            # token, so turns appended meanwhile do not shift the window under the reader.
            first = r.nth_newest_live_turn(conv, last) if last and not page_token else None
            if first is not None:
                after = first - 1
            rows_read = _live_events(r, conv, after)
            if turns is not None:
                rows_read = itertools.takewhile(lambda e: e.turn_id <= turns.end, rows_read)
            rows, more = cut(rows_read, EventRow.size, size)
        page = [e.as_appended() for e in rows]
        token = make_token("t", str(page[-1].turn_id)) if more else ""
        return page, token

    # -- ListChunks -----------------------------------------------------------------------
    def list_chunks(
        self,
        conversation_id: str,
        include_deleted: bool,
        page_size: int,
        page_token: str,
        chunk_version: int = 0,
        access: Access = FULL,
    ) -> ChunkPage:
        conv = validation.conversation_id(conversation_id, "conversation_id")
        access.check(conv, "conversation_id")
        if include_deleted:
            access.need_admin("reading deleted chunks", "include_deleted")
        if page_size < 0 or page_size > 1000:
            raise InvalidArgument("page_size", "must be 0 (= 100) to 1000")
        size = page_size or 100
        offset = _number(page_token, "o", "ListChunks", 0)
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
        page, more = cut(rows[offset:], _chunk_size, size)
        return ChunkPage(page, make_token("o", str(offset + len(page))) if more else "")


def _build_version(tx: LogWriter, row: Conversation, requested: int) -> int:
    """The version a Build plans: the conversation's (0), its rebuild's, or a new one,
    whose rebuild starts now (replacing another rebuild under way)."""
    if requested in (0, row.active_version):
        return row.active_version
    if requested == row.building_version:
        return requested
    if row.building_version:
        tx.drop_layout_version(row.conversation_id, row.building_version)
    tx.start_building(row.conversation_id, requested)
    tx.record_change(row.conversation_id, reconcile=bool(row.building_version))
    return requested


def _event_ref(e: MemoryEvent | EventRow) -> str:
    return f"{e.conversation_id}#{e.turn_id}"


def _number(token: str, kind: str, method: str, first: int) -> int:
    """The number a page token of `method` holds (`first` without a token)."""
    position = token_position(token, kind, method)
    if position is None:
        return first
    if not position.isdigit():
        raise InvalidArgument("page_token", f"not a token from a previous {method} response")
    return int(position)


# Events read per query while a page fills: a page of long turns never loads much more
# than it returns.
EXPORT_READ_BATCH = 32


def _live_events(r: LogReader, conv: str, after: int) -> Iterator[EventRow]:
    """The conversation's live events after turn `after`, in turn order, read lazily."""
    while True:
        rows = r.events_after(conv, after, EXPORT_READ_BATCH)
        yield from rows
        if len(rows) < EXPORT_READ_BATCH:
            return
        after = rows[-1].turn_id


def _chunk_size(r: ChunkRecord) -> int:
    m = r.metadata
    return utf8_size(r.chunk_id, r.text, m.conversation_id, *m.participants, m.intent_tag)
