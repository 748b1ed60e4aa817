"""The index worker: the projection work the log records, done in the background.

Work is per conversation, in the index queue. Each step of a worker thread reads top-down:

  lease     a few conversations with work due (the lease expires, so work held by a dead
            thread or process comes back; a heartbeat renews it while the step runs)
  plan      each one's chunks still to store: a reconcile when a change asked for one
            (delete, purge, retire, version switch), else the replans (its version, and a
            rebuild's), in bounded steps
  embed     one model batch across the conversations (outside any lock)
  write     each conversation's chunks under its writer lock, re-checked against the
            layout, then settled (how far searches reflect the log)
  complete  (or fail, counted and retried with exponential back-off; after `max_attempts`
            the conversation is `failed` with the last error visible, until new work
            re-queues it)

Everything is in the log, so a restart resumes where the last process stopped.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import structlog

from memsvc.domain.errors import (
    ConversationBusy,
    DiskFull,
    EmbedderUnavailable,
    StoreUnavailable,
)
from memsvc.domain.records import QueueItem
from memsvc.domain.types import REASON_BUSY, STALE_REASONS, ChunkRecord, UpsertResult
from memsvc.observability import tracing
from memsvc.ports import ChunkStore, EventLog, IndexQueue, Notifier, WriterLocks
from memsvc.services.health import Health
from memsvc.services.projection import Projector

log = structlog.get_logger(__name__)

# How long a worker trusts the pause flag it last read (it is the log's, fleet-wide).
PAUSE_CHECK_S = 0.5
# Seconds a step waits for a conversation another writer holds before leaving it for later.
PLAN_LOCK_WAIT_S = 0.5
# Pausing waits at most this long for steps in flight (on every process) to end.
PAUSE_WAIT_S = 60.0


@dataclass(frozen=True)
class WorkerSettings:
    threads: int = 1
    batch_conversations: int = 8
    max_attempts: int = 5
    backoff_s: float = 1.0
    lease_s: float = 30.0
    # Chunks embedded per conversation per step: a huge turn is indexed in bounded steps,
    # taking turns with other conversations, and a shutdown waits for one step at most.
    max_chunks_per_cycle: int = 64
    idle_poll_s: float = 0.5


@dataclass(frozen=True)
class Planned:
    """One leased conversation's step: the chunks it stores, and whether more remain."""

    item: QueueItem
    chunks: list[ChunkRecord]
    more: bool


