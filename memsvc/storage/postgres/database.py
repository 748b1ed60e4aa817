"""PostgreSQL connections for the shared SQL: a pool (psycopg 3), READ COMMITTED write
transactions that lock the rows they update (the shared statements say FOR UPDATE where
SQLite's single writer made that implicit), REPEATABLE READ read-only snapshots, and the
database's clock for every process sharing it.

A lost or refused connection is LogUnavailable (UNAVAILABLE with a retry hint: nothing was
written); a full disk on the server is DiskFull.

A silent partition (packets stop, connections stay open: a dead switch, a firewall that
drops, a stuck proxy) is noticed within a few seconds, not after TCP's quarter of an hour:
- every connection has TCP keepalives and `tcp_user_timeout`, so the kernel gives up on a
  peer that stops acknowledging (LIVENESS_S);
- the health watch pings on a connection of its own with a hard time-out; when the ping
  does not answer in time, the log is down (NOT_SERVING), every statement stuck waiting
  longer than that is cut (its socket shut down), and until a ping answers again a call
  that needs the log fails at once, LogUnavailable (UNAVAILABLE with a retry hint),
  instead of waiting on a database that does not answer to its deadline. A partition that
  only loses the answers (a proxy that ACKs and forwards nothing) is caught by the ping
  alone."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
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
# Seconds within which a database that stopped answering is noticed.
LIVENESS_S = 4.0
# libpq options of every connection: TCP keepalives, and how long sent data may stay
# unacknowledged before the kernel drops the connection.
TCP_OPTIONS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 2,
    "tcp_user_timeout": int(LIVENESS_S * 1000),
}


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
        self._down = threading.Event()
        # connections in use, with when they were taken: the ones a partition left
        # waiting are cut when the ping finds the database gone
        self._busy: dict[int, tuple[Any, float]] = {}
        self._busy_guard = threading.Lock()
        self.connect_timeout = max(1, int(connect_timeout_s))
        try:  # one direct connection first: its error says why (refused, password, ...)
            psycopg.connect(url, connect_timeout=self.connect_timeout, **TCP_OPTIONS).close()
        except psycopg.Error as exc:
            reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            raise DatabaseUnreachable(f"cannot connect to {self.where}: {reason}") from None
        self._pool = psycopg_pool.ConnectionPool(
            url,
            min_size=1,
            max_size=max(2, pool_size),
            kwargs={"autocommit": True, "connect_timeout": self.connect_timeout, **TCP_OPTIONS},
            timeout=connect_timeout_s * 2,
            check=self._check,
            open=False,
            name="memsvc-log",
        )
        self._pool.open(wait=True, timeout=connect_timeout_s * 2)
        # The connection of this thread's open transaction: a snapshot taken inside it
        # reads what it wrote (as SQLite's per-thread connection does).
        self._local = threading.local()
        # threads whose commits do not wait for the WAL's flush (`sync_lazily`)
        self._lazy = threading.local()
        self._ping: threading.Thread | None = None
        self._ping_conn: psycopg.Connection[Any] | None = None

    def _check(self, conn: Any) -> None:
        """The pool's check of a connection it hands out: broken ones (a restart) are
        replaced; while the database is down none is trusted, and a check a partition
        leaves waiting is cut like any statement."""
        if self._down.is_set():
            raise psycopg.OperationalError("the database did not answer the last liveness check")
        with self.watched(conn):
            conn.execute("SELECT 1")

    @property
    def down(self) -> bool:
        """The last liveness ping went unanswered."""
        return self._down.is_set()

    def check_up(self) -> None:
        if self._down.is_set():
            raise LogUnavailable(
                f"the database ({self.where}) did not answer the last liveness check within"
                f" {LIVENESS_S:g} s (a partition?); retry"
            )

    @contextmanager
    def watched(self, conn: Any) -> Iterator[None]:
        """`conn` (a connection of the caller's own) is in use: a partition cuts it."""
        with self._busy_guard:
            self._busy[id(conn)] = (conn, time.monotonic())
        try:
            yield
        finally:
            with self._busy_guard:
                self._busy.pop(id(conn), None)

    @contextmanager
    def _connection(self) -> Iterator[Any]:
        self.check_up()
        try:
            with self._pool.connection() as conn, self.watched(conn):
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
                    if getattr(self._lazy, "on", False):
                        conn.execute("SET LOCAL synchronous_commit TO OFF")
                    self._local.conn = conn
                    try:
                        yield Sql(conn, POSTGRES)
                    finally:
                        self._local.conn = None
            except psycopg.errors.DiskFull as exc:
                raise _unavailable(exc, self.where) from exc

    def sync_lazily(self) -> None:
        """An asynchronous commit: PostgreSQL may lose the last few after a crash of its
        server, never a part of one, and a synchronous commit flushes every one before it."""
        self._lazy.on = True

    def execute_outside(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        """A statement in a connection of its own, outside any transaction (NOTIFY)."""
        with self._connection() as conn:
            conn.execute(sql, params)

    def ping(self) -> bool:
        """`SELECT 1` on a connection of its own, answered within LIVENESS_S. When it is
        not, statements waiting longer than that are cut: they fail LogUnavailable now."""
        if self._ping is not None and self._ping.is_alive():
            answered = False  # the last ping is still waiting: no answer yet
        else:
            result: list[bool] = []
            self._ping = threading.Thread(
                target=self._ping_once, args=(result,), name="log-ping", daemon=True
            )
            self._ping.start()
            self._ping.join(LIVENESS_S)
            answered = result == [True]
        if answered:
            self._down.clear()
        else:
            self._down.set()
            self._cut_waiting(LIVENESS_S)
            if self._ping_conn is not None:
                _shut(self._ping_conn)  # the waiting ping gives up, its connection dropped
        return answered

    def _ping_once(self, result: list[bool]) -> None:
        try:
            if self._ping_conn is None or self._ping_conn.closed:
                self._ping_conn = psycopg.connect(
                    self.url, autocommit=True, connect_timeout=self.connect_timeout, **TCP_OPTIONS
                )
            self._ping_conn.execute("SELECT 1")
            result.append(True)
        except Exception:
            if self._ping_conn is not None:
                self._ping_conn.close()
            self._ping_conn = None
            result.append(False)

    def _cut_waiting(self, older_than_s: float) -> None:
        """Shut down the sockets of connections in use for longer than `older_than_s`: the
        threads waiting on them get an error at once (the connection is then discarded)."""
        now = time.monotonic()
        with self._busy_guard:
            stuck = [c for c, since in self._busy.values() if now - since > older_than_s]
        for conn in stuck:
            _shut(conn)
        if stuck:
            log.warning("log_statements_cut", statements=len(stuck), waited_over_s=older_than_s)

    def erase(self) -> None:
        """PostgreSQL keeps deleted rows in its pages and WAL until its own VACUUM and WAL
        recycling: physical erasure there is the database operator's (README, Erasure)."""
        log.info("erase_left_to_the_database", database=self.where)

    def close(self) -> None:
        if self._ping_conn is not None:
            self._ping_conn.close()
        if not self._pool.closed:
            self._pool.close()


def _shut(conn: Any) -> None:
    """Shut a connection's socket down under whoever is waiting on it (thread-safe: the
    connection's own structures are left to its owner, who then sees it broken)."""
    try:
        dup = socket.socket(fileno=os.dup(conn.pgconn.socket))
    except Exception:
        return
    try:
        dup.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        dup.close()
