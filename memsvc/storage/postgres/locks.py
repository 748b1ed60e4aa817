"""One writer per conversation across every process sharing the database
(memsvc.ports.WriterLocks): a session advisory lock, held on a connection of its own for as
long as the writer holds it (through store writes and model runs: longer than any one
transaction, which is why a row lock would not do). PostgreSQL frees it when the holder's
connection dies, so a crashed replica's conversations are free at once; a holder whose
connection died must stop writing: `ensure` is checked just before each store write.

Within a process, a plain lock first queues the threads (an advisory lock is re-entrant per
session, not per thread)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from memsvc.domain.errors import LogUnavailable
from memsvc.storage.sqlite.locks import ConversationLocks


def lock_key(name: str) -> int:
    """A conversation's advisory lock key: 64 bits of its id's SHA-256."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big", signed=True)


class _Sessions:
    """Connections for lock holders: idle ones kept for reuse, new ones opened directly.
    Not a pool with reconnect back-off: when the database returns, the next writer connects
    at once (a pool still backing off made writers wait out its time-out after a restart)."""

    def __init__(self, url: str, max_idle: int, connect_timeout_s: float) -> None:
        self.url = url
        self.max_idle = max_idle
        self.connect_timeout = max(1, int(connect_timeout_s))
        self._idle: list[psycopg.Connection[Any]] = []
        self._mutex = threading.Lock()

    def lock(self, key: int) -> psycopg.Connection[Any]:
        """A session holding the advisory lock `key`. Idle sessions a restart killed are
        dropped on the way; a new one that cannot connect is LogUnavailable."""
        while True:
            with self._mutex:
                conn = self._idle.pop() if self._idle else None
            fresh = conn is None
            try:
                if conn is None:
                    conn = psycopg.connect(
                        self.url, autocommit=True, connect_timeout=self.connect_timeout
                    )
                conn.execute("SELECT pg_advisory_lock(%s)", (key,))
                return conn
            except psycopg.Error as exc:
                if conn is not None:
                    conn.close()
                if fresh:
                    raise LogUnavailable(f"cannot take the writer lock: {str(exc)[:200]}") from exc

    def give_back(self, conn: psycopg.Connection[Any]) -> None:
        if not conn.closed:
            with self._mutex:
                if len(self._idle) < self.max_idle:
                    self._idle.append(conn)
                    return
            conn.close()

    def close(self) -> None:
        with self._mutex:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class AdvisoryLocks:
    def __init__(self, url: str, holders: int, connect_timeout_s: float = 5.0) -> None:
        self._threads = ConversationLocks()
        # `holders` bounds the idle sessions kept; more are opened while more writers hold
        self._sessions = _Sessions(url, max(2, holders), connect_timeout_s)
        self._local = threading.local()

    def _held(self) -> dict[str, tuple[Any, int]]:
        held: dict[str, tuple[Any, int]] | None = getattr(self._local, "held", None)
        if held is None:
            held = self._local.held = {}
        return held

    @contextmanager
    def hold(self, conversation_id: str) -> Iterator[None]:
        with self._threads.hold(conversation_id):
            held = self._held()
            if conversation_id in held:  # re-entered by the thread holding it
                conn, depth = held[conversation_id]
                held[conversation_id] = (conn, depth + 1)
                try:
                    yield
                finally:
                    held[conversation_id] = (conn, depth)
                return
            key = lock_key(conversation_id)
            conn = self._sessions.lock(key)
            held[conversation_id] = (conn, 1)
            try:
                yield
            finally:
                del held[conversation_id]
                try:
                    conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
                except psycopg.Error:
                    conn.close()  # the session is gone, and its lock with it
                self._sessions.give_back(conn)

    def ensure(self, conversation_id: str) -> None:
        entry = self._held().get(conversation_id)
        if entry is None:
            return  # not a holder path (reads); writers always hold
        conn = entry[0]
        try:
            conn.execute("SELECT 1")
        except psycopg.Error as exc:
            raise LogUnavailable(
                "the writer lock's database connection was lost: stopped before writing"
            ) from exc

    def close(self) -> None:
        self._sessions.close()
