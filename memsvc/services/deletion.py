"""Deleting turns (logically), retiring a chunk version, and purging deleted text for good.

Each is a log change that records its projection work in the same transaction; the call
then does the work itself (reconcile, and for a delete the surviving neighbours' new
chunks). A crash, or a store or model outage, between the two leaves the work recorded:
the worker (or the next start) finishes it, and searches meanwhile never return a chunk
the log no longer holds live (memsvc.services.search verifies hits)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import nullcontext

import structlog

from memsvc.domain import validation
from memsvc.domain.access import FULL, Access
from memsvc.domain.errors import FailedPrecondition, InvalidArgument, ReplyTooLarge
from memsvc.domain.limits import MAX_POP_EVENTS, MAX_RESPONSE_BYTES
from memsvc.domain.pages import ITEM_OVERHEAD_BYTES, PAGE_BYTES, cut
from memsvc.domain.records import EventRow
from memsvc.domain.types import (
    REASON_UNKNOWN,
    ChunkRecord,
    DeleteResult,
    MemoryEvent,
    RecordError,
    TurnRange,
)
from memsvc.observability import metrics
from memsvc.ports import ChunkStore, EventLog, LogReader, Notifier, Span, WriterLocks
from memsvc.services.keyed_writes import KeyedWrite
from memsvc.services.projection import Projector
from memsvc.services.vectors import ERASURE_EPOCH

log = structlog.get_logger(__name__)

ERASURE_PENDING = "erasure_pending"


class DeletionService:
    def __init__(
        self,
        log: EventLog,
        store: ChunkStore,
        projector: Projector,
        locks: WriterLocks,
        notifier: Notifier,
    ) -> None:
        self.log = log
        self.store = store
        self.projector = projector
        self.locks = locks
        self.notifier = notifier
        self._purge_listeners: list[Callable[[str, list[int]], None]] = []

    def on_purge(self, listener: Callable[[str, list[int]], None]) -> None:
        """`listener(conversation_id, turn_ids)` after a purge of those turns: other copies
        of their text (a model move's previous collection) forget them too."""
        self._purge_listeners.append(listener)

    # -- LogicalDeleteBySource ------------------------------------------------------------
    def delete(
        self,
        conversation_id: str,
        turn_range: TurnRange | None,
        chunk_ids: Sequence[str],
        access: Access = FULL,
        defer_store: bool = False,
    ) -> DeleteResult:
        """Delete turns: a range, the turns the listed chunks cover (any chunk the
        conversation ever had, superseded ones included), or (neither) the whole
        conversation. Chunks over them are hidden (kept for audit until purged); surviving
        neighbours get new chunks, stored before this returns when the model and store
        can (else by the worker). `defer_store`: return once the log holds the deletion,
        without the conversation's writer lock, leaving the store to the worker; searches
        leave out a chunk over a deleted turn until it is reconciled (memsvc.services.selection)."""
        conv = validation.conversation_id(conversation_id, "conversation_id")
        access.check(conv, "conversation_id")
        if turn_range is not None:
            validation.turn_range(turn_range, "turn_range")
            if chunk_ids:
                raise InvalidArgument("chunk_ids", "give turn_range or chunk_ids, not both")
        errors: list[RecordError] = []
        # the log change needs no writer lock (the log orders it); the store's work does
        with nullcontext() if defer_store else self.locks.hold(conv):
            spans: list[Span] | None
            if chunk_ids:
                spans = self._spans_of_chunks(conv, chunk_ids, errors)
                if not spans:
                    return DeleteResult(0, 0, errors)
            elif turn_range is not None:
                spans = [(turn_range.start, turn_range.end)]
            else:
                spans = None
            with self.log.transaction() as tx:
                if tx.conversation(conv) is None:
                    return DeleteResult(0, 0, errors)
                seq = tx.record_change(conv, reconcile=True)
                events_deleted = tx.mark_events_deleted(conv, spans, seq)
            self.notifier.notify()
            if defer_store:
                return DeleteResult(0, events_deleted, errors)
            # the deleted turns' chunks are hidden before the lock is let go
            reconciled = self.projector.reconcile(conv)
        self._store_neighbours(conv, reconciled.pending)
        return DeleteResult(reconciled.hidden, events_deleted, errors)

    # -- PopEvents --------------------------------------------------------------------------
    def pop(
        self,
        conversation_id: str,
        count: int,
        access: Access = FULL,
        max_reply_bytes: int = 0,
        idempotency_key: str = "",
    ) -> list[MemoryEvent]:
        """Delete the conversation's newest live turns, `count` of them (0: one) or fewer
        within `max_reply_bytes` (0: PAGE_BYTES), and return them as appended, in turn
        order: a session rewinding. One transaction that takes the conversation's row
        before it reads which turns are newest, so callers popping at once get different
        turns; the store follows as after a deferred delete. A pop returns what it deletes
        or deletes nothing: when the newest turn alone is over the budget, ReplyTooLarge
        and the transaction is undone. `idempotency_key`: a retry returns the first pop's
        turns and deletes nothing more (memsvc.services.keyed_writes)."""
        conv = validation.conversation_id(conversation_id, "conversation_id")
        access.check(conv, "conversation_id")
        if not 0 <= count <= MAX_POP_EVENTS:
            raise InvalidArgument("count", f"must be 0 (= 1) to {MAX_POP_EVENTS}")
        if not 0 <= max_reply_bytes <= MAX_RESPONSE_BYTES:
            raise InvalidArgument(
                "max_reply_bytes", f"must be 0 (= {PAGE_BYTES:,}) to {MAX_RESPONSE_BYTES:,}"
            )
        wanted, budget = count or 1, max_reply_bytes or PAGE_BYTES
        keyed = None
        if idempotency_key:
            keyed = KeyedWrite.of_pop(idempotency_key, conv, wanted, budget)
        if keyed is None:
            with self.log.snapshot() as r:
                if r.nth_newest_live_turn(conv, 1) is None:  # nothing to pop: no work recorded
                    return []
        with self.log.transaction() as tx:
            if keyed is not None:
                earlier = keyed.claim_answer(tx)
                if earlier is not None:
                    return _popped_before(tx, conv, json.loads(earlier))
                if tx.nth_newest_live_turn(conv, 1) is None:
                    keyed.record(tx, [])
                    return []
            seq = tx.record_change(conv, reconcile=True)  # holds the row from here
            first = tx.nth_newest_live_turn(conv, wanted)
            newest = tx.events_after(conv, -1 if first is None else first - 1, wanted)
            popped, _ = cut(reversed(newest), EventRow.size, wanted, budget)  # from the newest
            needed = popped[0].size() + ITEM_OVERHEAD_BYTES if popped else 0
            if needed > budget:  # the newest alone (cut never returns an empty page)
                # raising undoes the transaction: nothing is deleted
                raise ReplyTooLarge(
                    f"max_reply_bytes: turn {popped[0].turn_id} alone needs"
                    f" {needed:,} bytes, over the"
                    f" {budget:,} asked for (0: {PAGE_BYTES:,}); nothing was deleted: ask for"
                    f" up to {MAX_RESPONSE_BYTES:,} and raise the client's receive limit"
                    " to match"
                )
            popped.reverse()
            if popped:
                tx.mark_events_deleted(conv, [(popped[0].turn_id, popped[-1].turn_id)], seq)
            if keyed is not None:
                keyed.record(tx, [e.turn_id for e in popped])  # with the deletion, at once
        self.notifier.notify()
        return [e.as_appended() for e in popped]

    def _store_neighbours(self, conv: str, pending: Sequence[ChunkRecord]) -> None:
        """Store the surviving neighbours' new chunks and settle. The model runs outside the
        conversation's lock (store_records takes it for its write): a delete never makes a
        build of the same conversation wait for the model. A model or store failure leaves
        the recorded work to the worker."""
        if pending:
            try:
                result = self.projector.store_records(pending, [], lacking=True)
                if result.errors:
                    raise RuntimeError(result.errors[0].message)
            except Exception as exc:
                log.warning("delete_neighbours_deferred", error=str(exc)[:300])
            return  # store_records settled what it wrote
        with self.locks.hold(conv):
            self.projector.settle(conv)

    def _spans_of_chunks(
        self, conv: str, chunk_ids: Sequence[str], errors: list[RecordError]
    ) -> list[Span]:
        """Turn spans of the listed chunks: any id this conversation ever had; an id it
        never had is an error and changes nothing."""
        ids = list(dict.fromkeys(chunk_ids))
        with self.log.snapshot() as r:
            known = r.history_spans(conv, ids)
        spans: list[Span] = []
        for i, cid in enumerate(ids):
            span = known.get(cid)
            if span is None:
                errors.append(
                    RecordError(
                        cid,
                        f"chunk_ids[{i}]: no chunk with this id in conversation {conv!r}",
                        REASON_UNKNOWN,
                    )
                )
            else:
                spans.append(span)
        return spans

    # -- RetireChunkVersion -----------------------------------------------------------------
    def retire_version(
        self, conversation_id: str, chunk_version: int, access: Access = FULL
    ) -> int:
        """Remove a version other than the one searches read (a rebuild under way is
        cancelled). Returns the chunks removed."""
        conv = validation.conversation_id(conversation_id, "conversation_id")
        access.check(conv, "conversation_id")
        if chunk_version < 1:
            raise InvalidArgument("chunk_version", "must be >= 1")
        with self.locks.hold(conv):
            with self.log.transaction() as tx:
                row = tx.conversation(conv)
                if row is None:
                    return 0
                if chunk_version == row.active_version:
                    raise FailedPrecondition(
                        f"chunk_version {chunk_version} is the version conversation {conv!r}"
                        " is searched in; Reindex it to another version first"
                    )
                if chunk_version == row.building_version:
                    tx.stop_building(conv)
                tx.drop_layout_version(conv, chunk_version)
                tx.record_change(conv, reconcile=True)
            retired = len(self.store.chunks_of(conv, deleted=None, version=chunk_version))
            self.projector.reconcile(conv)
            self.projector.settle(conv)
        metrics.CHUNKS_WRITTEN.labels("retired").inc(retired)
        return retired

    # -- PurgeDeleted -----------------------------------------------------------------------
    def purge_deleted(
        self, conversation_id: str, all_conversations: bool = False, access: Access = FULL
    ) -> tuple[int, int]:
        """Physically erase deleted chunks and turns of one conversation or of all: from the
        store, the event log (a tombstone keeps each turn id, so numbering continues) and
        the embedding cache. The files themselves are rewritten without them at the next
        clean stop (memsvc.app)."""
        if not conversation_id and not all_conversations:
            raise InvalidArgument(
                "conversation_id",
                "name a conversation, or set all_conversations to purge every conversation",
            )
        if conversation_id and all_conversations:
            raise InvalidArgument("all_conversations", "set it or conversation_id, not both")
        if conversation_id:
            targets = [validation.conversation_id(conversation_id, "conversation_id")]
            access.check(targets[0], "conversation_id")
        else:
            stored = {
                c.record.metadata.conversation_id for c in self.store.chunks_of(None, deleted=True)
            }
            with self.log.snapshot() as r:
                targets = sorted(stored | set(r.conversations_with_deleted()))
            targets = [c for c in targets if access.allows(c)]
        chunks = events = 0
        for conv in targets:
            with self.locks.hold(conv):
                removed, erased = self._purge(conv)
            chunks += removed
            events += erased
        if chunks or events:
            self.store.compact()
        metrics.CHUNKS_WRITTEN.labels("purged").inc(chunks)
        return chunks, events

    def _purge(self, conv: str) -> tuple[int, int]:
        deleted = self.store.chunks_of(conv, deleted=True)
        with self.log.snapshot() as r:
            waiting = r.holds_deleted(conv)
        if not deleted and not waiting:
            return 0, 0
        with self.log.transaction() as tx:
            seq = tx.record_change(conv, reconcile=True)
            turns = tx.purge_events(conv, seq)
            tx.add_erasures(tx.purge_layout(conv, turns))
            tx.set_meta(ERASURE_PENDING, "1")
            # fences writes that were embedding meanwhile (memsvc.services.vectors)
            tx.set_meta(ERASURE_EPOCH, str(int(tx.get_meta(ERASURE_EPOCH) or 0) + 1))
        reconciled = self.projector.reconcile(conv)
        self.projector.settle(conv)
        for listener in self._purge_listeners:
            listener(conv, turns)
        return max(len(deleted), reconciled.removed), len(turns)


def _popped_before(tx: LogReader, conv: str, turn_ids: list[int]) -> list[MemoryEvent]:
    """What a keyed pop deleted, read again for its retry; refused once purged (the text
    is gone for good: a retry cannot get it back)."""
    rows = tx.events(conv, turn_ids)
    if any(t not in rows or not (rows[t].text or rows[t].payload) for t in turn_ids):
        raise FailedPrecondition(
            "idempotency_key: the turns this pop deleted were purged since (PurgeDeleted);"
            " their text cannot be returned again"
        )
    return [rows[t].as_appended() for t in turn_ids]
