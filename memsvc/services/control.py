"""Controls of background indexing: pause and resume, Reindex (and its cancellation), index
status, and WaitForIndexed (read your writes)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import structlog

from memsvc.domain import validation
from memsvc.domain.errors import InvalidArgument, NotFound
from memsvc.domain.records import IndexTotals, QueueItem
from memsvc.ports import EventLog, IndexQueue, Notifier, WriterLocks
from memsvc.services.deletion import DeletionService
from memsvc.services.indexing import IndexWorker

log = structlog.get_logger(__name__)

PAUSED_KEY = "indexing_paused"
DEFAULT_WAIT_MS = 10_000
MAX_WAIT_MS = 300_000
# WaitForIndexed replies this long before the caller's deadline, so the reply reaches it.
WAIT_REPLY_MARGIN_S = 0.2


class IndexControl:
    def __init__(
        self,
        log: EventLog,
        queue: IndexQueue,
        worker: IndexWorker,
        deletion: DeletionService,
        locks: WriterLocks,
        notifier: Notifier,
        default_version: int,
    ) -> None:
        self.log = log
        self.queue = queue
        self.worker = worker
        self.deletion = deletion
        self.locks = locks
        self.notifier = notifier
        self.default_version = default_version

    # -- pause ----------------------------------------------------------------------------
    def paused_before(self) -> bool:
        """The durable flag: a paused server restarts paused."""
        with self.log.snapshot() as r:
            return r.get_meta(PAUSED_KEY) == "1"

    def set_paused(self, paused: bool) -> None:
        """Pause: returns once the batch in flight (if any) is finished. Durable."""
        with self.log.transaction() as tx:
            tx.set_meta(PAUSED_KEY, "1" if paused else "0")
        self.worker.hold_off(paused)

    @property
    def paused(self) -> bool:
        return self.worker.paused

    # -- status ---------------------------------------------------------------------------
    def status(self, conversation_ids: Sequence[str] = ()) -> list[QueueItem]:
        return self.queue.status(conversation_ids)

    def totals(self, items: Sequence[QueueItem] | None = None) -> IndexTotals:
        """Totals over every conversation (`items`: the full status, if already read)."""
        items = self.queue.status() if items is None else items
        return IndexTotals(
            conversations=len(items),
            backlog=sum(i.dirty for i in items),
            pending=sum(i.state == "pending" for i in items),
            indexing=sum(i.state == "indexing" for i in items),
            failed=sum(i.state == "failed" for i in items),
            paused=self.paused,
        )

    # -- read your writes -----------------------------------------------------------------
    def wait(
        self,
        conversation_id: str,
        turn_id: int,
        timeout_ms: int,
        caller_remaining_s: float | None,
        caller_waiting: Callable[[], bool],
    ) -> QueueItem:
        """WaitForIndexed: at most the smaller of `timeout_ms` (0 = 10 s) and the caller's
        remaining time (answered just before it runs out)."""
        conv = validation.conversation_id(conversation_id, "conversation_id")
        if not 0 <= timeout_ms <= MAX_WAIT_MS:
            raise InvalidArgument("timeout_ms", f"must be 0 (= {DEFAULT_WAIT_MS}) to {MAX_WAIT_MS}")
        timeout_s = (timeout_ms or DEFAULT_WAIT_MS) / 1000
        if caller_remaining_s is not None:
            timeout_s = max(0.0, min(timeout_s, caller_remaining_s - WAIT_REPLY_MARGIN_S))
        item = self.wait_for_indexed(conv, turn_id, timeout_s, caller_waiting)
        if item is None:
            raise NotFound(f"conversation {conv!r} has no appended events")
        return item

    def wait_for_indexed(
        self,
        conversation_id: str,
        turn_id: int,
        timeout_s: float,
        caller_waiting: Callable[[], bool] = lambda: True,
    ) -> QueueItem | None:
        """Until the conversation is indexed through `turn_id` with nothing pending, the
        time-out, or the caller leaving (`caller_waiting` false: its deadline passed or it
        cancelled). Returns the last status seen (None: conversation unknown)."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.queue.status([conversation_id])
            item = status[0] if status else None
            if item is not None and item.indexed_through(turn_id):
                return item
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (item is not None and item.state == "failed"):
                return item
            if not caller_waiting():
                return item
            self.notifier.wait(min(remaining, 0.1))

    # -- Reindex --------------------------------------------------------------------------
    def request_reindex(
        self,
        conversation_ids: Sequence[str],
        all_conversations: bool,
        chunk_version: int,
        cancel: bool,
    ) -> int:
        """Reindex as asked by a caller: named conversations or all, a version (0 = the
        default), or the cancellation of rebuilds under way."""
        if not all_conversations and not conversation_ids:
            raise InvalidArgument("conversation_ids", "name conversations or set all")
        if chunk_version < 0:
            raise InvalidArgument("chunk_version", "must be >= 0 (0 = server default)")
        ids = [] if all_conversations else list(conversation_ids)
        for i, conv in enumerate(ids):
            validation.conversation_id(conv, f"conversation_ids[{i}]")
        if cancel:
            return self.cancel_reindex(ids)
        return self.reindex(ids, chunk_version or self.default_version)

    def reindex(self, conversation_ids: Sequence[str], chunk_version: int) -> int:
        """Queue conversations (all when empty) for a rebuild from the event log."""
        with self.log.snapshot() as r:
            known = r.conversations()
        targets = [c for c in conversation_ids if c in set(known)] if conversation_ids else known
        for conv in targets:
            with self.locks.hold(conv), self.log.transaction() as tx:
                tx.reset_indexed(conv, chunk_version)
                tx.enqueue(conv, max(1, tx.live_turn_count(conv)), chunk_version, reindex=True)
        self.notifier.notify()
        return len(targets)

    def cancel_reindex(self, conversation_ids: Sequence[str]) -> int:
        """Stop rebuilds under way (all when empty): the version that was answering keeps
        answering, the partial new version is removed. Returns conversations cancelled."""
        with self.worker.quiet():  # no batch in flight: none can complete the version meanwhile
            items = [i for i in self.queue.status(conversation_ids) if i.reindex]
            for item in items:
                conv, new = item.conversation_id, item.chunk_version
                with self.locks.hold(conv):
                    with self.log.transaction() as tx:
                        complete = [v for v in tx.complete_versions(conv) if v != new]
                        previous = max(complete, default=new)
                        tx.stop_reindex(conv, previous)
                    if previous != new:
                        self.deletion.retire_version(conv, new)
                log.info("reindex_cancelled", conversation_id=conv, kept=previous, removed=new)
        self.notifier.notify()
        return len(items)
