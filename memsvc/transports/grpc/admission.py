"""Concurrency limits per kind of call, so slow calls cannot take every server thread.

Long waits (WaitForIndexed) and heavy calls (the model over many texts, store writes) each
get a bounded number of server threads; beyond it a call is refused at once with
RESOURCE_EXHAUSTED and a retry hint instead of queueing, so health checks, appends and
searches always find a free thread. Appends get their own limit: a slow log (a held
lock, a full disk retrying) or a flood of large appends cannot take those threads either;
they are refused with UNAVAILABLE (nothing done: gRPC's retry policy resends them)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from memsvc.domain.errors import MemsvcError, ResourceExhausted


class Gate:
    def __init__(
        self,
        kind: str,
        limit: int,
        retry_after_s: float = 1.0,
        refusal: Callable[[str, float], MemsvcError] = ResourceExhausted,
    ) -> None:
        self.kind = kind
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.refusal = refusal
        self._slots = threading.BoundedSemaphore(limit)

    @contextmanager
    def enter(self) -> Iterator[None]:
        if not self._slots.acquire(blocking=False):
            raise self.refusal(
                f"{self.limit} {self.kind} calls already running", self.retry_after_s
            )
        try:
            yield
        finally:
            self._slots.release()
