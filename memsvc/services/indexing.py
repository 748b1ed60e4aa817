"""The index worker: turns appended events into stored chunks in the background.

Work is per conversation, in the index queue. Each step of a worker thread reads top-down:

  lease     a few pending conversations (the lease expires, so work held by a dead
            thread comes back)
  plan      re-plan each one's layout from the log; its pending chunks, in bounded steps
  embed     one model batch across the conversations (outside any lock)
  write     each conversation's chunks under its writer lock, re-checked against the layout
  complete  (or fail, counted and retried with exponential back-off; after `max_attempts`
            the conversation is `failed` with the last error visible, until new events or
            a Reindex re-queue it)

Everything is in the log, so a restart resumes where the last process stopped: a chunk
planned but never stored is planned again (layout rows carry an `indexed` flag).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from memsvc.domain.errors import StoreUnavailable
from memsvc.domain.records import QueueItem
from memsvc.domain.types import STALE_REASONS, ChunkRecord, UpsertResult
from memsvc.ports import ChunkStore, IndexQueue, Notifier
from memsvc.services.ingest import IngestService
from memsvc.services.projection import Projector

log = structlog.get_logger(__name__)


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
class Planned:
    """One leased conversation's plan: the chunks this step stores, and the last turn it
    covers once they are stored."""

    item: QueueItem
    chunks: list[ChunkRecord]
    last_turn: int
    more: bool  # a bounded step: the rest waits for the next one


class IndexWorker:
    def __init__(
        self,
        ingest: IngestService,
        projector: Projector,
        queue: IndexQueue,
        store: ChunkStore,
        notifier: Notifier,
        settings: WorkerSettings,
    ) -> None:
        self.ingest = ingest
        self.projector = projector
        self.queue = queue
        self.store = store
        self.notifier = notifier
        self.settings = settings
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._threads: list[threading.Thread] = []
        # Held by a worker from lease to the end of processing: pausing waits on it, so
        # once `pause` returns no batch is in flight.
        self._cycle = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, paused: bool) -> None:
        if paused:
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
        self.notifier.notify()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in self._threads):
            released = self.queue.release_stale_leases()
            log.warning("index_batch_abandoned", conversations=released)

    def hold_off(self, paused: bool) -> None:
        """Pause (returns once the batch in flight, if any, is finished) or resume."""
        if paused:
            self._paused.set()
            with self._cycle:
                pass
        else:
            self._paused.clear()
        self.notifier.notify()

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def quiet(self) -> threading.Lock:
        """Held, no batch is in flight (and none starts)."""
        return self._cycle

    def notify(self) -> None:
        self.notifier.notify()

    # -- the loop -------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            with self._cycle:
                items: list[QueueItem] = []
                # A store outage is nobody's fault: wait for it instead of failing attempts.
                if not self._paused.is_set() and self.store.up:
                    try:
                        items = self.queue.lease(
                            time.time(), self.settings.lease_s, self.settings.batch_conversations
                        )
                    except Exception:
                        log.exception("index_lease_failed")
                if items:
                    self.process(items)
                    continue
            self.notifier.wait(self.settings.idle_poll_s)

    def process(self, items: Sequence[QueueItem]) -> None:
        """One step over leased conversations: plan each, then embed and write all their
        pending chunks at once, then complete (or fail) each."""
        plans = [p for p in (self._plan(item) for item in items) if p is not None]
        # Conversations being reindexed keep their old version searchable until done.
        for register in (True, False):
            group = [p for p in plans if (not p.item.reindex) == register]
            if group:
                self._complete(group, self._write(group, register), register)
        self.notifier.notify()

    def _plan(self, item: QueueItem) -> Planned | None:
        cap = self.settings.max_chunks_per_cycle
        try:
            result = self.ingest.build_for_index(item.conversation_id, item.chunk_version)
        except Exception as exc:
            self._fail(item, exc)
            return None
        last = result.turn_range.end if result.turn_range is not None else -1
        chunks = sorted(
            result.chunks, key=lambda c: (c.metadata.turn_range.start, c.metadata.part_index)
        )
        if len(chunks) <= cap:
            return Planned(item, chunks, last, more=False)
        # This step stores the first `cap` chunks; the rest wait for the next cycle.
        return Planned(item, chunks[:cap], chunks[cap].metadata.turn_range.start - 1, more=True)

    def _write(self, group: list[Planned], register: bool) -> UpsertResult | Exception:
        """Embed and write (the projector checks each chunk against the layout under the
        conversation's writer lock, so a delete or build that lands meanwhile wins)."""
        records = [r for p in group for r in p.chunks]
        try:
            return self.projector.store_records(records, [], register_versions=register)
        except Exception as exc:
            return exc

    def _complete(
        self, group: list[Planned], outcome: UpsertResult | Exception, register: bool
    ) -> None:
        if isinstance(outcome, Exception):
            for p in group:
                self._fail(p.item, outcome)
            return
        refused = {e.chunk_id: e for e in outcome.errors}
        for p in group:
            conv = p.item.conversation_id
            errors = [refused[c.chunk_id] for c in p.chunks if c.chunk_id in refused]
            broken = [e for e in errors if e.reason not in STALE_REASONS]
            if broken:
                self._fail(p.item, RuntimeError("; ".join(e.message for e in broken[:3])))
                continue
            # Go round again if the layout moved on while we embedded (a delete or a build
            # won the race) or if this was one step of a large conversation.
            again = bool(errors) or p.more
            if not again and not register:
                self.projector.version_complete(conv, p.item.chunk_version)
            self.queue.complete(conv, p.last_turn, again)
            log.info(
                "conversation_indexed",
                conversation_id=conv,
                chunks=len(p.chunks),
                last_turn=p.last_turn,
                stale=len(errors),
            )

    def _fail(self, item: QueueItem, exc: BaseException) -> None:
        if isinstance(exc, StoreUnavailable) or self._stop.is_set() or not self.store.up:
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
