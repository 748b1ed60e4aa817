"""SQLite connections for the shared SQL: one connection per thread, WAL, and
`BEGIN IMMEDIATE` transactions (one writer at a time: what the shared statements rely on
where PostgreSQL takes row locks)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from memsvc.storage.sql.connection import Dialect, Sql

SQLITE = Dialect(
    name="sqlite",
    # Unix time (julianday works on every SQLite version; unixepoch() needs 3.38).
    now="((julianday('now') - 2440587.5) * 86400.0)",
)


class SqliteDatabase:
    """A SQLite file. `synchronous`: FULL fsyncs every commit (the event log: no
    acknowledged turn is lost); NORMAL does not (the embedding cache: a lost entry only
    costs a model call)."""

    dialect = SQLITE

    def __init__(self, path: Path, synchronous: Literal["FULL", "NORMAL"] = "FULL") -> None:
        self.path = path
        self.synchronous = synchronous
        path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute("PRAGMA foreign_keys=OFF")
            self._local.conn = conn
        return conn

    @contextmanager
    def snapshot(self) -> Iterator[Sql]:
        """A read transaction: every query inside sees the same committed state. Inside a
        transaction of the same thread it reads that transaction's state."""
        conn = self._conn()
        if conn.in_transaction:
            yield Sql(conn, SQLITE)
            return
        conn.execute("BEGIN")
        try:
            yield Sql(conn, SQLITE)
        finally:
            conn.execute("COMMIT")

    @contextmanager
    def transaction(self) -> Iterator[Sql]:
        """BEGIN IMMEDIATE ... COMMIT: one writer at a time, all-or-nothing."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield Sql(conn, SQLITE)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        """Closes this thread's connection (other threads' close with their thread)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