class StepGate:
    """Index steps run side by side (one per worker thread: while one waits on the store,
    the embedder or a commit, another plans); `closed()` waits for the steps in flight
    and lets none start until it ends (a pause, or whoever must see no step running)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._steps = 0
        self._closers = 0

    @contextmanager
    def step(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._closers)
            self._steps += 1
        try:
            yield
        finally:
            with self._changed:
                self._steps -= 1
                self._changed.notify_all()

    @contextmanager
    def closed(self) -> Iterator[None]:
        with self._changed:
            self._closers += 1
            self._changed.wait_for(lambda: not self._steps)
        try:
            yield
        finally:
            with self._changed:
                self._closers -= 1
                self._changed.notify_all()


def worker_identity() -> str:
    """Names the leases of this process (host, pid, and a nonce against pid reuse)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class IndexWorker:
    def __init__(
        self,
        log_: EventLog,
        projector: Projector,
        queue: IndexQueue,
        store: ChunkStore,
        locks: WriterLocks,
        notifier: Notifier,
        health: Health,
        settings: WorkerSettings,
    ) -> None:
        self.log = log_
        self.projector = projector
        self.health = health
        self.queue = queue
        self.store = store
        self.locks = locks
        self.notifier = notifier
        self.settings = settings
        self.owner = worker_identity()
        self._stop = threading.Event()
        self._pause_read = (False, 0.0)  # (flag, monotonic time read)
        self._threads: list[threading.Thread] = []
        # Passed by a worker from lease to the end of processing: pausing closes it, so
        # once `hold_off(True)` returns no step is in flight.
        self.gate = StepGate()
        # Leases a failed step could not hand back (the log was unwritable): retried first.
        self._unreleased: list[QueueItem] = []
        self._unreleased_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        if self.paused:
            log.warning("indexing_paused", reason="paused before the restart")
        released = self.queue.release_stale_leases()
        if released:
            log.info("index_leases_released", conversations=released)
        for i in range(self.settings.threads):
            t = threading.Thread(target=self._run, name=f"index-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the step in flight within `timeout`; a step still running then is
        abandoned: its leases go back to pending, so the next start (or another process
        sharing the log) takes it again."""
        self._stop.set()
        self.notifier.notify()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            released = self.queue.release_owned(self.owner)
            log.warning("index_batch_abandoned", conversations=released)

    def hold_off(self, paused: bool) -> None:
        """The pause flag changed (it is in the log): read it now; pausing returns once no
        step is in flight, in this process or any other sharing the log (at most
        PAUSE_WAIT_S)."""
        self._pause_read = (paused, time.monotonic())
        self.notifier.notify()
        if not paused:
            return
        with self.gate.closed():
            pass
        deadline = time.monotonic() + PAUSE_WAIT_S
        while self.queue.leased() and time.monotonic() < deadline:
            self.notifier.wait(0.05)

    @property
    def paused(self) -> bool:
        """Indexing paused, fleet-wide (the flag is in the log; briefly cached here to spare
        idle polls a lease: the lease itself reads it, so a stale cache never outruns a
        pause)."""
        flag, read_at = self._pause_read
        if time.monotonic() - read_at > PAUSE_CHECK_S:
            try:
                flag = self.queue.paused()
            except Exception:  # the log unreachable: keep the last word on it
                return flag
            self._pause_read = (flag, time.monotonic())
        return flag

    def notify(self) -> None:
        self.notifier.notify()

    # -- the loop -------------------------------------------------------------------------
    def _run(self) -> None:
        # What a step records (layouts, leases, completions) is done again if a power
        # failure loses it; the calls' commits (appends, deletes) still wait for the disk.
        self.log.sync_lazily()
        while not self._stop.is_set():
            # read before looking for work: a notification while this step runs (an
            # append, a stop) ends the wait below at once, not after idle_poll_s
            seen = self.notifier.generation
            with self.gate.step():
                self._release_leftovers()
                items: list[QueueItem] = []
                # An outage (store, embedding server) or a full disk is nobody's fault:
                # wait for it instead of failing attempts.
                if (
                    self.health.writable
                    and self.store.up
                    and self.projector.embedder.available()
                    and not self.paused
                ):
                    try:
                        items = self.queue.lease(
                            None,
                            self.settings.lease_s,
                            self.settings.batch_conversations,
                            self.owner,
                        )
                    except Exception:
                        log.exception("index_lease_failed")
                if items:
                    try:
                        self.process(items)
                        continue
                    except Exception as exc:
                        # The loop outlives any step; leases it could not hand back are
                        # retried (or lapse and are taken again).
                        self.health.observe(exc)
                        log.exception("index_step_failed")
                        with self._unreleased_lock:
                            self._unreleased.extend(items)
            self.notifier.wait(self.settings.idle_poll_s, seen)

    def _release_leftovers(self) -> None:
        with self._unreleased_lock:
            while self._unreleased:
                try:
                    self.queue.release(self._unreleased[0])
                except Exception:
                    return
                self._unreleased.pop(0)

    def process(self, items: Sequence[QueueItem]) -> None:
        """One step over leased conversations: plan each, embed and write all their
        chunks at once, then complete (or fail) each."""
        with (
            self._renewing(items),
            tracing.span(
                "index step",
                {"memsvc.conversations": len(items)},
                links=[link for item in items for link in item.trace_links],
            ),
        ):
            plans = [p for p in (self._plan(item) for item in items) if p is not None]
            tracing.annotate(chunks=sum(len(p.chunks) for p in plans))
            self._complete(plans, self._write(plans))
        self.notifier.notify()

    def _plan(self, item: QueueItem) -> Planned | None:
        cap = self.settings.max_chunks_per_cycle
        conv = item.conversation_id
        try:
            # another writer holding it (a call, another replica) must not hold up the
            # other conversations of the batch: it is left for a later step
            with self.locks.hold(conv, wait_s=PLAN_LOCK_WAIT_S):
                chunks = self.projector.plan(conv)
        except Exception as exc:
            self._fail(item, exc)
            return None
        # The searched version's chunks first, each version in turn order.
        chunks.sort(
            key=lambda c: (
                c.metadata.chunk_version != item.active_version,
                c.metadata.turn_range.start,
                c.metadata.part_index,
            )
        )
        return Planned(item, chunks[:cap], more=len(chunks) > cap)

    def _write(self, plans: list[Planned]) -> UpsertResult | Exception:
        """Embed and write (the projector checks each chunk against the layout under the
        conversation's writer lock, so a delete or build that lands meanwhile wins, and
        settles each conversation it wrote)."""
        records = [r for p in plans for r in p.chunks]
        try:
            result = self.projector.store_records(records, [], lacking=True)  # the plans
            for p in plans:
                if not p.chunks:  # nothing to write: settle what the plan may have done
                    with self.locks.hold(p.item.conversation_id):
                        self.projector.settle(p.item.conversation_id)
            return result
        except Exception as exc:
            return exc

    def _complete(self, plans: list[Planned], outcome: UpsertResult | Exception) -> None:
        if isinstance(outcome, Exception):
            for p in plans:
                self._fail(p.item, outcome)
            return
        refused = {e.chunk_id: e for e in outcome.errors}
        for p in plans:
            conv = p.item.conversation_id
            errors = [refused[c.chunk_id] for c in p.chunks if c.chunk_id in refused]
            busy = [e for e in errors if e.reason == REASON_BUSY]
            if busy:
                self._fail(p.item, ConversationBusy(busy[0].message))
                continue
            broken = [e for e in errors if e.reason not in STALE_REASONS]
            if broken:
                self._fail(p.item, RuntimeError("; ".join(e.message for e in broken[:3])))
                continue
            # Work left although this step found nothing to do (another writer raced it):
            # come back after the back-off rather than spin.
            progressed = bool(p.chunks) or p.item.needs_reconcile
            state = self.queue.complete(
                p.item, retry_in_s=0.0 if progressed else self.settings.backoff_s
            )
            if state is None:
                log.warning("index_lease_lost", conversation_id=conv)
                continue
            log.info(
                "conversation_indexed",
                conversation_id=conv,
                chunks=len(p.chunks),
                more=p.more,
                stale=len(errors),
                state=state,
            )

    def _fail(self, item: QueueItem, exc: BaseException) -> None:
        self.health.observe(exc)
        if (
            isinstance(exc, StoreUnavailable | DiskFull | EmbedderUnavailable | ConversationBusy)
            or self._stop.is_set()
            or not self.store.up
        ):
            # An outage (store, embedding server), a full disk or a shutdown, not this
            # conversation's fault: hand the lease back without counting an attempt; it is
            # taken again once the outage ends.
            log.warning(
                "index_deferred", conversation_id=item.conversation_id, error=str(exc)[:300]
            )
            self.queue.release(item)
            return
        message = f"{type(exc).__name__}: {exc}"
        log.warning(
            "index_failed",
            conversation_id=item.conversation_id,
            attempt=item.attempts + 1,
            error=message[:300],
        )
        self.queue.fail(item, message, self.settings.max_attempts, self.settings.backoff_s)

    @contextmanager
    def _renewing(self, items: Sequence[QueueItem]) -> Iterator[None]:
        """Renew the leases every third of their time while a step runs."""
        done = threading.Event()
        every = max(0.5, self.settings.lease_s / 3)

        def beat() -> None:
            while not done.wait(every):
                try:
                    self.queue.renew(items, self.settings.lease_s)
                except Exception as exc:
                    log.warning("index_lease_renew_failed", error=str(exc)[:300])

        thread = threading.Thread(target=beat, name="index-lease-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=5)
