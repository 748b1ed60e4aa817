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
import psycopg_pool

from memsvc.domain.errors import LogUnavailable
from memsvc.storage.sqlite.locks import ConversationLocks


def lock_key(name: str) -> int:
    """A conversation's advisory lock key: 64 bits of its id's SHA-256."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big", signed=True)


class AdvisoryLocks:
    def __init__(self, url: str, holders: int, connect_timeout_s: float = 5.0) -> None:
        self._threads = ConversationLocks()
        self._pool = psycopg_pool.ConnectionPool(
            url,
            min_size=0,
            max_size=max(2, holders),
            kwargs={"autocommit": True, "connect_timeout": max(1, int(connect_timeout_s))},
            timeout=connect_timeout_s * 6,
            # a connection left dead by a database restart is replaced before it is used
            check=psycopg_pool.ConnectionPool.check_connection,
            name="memsvc-locks",
            open=True,
        )
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
            try:
                conn = self._pool.getconn()
            except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
                raise LogUnavailable(f"cannot take the writer lock: {str(exc)[:200]}") from exc
            try:
                conn.execute("SELECT pg_advisory_lock(%s)", (key,))
            except psycopg.Error as exc:
                # Back to the pool, which discards a broken connection: a slot kept here
                # would be lost for good, and after a few outages every writer would wait
                # out the pool's time-out.
                self._pool.putconn(conn)
                raise LogUnavailable(f"cannot take the writer lock: {str(exc)[:200]}") from exc
            held[conversation_id] = (conn, 1)
            try:
                yield
            finally:
                del held[conversation_id]
                try:
                    conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
                except psycopg.Error:
                    conn.close()  # the session is gone, and its lock with it
                self._pool.putconn(conn)

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
        self._pool.close()
