"""The index worker: turns appended events into stored chunks in the background.

Work is per conversation, in the event log's index_queue table. A worker thread leases a
few pending conversations (the lease expires, so work held by a dead thread comes back),
builds their chunks incrementally from the log, embeds them in one batch across the
conversations and upserts. Failures are counted and retried with exponential back-off;
after `max_attempts` the conversation is `failed` with the last error visible, until new
events or a Reindex re-queue it. Everything is in SQLite, so a restart resumes where the
last process stopped: leases of the dead process are released at start-up, and a chunk
built but never stored is rebuilt (layout rows carry an `indexed` flag).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from memsvc.errors import StoreUnavailable
from memsvc.eventlog import QueueItem
from memsvc.ingest import IngestService
from memsvc.types import STALE_REASONS, ChunkRecord

log = structlog.get_logger(__name__)


PAUSED_KEY = "indexing_paused"


@dataclass(frozen=True)
class WorkerSettings:
    threads: int = 1
    batch_conversations: int = 8
    max_attempts: int = 5
    backoff_s: float = 1.0
    lease_s: float = 300.0
    # Chunks embedded per conversation per cycle: a huge turn is indexed in bounded steps,
    # taking turns with other conversations, and a shutdown waits for one step at most.
    max_chunks_per_cycle: int = 64
    idle_poll_s: float = 0.5


@dataclass(frozen=True)
class IndexTotals:
    conversations: int
    backlog: int
    pending: int
    indexing: int
    failed: int
    paused: bool


class IndexWorker:
    def __init__(self, ingest: IngestService, settings: WorkerSettings) -> None:
        self.ingest = ingest
        self.queue = ingest.queue
        self.settings = settings
        self._stop = threading.Event()
        self._paused = threading.Event()
        # Signalled when work arrives or a conversation finishes: wakes idle workers and
        # WaitForIndexed callers.
        self._changed = threading.Condition()
        self._threads: list[threading.Thread] = []
        # Held by a worker from lease to the end of processing: pausing waits on it, so
        # once set_paused(True) returns no batch is in flight.
        self._cycle = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self.ingest.events.get_meta(PAUSED_KEY) == "1":
            self._paused.set()
            log.warning("indexing_paused", reason="paused before the restart")
        released = self.queue.release_stale_leases()
        if released:
            log.info("index_leases_released", conversations=released)
        for i in range(self.settings.threads):
            t = threading.Thread(target=self._run, name=f"index-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the batch in flight within `timeout`; a batch still running then is
        abandoned: its leases go back to pending, so the next start takes it again."""
        self._stop.set()
        self.notify()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            released = self.queue.release_stale_leases()
            log.warning("index_batch_abandoned", conversations=released)

    def set_paused(self, paused: bool) -> None:
        """Pause: returns once the batch in flight (if any) is finished. Durable: a paused
        server restarts paused."""
        events = self.ingest.events
        with events.transaction() as db:
            events.set_meta(db, PAUSED_KEY, "1" if paused else "0")
        if paused:
            self._paused.set()
            with self._cycle:
                pass
        else:
            self._paused.clear()
        self.notify()

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    # -- the loop -------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cycle:
                items: list[QueueItem] = []
                # A store outage is nobody's fault: wait for it instead of failing attempts.
                if not self._paused.is_set() and self.ingest.store.up:
                    try:
                        items = self.queue.lease(
                            time.time(), self.settings.lease_s, self.settings.batch_conversations
                        )
                    except Exception:
                        log.exception("index_lease_failed")
                if items:
                    self.process(items)
                    continue
            with self._changed:
                self._changed.wait(self.settings.idle_poll_s)

    def process(self, items: Sequence[QueueItem]) -> None:
        """Re-plan each leased conversation, then embed and store all their pending chunks
        at once. The store write re-checks every chunk against the layout under the
        conversation's lock, so a delete or build that lands meanwhile wins."""
        built: list[tuple[QueueItem, list[ChunkRecord], int]] = []
        more: set[str] = set()
        cap = self.settings.max_chunks_per_cycle
        for item in items:
            try:
                result = self.ingest.build_for_index(item.conversation_id, item.chunk_version)
                last = result.turn_range.end if result.turn_range is not None else -1
                chunks = sorted(
                    result.chunks,
                    key=lambda c: (c.metadata.turn_range.start, c.metadata.part_index),
                )
                if len(chunks) > cap:
                    # This step stores the first `cap` chunks; the rest wait for next cycle.
                    last = chunks[cap].metadata.turn_range.start - 1
                    chunks = chunks[:cap]
                    more.add(item.conversation_id)
                built.append((item, chunks, last))
            except Exception as exc:
                self._fail(item, exc)
        if built:
            # Conversations being reindexed keep their old version searchable until done.
            for register in (True, False):
                group = [b for b in built if (not b[0].reindex) == register]
                if group:
                    self._upsert(group, register, more)
        self.notify()

    def _upsert(
        self,
        group: list[tuple[QueueItem, list[ChunkRecord], int]],
        register: bool,
        more: set[str],
    ) -> None:
        records = [r for _, chunks, _ in group for r in chunks]
        try:
            result = self.ingest.projector.store_records(records, [], register_versions=register)
        except Exception as exc:
            for item, _, _ in group:
                self._fail(item, exc)
            return
        refused = {e.chunk_id: e for e in result.errors}
        for item, chunks, last in group:
            errors = [refused[c.chunk_id] for c in chunks if c.chunk_id in refused]
            broken = [e for e in errors if e.reason not in STALE_REASONS]
            if broken:
                self._fail(item, RuntimeError("; ".join(e.message for e in broken[:3])))
                continue
            # Go round again if the layout moved on while we embedded (a delete or a build
            # won the race) or if this was one step of a large conversation.
            again = bool(errors) or item.conversation_id in more
            if not again and not register:
                self.ingest.events.add_store_versions([(item.conversation_id, item.chunk_version)])
            self.queue.complete(item.conversation_id, last, again)
            log.info(
                "conversation_indexed",
                conversation_id=item.conversation_id,
                chunks=len(chunks),
                last_turn=last,
                stale=len(errors),
            )

    def _fail(self, item: QueueItem, exc: BaseException) -> None:
        if isinstance(exc, StoreUnavailable) or self._stop.is_set() or not self.ingest.store.up:
            # An outage or a shutdown, not this conversation's fault: hand the lease back
            # without counting an attempt; it is taken again once the store is up.
            log.warning(
                "index_deferred", conversation_id=item.conversation_id, error=str(exc)[:300]
            )
            self.queue.release(item.conversation_id)
            return
        message = f"{type(exc).__name__}: {exc}"
        log.warning(
            "index_failed",
            conversation_id=item.conversation_id,
            attempt=item.attempts + 1,
            error=message[:300],
        )
        self.queue.fail(
            item.conversation_id,
            message,
            time.time(),
            self.settings.max_attempts,
            self.settings.backoff_s,
        )

    # -- read your writes -----------------------------------------------------------------
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
            with self._changed:
                self._changed.wait(min(remaining, 0.1))

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

    # -- Reindex --------------------------------------------------------------------------
    def cancel_reindex(self, conversation_ids: Sequence[str]) -> int:
        """Stop rebuilds under way (all when empty): the version that was answering keeps
        answering, the partial new version is removed. Returns conversations cancelled."""
        events, ingest = self.ingest.events, self.ingest
        with self._cycle:  # no batch in flight: none can complete the version meanwhile
            items = [i for i in self.queue.status(conversation_ids) if i.reindex]
            for item in items:
                conv, new = item.conversation_id, item.chunk_version
                with ingest.locks.hold(conv):
                    with events.transaction() as db:
                        complete = [v for v in events.complete_versions(db, conv) if v != new]
                        previous = max(complete, default=new)
                        self.queue.stop_reindex(db, conv, previous)
                    if previous != new:
                        ingest.retire_version(conv, new)
                log.info("reindex_cancelled", conversation_id=conv, kept=previous, removed=new)
        self.notify()
        return len(items)

    def reindex(self, conversation_ids: Sequence[str], chunk_version: int) -> int:
        """Queue conversations (all when empty) for a rebuild from the event log."""
        events = self.ingest.events
        known = events.conversations()
        targets = [c for c in conversation_ids if c in set(known)] if conversation_ids else known
        for conv in targets:
            with self.ingest.locks.hold(conv), events.transaction() as db:
                events.reset_indexed(db, conv, chunk_version)
                live = events.live_turn_count(db, conv)
                self.queue.enqueue(db, conv, max(1, live), chunk_version, reindex=True)
        self.notify()
        return len(targets)
