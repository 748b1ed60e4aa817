"""Where an index step lays out a conversation (memsvc.domain.layout): in this process,
or in render processes beside it.

An index step is Python under one lock (the GIL): rendering (jieba, the context line's key
phrases, the intent rules) and token counting are a third of its CPU, and on a node whose
model runs elsewhere the second core stays mostly idle. Render processes take that third
onto another core while the index workers (`index_workers`, several, so one writes while
another waits for its layout) go on with the store and the log. The same function runs
there on the same inputs, with the serving model's token counter sent over (an embedder
that cannot send its own lays out in this process): the records are the ones this
process would render.

A render process that dies (killed, out of memory) loses no work: the step in flight lays
out in this process, and the next step starts new processes; processes none of which
started (their token counter failed to load) are not started again. A render process ends when the
server does, stopped or killed."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Protocol

import structlog

from memsvc.config import Settings
from memsvc.domain.chunking import ChunkPolicy, StoredTurn, TokenCounter
from memsvc.domain.layout import PlannedWindow, lay_out
from memsvc.domain.prefix import KeywordExtractor
from memsvc.domain.rendering import ChunkRenderer
from memsvc.observability import metrics
from memsvc.observability.logs import configure_logging
from memsvc.ports import Embedder, PortableTokenCounts

log = structlog.get_logger(__name__)

# How often a render process looks whether the server that started it still runs.
PARENT_CHECK_S = 1.0


class Layouts(Protocol):
    policy: ChunkPolicy

    def lay_out(
        self,
        conversation_id: str,
        version: int,
        turns: Sequence[StoredTurn],
        stored: Mapping[str, str],
    ) -> list[PlannedWindow]: ...

    def close(self) -> None: ...


class InProcess:
    def __init__(self, renderer: ChunkRenderer) -> None:
        self.renderer = renderer
        self.policy = renderer.policy

    def lay_out(
        self,
        conversation_id: str,
        version: int,
        turns: Sequence[StoredTurn],
        stored: Mapping[str, str],
    ) -> list[PlannedWindow]:
        return lay_out(self.renderer, conversation_id, version, turns, stored)

    def close(self) -> None:
        pass


def layouts_for(embedder: Embedder, policy: ChunkPolicy, settings: Settings) -> Layouts:
    """Render processes where asked (`index_render_processes`) and the model's token
    counter can go to them, logging as the server does."""
    processes = settings.index_render_processes
    logs = (settings.log_format, settings.log_level)
    renderer = ChunkRenderer(KeywordExtractor(), embedder.count_tokens, policy)
    if processes <= 0:
        return InProcess(renderer)
    reason = "its token counter stays in this process"
    if isinstance(embedder, PortableTokenCounts):
        counts = embedder.token_counts()
        try:
            pickle.dumps(counts)
        except Exception as exc:
            reason = f"its token counter does not pickle: {exc}"[:300]
        else:
            try:
                return RenderProcesses(renderer, counts, processes, logs)
            except OSError as exc:  # e.g. no process could be made
                reason = f"the processes did not start: {exc}"[:300]
    log.warning("render_processes_unavailable", model=embedder.name, reason=reason)
    return InProcess(renderer)


class RenderProcesses:
    """`processes` render processes, started at once (the first step does not wait for
    their imports), each laying out one conversation at a time."""

    def __init__(
        self,
        renderer: ChunkRenderer,
        counts: TokenCounter,
        processes: int,
        logs: tuple[str, str] = ("auto", "INFO"),
    ) -> None:
        self.local = InProcess(renderer)
        self.policy = renderer.policy
        self.processes = processes
        self._counts = counts
        self._logs = logs
        self._lock = threading.Lock()
        self._closed = False
        self._off = False  # processes failed to start: not started again
        self._started: list[Future[bool]] = []  # each process's first task, once it started
        self._pool: ProcessPoolExecutor | None = None
        self._start()

    def _start(self) -> ProcessPoolExecutor | None:
        with self._lock:
            if self._pool is None and not (self._closed or self._off):
                self._pool = ProcessPoolExecutor(
                    self.processes,
                    # not fork: the server's threads (gRPC, the store's) would be copied
                    # mid-call
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_render_process,
                    initargs=(self.policy, self._counts, self._logs, os.getpid()),
                )
                self._started = [self._pool.submit(_ready) for _ in range(self.processes)]
                metrics.RENDER_PROCESSES.set(self.processes)
            return self._pool

    def lay_out(
        self,
        conversation_id: str,
        version: int,
        turns: Sequence[StoredTurn],
        stored: Mapping[str, str],
    ) -> list[PlannedWindow]:
        pool = self._start()
        if pool is not None:
            try:
                future: Future[list[PlannedWindow]] = pool.submit(
                    _lay_out_here, conversation_id, version, list(turns), dict(stored)
                )
                return future.result()
            except BrokenProcessPool:
                self._drop(pool, conversation_id)
            except RuntimeError:  # closed meanwhile (the server stopping)
                pass
        return self.local.lay_out(conversation_id, version, turns, stored)

    def _drop(self, pool: ProcessPoolExecutor, conversation_id: str) -> None:
        """Once per lost pool: the workers whose steps it failed all come here, and one
        of them may already have started the next pool."""
        with self._lock:
            if self._pool is not pool:
                return
            self._pool = None
            self._off = off = not any(
                f.done() and f.exception() is None and f.result() for f in self._started
            )
        pool.shutdown(wait=False, cancel_futures=True)
        metrics.RENDER_PROCESSES.set(0)
        if off:
            log.error("render_processes_off", reason="none of them started")
        else:
            metrics.RENDER_PROCESSES_LOST.inc()
            log.warning("render_process_lost", conversation_id=conversation_id)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
            metrics.RENDER_PROCESSES.set(0)


# -- in a render process ----------------------------------------------------------------
_renderer: ChunkRenderer | None = None


def _start_render_process(
    policy: ChunkPolicy, counts: TokenCounter, logs: tuple[str, str], server_pid: int
) -> None:
    global _renderer
    configure_logging(*logs)  # the libraries' lines (jieba's) as the server writes them
    _renderer = ChunkRenderer(KeywordExtractor(), counts, policy)
    # A server killed outright leaves its render processes waiting on their queue: each
    # ends once the server is gone.
    threading.Thread(target=_end_with, args=(server_pid,), daemon=True).start()


def _end_with(server_pid: int) -> None:
    while os.getppid() == server_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _ready() -> bool:
    return _renderer is not None


def _lay_out_here(
    conversation_id: str, version: int, turns: list[StoredTurn], stored: dict[str, str]
) -> list[PlannedWindow]:
    assert _renderer is not None  # set by the initializer
    return lay_out(_renderer, conversation_id, version, turns, stored)
