"""Waiting for the index worker in tests: until a conversation has no work left at all
(WaitForIndexed answers as soon as a turn is findable, which during a rebuild is at once),
and holding it so a test can take a worker's steps by hand."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from memsvc.app import Services
from memsvc.domain.records import QueueItem


def until_idle(services: Services, conversation_id: str, timeout_s: float = 60) -> QueueItem:
    deadline = time.monotonic() + timeout_s
    while True:
        status = services.queue.status([conversation_id])
        if status and status[0].state in ("idle", "failed"):
            return status[0]
        assert time.monotonic() < deadline, status
        services.worker.notify()
        time.sleep(0.05)


@contextmanager
def worker_held(services: Services) -> Iterator[None]:
    """The background workers take no step while this is held (they lease inside the
    gate's steps), so the test leases and processes by hand, as a worker would. A pause
    cannot serve: a paused queue leases nothing, to anyone."""
    with services.worker.gate.closed():
        yield
    services.worker.notify()
