"""PostgreSQL connections for the shared SQL: a pool (psycopg 3), READ COMMITTED write
transactions that lock the rows they update (the shared statements say FOR UPDATE where
SQLite's single writer made that implicit), REPEATABLE READ read-only snapshots, and the
database's clock for every process sharing it.

A lost or refused connection is LogUnavailable (UNAVAILABLE with a retry hint: nothing was
written); a full disk on the server is DiskFull."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool
import structlog

from memsvc.domain.errors import DiskFull, LogUnavailable
from memsvc.storage.sql.connection import Dialect, Sql

log = structlog.get_logger(__name__)
# The pool logs each failed reconnection as plain text; outages are reported by memsvc's
# own health (log_down / log_up, memsvc_log_up) instead.
logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)

POSTGRES = Dialect(
    name="postgres",
    now="CAST(extract(epoch from clock_timestamp()) AS DOUBLE PRECISION)",
    for_update=" FOR UPDATE",
    skip_locked=" FOR UPDATE SKIP LOCKED",
    for_share=" FOR SHARE",
    placeholder="%s",
)
_DISK_FULL = "53100"


def redact(url: str) -> str:
    """The URL without its password (for messages and logs)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparsable database URL>"
    host, port, db = info.get("host", ""), info.get("port", ""), info.get("dbname", "")
    return f"postgresql://{info.get('user', '')}@{host}{':' + str(port) if port else ''}/{db}"


def _unavailable(exc: BaseException, where: str) -> Exception:
    if getattr(exc, "sqlstate", None) == _DISK_FULL:
        return DiskFull(f"the database's disk is full ({where})")
    return LogUnavailable(f"the database is unreachable ({where}): {str(exc)[:200]}")


class DatabaseUnreachable(RuntimeError):
    """At start: the database refused or did not answer (the message says why)."""


class PostgresDatabase:
    dialect = POSTGRES

    def __init__(self, url: str, pool_size: int, connect_timeout_s: float = 5.0) -> None:
        self.url = url
        self.where = redact(url)
        try:  # one direct connection first: its error says why (refused, password, ...)
            psycopg.connect(url, connect_timeout=max(1, int(connect_timeout_s))).close()
        except psycopg.Error as exc:
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise DatabaseUnreachable(f"cannot connect to {self.where}: {reason}") from None
        self._pool = psycopg_pool.ConnectionPool(
            url,
            min_size=1,
            max_size=max(2, pool_size),
            kwargs={"autocommit": True, "connect_timeout": max(1, int(connect_timeout_s))},
            timeout=connect_timeout_s * 2,
            check=psycopg_pool.ConnectionPool.check_connection,
            open=False,
            name="memsvc-log",
        )
        self._pool.open(wait=True, timeout=connect_timeout_s * 2)
        # The connection of this thread's open transaction: a snapshot taken inside it
        # reads what it wrote (as SQLite's per-thread connection does).
        self._local = threading.local()

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.OperationalError, psycopg_pool.PoolTimeout) as exc:
            raise _unavailable(exc, self.where) from exc

    @contextmanager
    def snapshot(self) -> Iterator[Sql]:
        current = getattr(self._local, "conn", None)
        if current is not None:
            yield Sql(current, POSTGRES)
            return
        with self._connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            self._local.conn = conn
            try:
                yield Sql(conn, POSTGRES)
            finally:
                self._local.conn = None

    @contextmanager
    def transaction(self) -> Iterator[Sql]:
        with self._connection() as conn:
            try:
                with conn.transaction():
                    self._local.conn = conn
                    try:
                        yield Sql(conn, POSTGRES)
                    finally:
                        self._local.conn = None
            except psycopg.errors.DiskFull as exc:
                raise _unavailable(exc, self.where) from exc

    def execute_outside(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        """A statement in a connection of its own, outside any transaction (NOTIFY)."""
        with self._connection() as conn:
            conn.execute(sql, params)

    def ping(self) -> bool:
        try:
            with self._pool.connection(timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except Exception:
            return False

    def erase(self) -> None:
        """PostgreSQL keeps deleted rows in its pages and WAL until its own VACUUM and WAL
        recycling: physical erasure there is the database operator's (README, Erasure)."""
        log.info("erase_left_to_the_database", database=self.where)

    def close(self) -> None:
        if not self._pool.closed:
            self._pool.close()
