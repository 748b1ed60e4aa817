"""Concurrent query embeddings coalesced into one forward pass."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

import numpy as np

from memsvc.domain import deadline
from memsvc.domain.errors import EmbedderUnavailable
from memsvc.ports import Embedder

# Time kept back from the caller's deadline to send it the reason.
REPLY_MARGIN_S = 0.1


class QueryBatcher:
    """Coalesces concurrent query embeddings into one forward pass.

    A single thread owns the model for queries: it takes every request queued at that
    moment (up to `max_batch`) and encodes them together. A lone request waits for nothing;
    under concurrency, requests that arrive while a batch runs form the next batch, so a
    few clients share one forward pass instead of queueing on the model lock.
    """

    def __init__(self, embedder: Embedder, max_batch: int = 32) -> None:
        self.embedder = embedder
        self.max_batch = max_batch
        # (text, its caller's deadline as time.monotonic() or None, the answer)
        self._queue: queue.SimpleQueue[tuple[str, float | None, Future[np.ndarray]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name="query-batcher", daemon=True)
        self._thread.start()

    def encode(self, text: str) -> np.ndarray:
        future: Future[np.ndarray] = Future()
        left = deadline.remaining()
        self._queue.put((text, None if left is None else time.monotonic() + left, future))
        if left is None:
            return future.result()
        try:
            return future.result(timeout=max(0.0, left - REPLY_MARGIN_S))
        except TimeoutError:
            # The batch goes on (bounded by the embedder's own time-out); this caller
            # hears why before its deadline instead of DEADLINE_EXCEEDED.
            raise EmbedderUnavailable(
                "the query embedding did not finish within the call's deadline"
            ) from None

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # finish this batch, then stop
                    break
                batch.append(item)
            # A remote embedder gives up when the last caller of the batch has left.
            ends = [end for _, end, _ in batch]
            latest = None if None in ends else max(e for e in ends if e is not None)
            token = deadline.set_remaining(None if latest is None else latest - time.monotonic())
            try:
                vectors = self.embedder.encode_queries([text for text, _, _ in batch])
            except Exception as exc:
                for _, _, future in batch:
                    future.set_exception(exc)
                continue
            finally:
                deadline.reset(token)
            for (_, _, future), vector in zip(batch, vectors, strict=True):
                future.set_result(vector)
