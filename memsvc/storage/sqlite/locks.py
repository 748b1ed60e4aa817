"""One writer per conversation, within one process (memsvc.ports.WriterLocks).

Every change to a conversation's layout or stored chunks (build, upsert, delete, purge,
retire, reindex, the index worker's writes) runs while holding that conversation's lock;
different conversations proceed in parallel. Appends do not take it: they only add events,
which the next build reads. A SQLite log has one process writing it (one per data dir), so
in-process locks are the whole story; a log shared by replicas needs the database's own.
A caller that holds several conversations' locks at once (a write of an index step's
conversations together) takes each without waiting (one it cannot take it writes alone
afterwards), so no writer ever waits while holding one: there is no lock order to get wrong.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from memsvc.domain import deadline
from memsvc.domain.errors import ConversationBusy

# How long a writer waits for a conversation another writer holds, by default.
DEFAULT_WAIT_S = 10.0


def busy(conversation_id: str, waited_s: float) -> ConversationBusy:
    return ConversationBusy(
        f"conversation {conversation_id!r} is being written by another call; waited"
        f" {waited_s:.1f} s (MEMSVC_WRITER_WAIT_S, or the call's deadline): nothing was"
        " written, retry"
    )


class ConversationLocks:
    def __init__(self, wait_s: float = DEFAULT_WAIT_S) -> None:
        self.wait_s = wait_s
        self._guard = threading.Lock()
        # conversation id -> (lock, number of threads holding or waiting for it)
        self._locks: dict[str, tuple[threading.RLock, int]] = {}

    @contextmanager
    def hold(self, conversation_id: str, wait_s: float | None = None) -> Iterator[None]:
        """Exclusive access to one conversation; re-entrant within a thread."""
        with self._guard:
            lock, users = self._locks.get(conversation_id, (threading.RLock(), 0))
            self._locks[conversation_id] = (lock, users + 1)
        try:
            wait = deadline.bounded(self.wait_s if wait_s is None else wait_s)
            if not lock.acquire(timeout=wait):
                raise busy(conversation_id, wait)
            try:
                yield
            finally:
                lock.release()
        finally:
            with self._guard:
                lock, users = self._locks[conversation_id]
                if users <= 1:
                    del self._locks[conversation_id]
                else:
                    self._locks[conversation_id] = (lock, users - 1)

    def ensure(self, conversation_id: str) -> None:
        """In one process a held lock cannot be lost."""
