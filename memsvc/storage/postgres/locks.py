"""One writer per conversation across every process sharing the database
(memsvc.ports.WriterLocks): a session advisory lock, held on a connection of its own for as
long as the writer holds it (through store writes: longer than any one transaction, which
is why a row lock would not do).

No lock outlives a stuck holder. PostgreSQL frees a session's advisory locks when the
session ends, and each lock session ends itself once idle for longer than the lease
(`idle_session_timeout`): a heartbeat thread touches every held session a few times per
lease, so a holder that runs keeps its lock, and a holder that stops (SIGSTOP, a stuck VM,
a debugger, a GC pause longer than the lease) loses it within a lease, heartbeat and all.
A crashed replica's connection dies at once. A holder whose session ended must stop
writing: `ensure` is checked just before each store write, and the search path verifies
every hit against the log, so a write that slipped past it is never returned and the next
reconcile repairs it.

No waiter waits past its bound: taking a lock polls `pg_try_advisory_lock` until the
call's deadline or MEMSVC_WRITER_WAIT_S, then raises ConversationBusy; it never sits in
`pg_advisory_lock` behind a holder that will not come back.

Within a process, a plain lock first queues the threads (an advisory lock is re-entrant per
session, not per thread)."""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from memsvc.domain import deadline
from memsvc.domain.errors import LogUnavailable
from memsvc.storage.postgres.database import TCP_OPTIONS, PostgresDatabase
from memsvc.storage.sqlite.locks import DEFAULT_WAIT_S, ConversationLocks, busy

DEFAULT_LEASE_S = 10.0
# Polling a held lock: first soon, then less often.
_POLL_FIRST_S, _POLL_MAX_S = 0.01, 0.2


def lock_key(name: str) -> int:
    """A conversation's advisory lock key: 64 bits of its id's SHA-256."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big", signed=True)


class _Sessions:
    """Connections for lock holders: idle ones kept for reuse, new ones opened directly.
    Not a pool with reconnect back-off: when the database returns, the next writer connects
    at once (a pool still backing off made writers wait out its time-out after a restart).
    Every session ends itself when idle for longer than the lease."""

    def __init__(
        self,
        url: str,
        max_idle: int,
        connect_timeout_s: float,
        lease_s: float,
        liveness: PostgresDatabase | None,
    ) -> None:
        self.url = url
        self.liveness = liveness
        self.max_idle = max_idle
        self.connect_timeout = max(1, int(connect_timeout_s))
        self.lease_ms = max(1000, int(lease_s * 1000))
        self._idle: list[psycopg.Connection[Any]] = []
        self._mutex = threading.Lock()

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=self.connect_timeout,
            options=f"-c idle_session_timeout={self.lease_ms}",
            **TCP_OPTIONS,
        )

    def try_lock(self, key: int) -> psycopg.Connection[Any] | None:
        """A session holding the advisory lock `key`, or None if another session holds it.
        Idle sessions that ended (a restart, their idle time-out) are dropped on the way; a
        new one that cannot connect is LogUnavailable."""
        while True:
            if self.liveness is not None:
                self.liveness.check_up()
            with self._mutex:
                conn = self._idle.pop() if self._idle else None
            fresh = conn is None
            try:
                if conn is None:
                    conn = self._connect()
                with self.watched(conn):
                    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            except psycopg.Error as exc:
                if conn is not None:
                    conn.close()
                if fresh:
                    raise LogUnavailable(f"cannot take the writer lock: {str(exc)[:200]}") from exc
                continue
            if row is not None and row[0]:
                return conn
            self.give_back(conn)
            return None

    @contextmanager
    def watched(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """A statement on `conn`: cut by a partition the database's ping notices."""
        if self.liveness is None:
            yield
            return
        with self.liveness.watched(conn):
            yield

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
    def __init__(
        self,
        url: str,
        holders: int,
        connect_timeout_s: float = 5.0,
        lease_s: float = DEFAULT_LEASE_S,
        wait_s: float = DEFAULT_WAIT_S,
        liveness: PostgresDatabase | None = None,
    ) -> None:
        self.lease_s = lease_s
        self.wait_s = wait_s
        self._threads = ConversationLocks(wait_s)
        # `holders` bounds the idle sessions kept; more are opened while more writers hold
        self._sessions = _Sessions(url, max(2, holders), connect_timeout_s, lease_s, liveness)
        self._local = threading.local()
        # every held session, for the heartbeat: id -> connection
        self._held_all: dict[int, psycopg.Connection[Any]] = {}
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="writer-locks", daemon=True)
        self._heartbeat.start()

    def _held(self) -> dict[str, tuple[Any, int]]:
        held: dict[str, tuple[Any, int]] | None = getattr(self._local, "held", None)
        if held is None:
            held = self._local.held = {}
        return held

    @contextmanager
    def hold(self, conversation_id: str, wait_s: float | None = None) -> Iterator[None]:
        limit = self.wait_s if wait_s is None else wait_s
        started = time.monotonic()
        with self._threads.hold(conversation_id, limit):
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
            conn = self._take(conversation_id, key, limit - (time.monotonic() - started))
            held[conversation_id] = (conn, 1)
            with self._guard:
                self._held_all[id(conn)] = conn
            try:
                yield
            finally:
                del held[conversation_id]
                with self._guard:
                    self._held_all.pop(id(conn), None)
                try:
                    with self._sessions.watched(conn):
                        conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
                except psycopg.Error:
                    conn.close()  # the session is gone, and its lock with it
                self._sessions.give_back(conn)

    def _take(self, conversation_id: str, key: int, limit_s: float) -> psycopg.Connection[Any]:
        wait = deadline.bounded(max(0.0, limit_s))
        until = time.monotonic() + wait
        pause = _POLL_FIRST_S
        while True:
            conn = self._sessions.try_lock(key)
            if conn is not None:
                return conn
            left = until - time.monotonic()
            if left <= 0:
                raise busy(conversation_id, wait)
            time.sleep(min(pause, left))
            pause = min(pause * 2, _POLL_MAX_S)

    def ensure(self, conversation_id: str) -> None:
        entry = self._held().get(conversation_id)
        if entry is None:
            return  # not a holder path (reads); writers always hold
        conn = entry[0]
        try:
            with self._sessions.watched(conn):
                conn.execute("SELECT 1")
        except psycopg.Error as exc:
            raise LogUnavailable(
                "the writer lock's database session ended (lost, or idle past its lease):"
                " stopped before writing"
            ) from exc

    def _beat(self) -> None:
        """Keep every held session busy enough that its idle time-out never fires while
        this process runs."""
        every = max(0.2, self.lease_s / 4)
        while not self._stop.wait(every):
            with self._guard:
                sessions = list(self._held_all.values())
            for conn in sessions:
                with contextlib.suppress(psycopg.Error), self._sessions.watched(conn):
                    conn.execute("SELECT 1")  # lost: its holder finds out at `ensure`

    def close(self) -> None:
        self._stop.set()
        self._sessions.close()
