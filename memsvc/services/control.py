"""Controls of background indexing: pause and resume, Reindex (and its cancellation), index
status, and WaitForIndexed (read your writes)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import structlog

from memsvc.domain import validation
from memsvc.domain.access import FULL, Access
from memsvc.domain.errors import InvalidArgument, NotFound
from memsvc.domain.pages import cut, token_position, utf8_size
from memsvc.domain.pages import page_token as page_token_of
from memsvc.domain.records import IndexTotals, QueueItem
from memsvc.ports import EventLog, IndexQueue, Notifier, WriterLocks
from memsvc.services.indexing import IndexWorker
from memsvc.services.projection import Projector

log = structlog.get_logger(__name__)

DEFAULT_WAIT_MS = 10_000
MAX_WAIT_MS = 300_000
# WaitForIndexed replies this long before the caller's deadline, so the reply reaches it.
WAIT_REPLY_MARGIN_S = 0.2
MAX_STATUS_PAGE = 5000
STATES = ("pending", "indexing", "idle", "failed")


def _status_size(item: QueueItem) -> int:
    return utf8_size(item.conversation_id, item.last_error, item.last_timestamp) + 64


class IndexControl:
    def __init__(
        self,
        log: EventLog,
        queue: IndexQueue,
        worker: IndexWorker,
        projector: Projector,
        locks: WriterLocks,
        notifier: Notifier,
    ) -> None:
        self.log = log
        self.queue = queue
        self.worker = worker
        self.projector = projector
        self.locks = locks
        self.notifier = notifier

    # -- pause ----------------------------------------------------------------------------
    def set_paused(self, paused: bool, access: Access = FULL) -> None:
        """Pause (fleet-wide: the flag is in the log): returns once no step is in flight.
        Durable: a paused server restarts paused."""
        access.need_unlimited("pausing indexing")
        self.queue.set_paused(paused)
        self.worker.hold_off(paused)

    @property
    def paused(self) -> bool:
        """The flag as the log holds it now (the same on every replica)."""
        return self.queue.paused()

    # -- status ---------------------------------------------------------------------------
    def status(
        self, conversation_ids: Sequence[str] = (), access: Access = FULL
    ) -> list[QueueItem]:
        """The named conversations, or (none named) every one the token may see: for
        callers in this process; GetIndexStatus reads those a page at a time (status_page)."""
        ids = [
            validation.conversation_id(c, f"conversation_ids[{i}]")
            for i, c in enumerate(conversation_ids)
        ]
        if ids:
            access.check_all(ids, "conversation_ids")
            return self.queue.status(ids)
        access.every_conversation("GetIndexStatus")
        return self.queue.status(prefixes=access.prefixes)

    def status_page(
        self,
        page_size: int,
        page_token: str,
        states: Sequence[str] = (),
        within: str = "",
        access: Access = FULL,
    ) -> tuple[list[QueueItem], str]:
        """A page of the conversations the token may see, in id order (keyset), of at most
        `page_size` (0 = 1,000) and PAGE_BYTES; only those in `states` and starting with
        `within` when given. Returns the next page's token (empty at the end)."""
        access.every_conversation("GetIndexStatus")
        if not 0 <= page_size <= MAX_STATUS_PAGE:
            raise InvalidArgument("page_size", f"must be 0 (= 1,000) to {MAX_STATUS_PAGE:,}")
        for i, state in enumerate(states):
            if state not in STATES:
                raise InvalidArgument(f"states[{i}]", f"one of {', '.join(STATES)}")
        if within:
            within = validation.conversation_id(within, "conversation_prefix")
        after = token_position(page_token, "c", "GetIndexStatus") or ""
        size = page_size or 1000
        rows = self.queue.status_page(after, size + 1, access.prefixes, within, states)
        page, more = cut(rows, _status_size, size)
        return page, page_token_of("c", page[-1].conversation_id) if more else ""

    def totals(self, access: Access = FULL) -> IndexTotals:
        """Totals over every conversation the token may see, in one query."""
        counts = self.queue.counts(access.prefixes)
        return IndexTotals(
            conversations=sum(n for n, _ in counts.values()),
            backlog=sum(b for _, b in counts.values()),
            pending=counts.get("pending", (0, 0))[0],
            indexing=counts.get("indexing", (0, 0))[0],
            failed=counts.get("failed", (0, 0))[0],
            paused=self.paused,
        )

    # -- read your writes -----------------------------------------------------------------
    def is_indexed(self, conversation_id: str, turn_id: int) -> bool:
        """Whether default searches find every turn up to `turn_id` as last written (a
        deleted turn: its chunks hidden): read your writes. Never while the store answering
        is another than the one the log counts chunks in (back without its data, not yet
        followed by the audit: memsvc.services.audit)."""
        with self.log.snapshot() as r:
            row = r.conversation(conversation_id)
            seq = r.seq_through(conversation_id, turn_id)
            same_store = r.get_meta("store_identity") == self.projector.store.identity
        return (
            same_store
            and row is not None
            and seq is not None
            and row.findable_through(turn_id, seq)
        )

    def wait(
        self,
        conversation_id: str,
        turn_id: int,
        timeout_ms: int,
        caller_remaining_s: float | None,
        caller_waiting: Callable[[], bool],
        access: Access = FULL,
    ) -> tuple[bool, QueueItem]:
        """WaitForIndexed: at most the smaller of `timeout_ms` (0 = 10 s) and the caller's
        remaining time (answered just before it runs out). Returns (indexed, status)."""
        conv = validation.conversation_id(conversation_id, "conversation_id")
        access.check(conv, "conversation_id")
        if not 0 <= timeout_ms <= MAX_WAIT_MS:
            raise InvalidArgument("timeout_ms", f"must be 0 (= {DEFAULT_WAIT_MS}) to {MAX_WAIT_MS}")
        timeout_s = (timeout_ms or DEFAULT_WAIT_MS) / 1000
        if caller_remaining_s is not None:
            timeout_s = max(0.0, min(timeout_s, caller_remaining_s - WAIT_REPLY_MARGIN_S))
        item = self.wait_for_indexed(conv, turn_id, timeout_s, caller_waiting)
        if item is None:
            raise NotFound(f"conversation {conv!r} has no appended events")
        return self.is_indexed(conv, turn_id), item

    def wait_for_indexed(
        self,
        conversation_id: str,
        turn_id: int,
        timeout_s: float,
        caller_waiting: Callable[[], bool] = lambda: True,
    ) -> QueueItem | None:
        """Until every turn up to `turn_id` is findable by a default search, the time-out,
        the conversation failing, or the caller leaving (`caller_waiting` false: its
        deadline passed or it cancelled). Returns the last status seen (None: conversation
        unknown)."""
        deadline = time.monotonic() + timeout_s
        while True:
            seen = self.notifier.generation
            status = self.queue.status([conversation_id])
            item = status[0] if status else None
            if item is not None and self.is_indexed(conversation_id, turn_id):
                return self._settled_status(item, min(deadline, time.monotonic() + 0.5))
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (item is not None and item.state == "failed"):
                return item
            if not caller_waiting():
                return item
            self.notifier.wait(min(remaining, 0.1), seen)

    def _settled_status(self, item: QueueItem, until: float) -> QueueItem:
        """The turn is findable; a worker that wrote it may be a moment from ending its
        step: let the status it reports catch up (briefly)."""
        seen = self.notifier.generation
        while item.state == "indexing" and time.monotonic() < until:
            self.notifier.wait(0.05, seen)
            seen = self.notifier.generation
            status = self.queue.status([item.conversation_id])
            if not status:
                break
            item = status[0]
        return item

    # -- Reindex --------------------------------------------------------------------------
    def request_reindex(
        self,
        conversation_ids: Sequence[str],
        all_conversations: bool,
        chunk_version: int,
        cancel: bool,
        access: Access = FULL,
    ) -> int:
        """Reindex as asked by a caller: named conversations or all (all the token may
        see), a version (0 = each conversation's own), or the cancellation of rebuilds."""
        if not all_conversations and not conversation_ids:
            raise InvalidArgument("conversation_ids", "name conversations or set all")
        if chunk_version < 0:
            raise InvalidArgument("chunk_version", "must be >= 0 (0 = the conversation's)")
        ids = [
            validation.conversation_id(c, f"conversation_ids[{i}]")
            for i, c in enumerate([] if all_conversations else conversation_ids)
        ]
        access.check_all(ids, "conversation_ids")
        if not ids and access.limited:
            with self.log.snapshot() as r:
                ids = r.conversation_ids(access.prefixes)
            if not ids:
                return 0
        if cancel:
            return self.cancel_reindex(ids)
        return self.reindex(ids, chunk_version)

    def reindex(self, conversation_ids: Sequence[str], chunk_version: int = 0) -> int:
        """Queue conversations (all when empty) for a rebuild from the event log: in place
        for their own version (`chunk_version` 0 or theirs), else beside it under the new
        one, which becomes the searched version once wholly stored."""
        with self.log.snapshot() as r:
            known = r.conversation_ids()
        targets = [c for c in conversation_ids if c in set(known)] if conversation_ids else known
        for conv in targets:
            with self.locks.hold(conv), self.log.transaction() as tx:
                row = tx.conversation(conv)
                if row is None:
                    continue
                version = chunk_version or row.active_version
                dropped = False
                if version != row.active_version and version != row.building_version:
                    if row.building_version:
                        tx.drop_layout_version(conv, row.building_version)
                        dropped = True
                    tx.start_building(conv, version)
                tx.reset_indexed(conv, version)
                tx.record_change(conv, turns=tx.live_turn_count(conv), reconcile=dropped)
        self.notifier.notify()
        return len(targets)

    def cancel_reindex(self, conversation_ids: Sequence[str]) -> int:
        """Stop rebuilds under way (all when empty): the version that was answering keeps
        answering, the partial new version is removed. Returns conversations cancelled."""
        items = [i for i in self.queue.status(conversation_ids) if i.reindex]
        for item in items:
            conv = item.conversation_id
            with self.locks.hold(conv):
                with self.log.transaction() as tx:
                    row = tx.conversation(conv)
                    if row is None or not row.building_version:
                        continue
                    tx.stop_building(conv)
                    tx.drop_layout_version(conv, row.building_version)
                    tx.record_change(conv, reconcile=True)
                self.projector.reconcile(conv)
                self.projector.settle(conv)
            log.info(
                "reindex_cancelled",
                conversation_id=conv,
                kept=item.active_version,
                removed=item.building_version,
            )
        self.notifier.notify()
        return len(items)
