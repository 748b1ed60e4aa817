"""SQLite connections for the shared SQL: one connection per thread, WAL, and
`BEGIN IMMEDIATE` transactions (one writer at a time: what the shared statements rely on
where PostgreSQL takes row locks).

Erasure: `secure_delete` makes SQLite overwrite deleted content with zeros; `erase()`
(after a purge, and at a clean stop) checkpoints the WAL into the file, truncates it, and
rewrites the file (VACUUM), so no page or WAL frame keeps purged text."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Literal

from memsvc.domain.errors import DiskFull
from memsvc.storage.sql.connection import Dialect, Sql

SQLITE = Dialect(
    name="sqlite",
    # Unix time (julianday works on every SQLite version; unixepoch() needs 3.38).
    now="((julianday('now') - 2440587.5) * 86400.0)",
)
_SQLITE_FULL = 13


def _disk_full(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) == _SQLITE_FULL or "disk is full" in str(exc)


class SqliteDatabase:
    """A SQLite file. `synchronous`: FULL fsyncs every commit (the event log: no
    acknowledged turn is lost); NORMAL does not (the embedding cache: a lost entry only
    costs a model call)."""

    dialect = SQLITE

    def __init__(self, path: Path, synchronous: Literal["FULL", "NORMAL"] = "FULL") -> None:
        self.path = path
        self.synchronous = synchronous
        path.parent.mkdir(parents=True, exist_ok=True)
        # Private from the start (SQLite gives its -wal and -shm files the same mode).
        path.touch(mode=0o600, exist_ok=True)
        self._local = threading.local()
        # threads whose commits do not wait for the disk (`sync_lazily`); kept past close()
        self._lazy = threading.local()
        self._guard = threading.Lock()
        self._all: list[sqlite3.Connection] = []

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            # check_same_thread off: each thread uses its own, but close() closes them all.
            conn = sqlite3.connect(
                self.path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA journal_mode=WAL")
            lazy = getattr(self._lazy, "on", False)
            conn.execute(f"PRAGMA synchronous={'NORMAL' if lazy else self.synchronous}")
            conn.execute("PRAGMA foreign_keys=OFF")
            conn.execute("PRAGMA secure_delete=ON")
            self._local.conn = conn
            with self._guard:
                self._all.append(conn)
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
        """BEGIN IMMEDIATE ... COMMIT: one writer at a time, all-or-nothing. A full disk is
        DiskFull (nothing written)."""
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield Sql(conn, SQLITE)
            except BaseException:
                if conn.in_transaction:  # a full disk has rolled it back already
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            if _disk_full(exc):
                raise DiskFull(f"{self.path.name}: the disk is full ({exc})") from exc
            raise

    def ping(self) -> bool:
        return True

    def sync_lazily(self) -> None:
        """In WAL mode NORMAL commits without an fsync, and stays consistent: a commit that
        does fsync (FULL, another thread's) makes every commit before it durable."""
        self._lazy.on = True
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            conn.execute("PRAGMA synchronous=NORMAL")

    def erase(self) -> None:
        """Rewrite the file without free pages, and the WAL without old frames."""
        conn = self._conn()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        """Closes every connection (the WAL is checkpointed by the last one)."""
        with self._guard:
            conns, self._all = self._all, []
        for conn in conns:
            with suppress(sqlite3.Error):
                conn.close()
        self._local = threading.local()
