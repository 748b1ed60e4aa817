"""One writer per conversation, within one process (memsvc.ports.WriterLocks).

Every change to a conversation's layout or stored chunks (build, upsert, delete, purge,
retire, reindex, the index worker's writes) runs while holding that conversation's lock;
different conversations proceed in parallel. Appends do not take it: they only add events,
which the next build reads. A SQLite log has one process writing it (one per data dir), so
in-process locks are the whole story; a log shared by replicas needs the database's own.
A caller never holds two conversations' locks at once, so there is no lock ordering to get
wrong.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ConversationLocks:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        # conversation id -> (lock, number of threads holding or waiting for it)
        self._locks: dict[str, tuple[threading.RLock, int]] = {}

    @contextmanager
    def hold(self, conversation_id: str) -> Iterator[None]:
        """Exclusive access to one conversation; re-entrant within a thread."""
        with self._guard:
            lock, users = self._locks.get(conversation_id, (threading.RLock(), 0))
            self._locks[conversation_id] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[conversation_id]
                if users <= 1:
                    del self._locks[conversation_id]
                else:
                    self._locks[conversation_id] = (lock, users - 1)

    def ensure(self, conversation_id: str) -> None:
        """In one process a held lock cannot be lost."""
