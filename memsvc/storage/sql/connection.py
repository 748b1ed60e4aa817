"""The shared SQL of the event log, index queue and embedding cache runs on any DB-API
connection through `Sql`: statements are written once, with `?` placeholders and portable
syntax (`INSERT ... ON CONFLICT`, `CASE` instead of scalar `MAX`), and a `Dialect` supplies
the few pieces that differ (placeholder style, the database's clock, row locks)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

Row = tuple[Any, ...]
Params = Sequence[Any]


@dataclass(frozen=True)
class Dialect:
    name: str
    # Unix time in seconds, as a SQL expression evaluated by the database.
    now: str
    # Appended to a SELECT whose rows the transaction will update.
    for_update: str = ""
    # Appended to the lease query: rows another writer holds are skipped, not waited for.
    skip_locked: str = ""
    # Appended to a SELECT of a row the transaction relies on staying as read until it
    # commits: a writer of that row waits for it.
    for_share: str = ""
    # The driver's placeholder ("?" is what the shared statements are written with).
    placeholder: str = "?"
    _translated: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def translate(self, sql: str) -> str:
        if self.placeholder == "?":
            return sql
        out = self._translated.get(sql)
        if out is None:
            out = sql.replace("%", "%%").replace("?", self.placeholder)
            self._translated[sql] = out
        return out


class Sql:
    """One connection inside a snapshot or a transaction."""

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self.conn = conn
        self.dialect = dialect

    def rows(self, sql: str, params: Params = ()) -> list[Row]:
        cur = self.conn.cursor()
        cur.execute(self.dialect.translate(sql), tuple(params))
        return [tuple(r) for r in cur.fetchall()]

    def one(self, sql: str, params: Params = ()) -> Row | None:
        rows = self.rows(sql, params)
        return rows[0] if rows else None

    def run(self, sql: str, params: Params = ()) -> int:
        """A statement without results; returns the number of rows it changed."""
        cur = self.conn.cursor()
        cur.execute(self.dialect.translate(sql), tuple(params))
        return int(cur.rowcount)

    def many(self, sql: str, seq: Iterable[Params]) -> None:
        rows = [tuple(p) for p in seq]
        if rows:
            self.conn.cursor().executemany(self.dialect.translate(sql), rows)

    @contextmanager
    def savepoint(self, name: str) -> Iterator[None]:
        self.run(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            try:
                self.run(f"ROLLBACK TO SAVEPOINT {name}")
                self.run(f"RELEASE SAVEPOINT {name}")
            except Exception:
                # The transaction itself is gone (SQLite rolls it back on a full disk): the
                # error that ended it says why, not "no such savepoint".
                pass
            raise
        self.run(f"RELEASE SAVEPOINT {name}")


def marks(n: int) -> str:
    """`?,?,...` for an IN list of n values."""
    return ",".join("?" * n)


def chunked(values: Sequence[Any], size: int = 500) -> Iterator[Sequence[Any]]:
    """IN lists in parts: SQLite allows a limited number of host parameters per statement."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


class Database(Protocol):
    """Connections of one database: a consistent read view, or a write transaction
    (all-or-nothing; in SQLite one writer at a time)."""

    dialect: Dialect

    def snapshot(self) -> AbstractContextManager[Sql]: ...

    def transaction(self) -> AbstractContextManager[Sql]: ...

    def erase(self) -> None:
        """Rewrite the database's files so no deleted content stays in them."""
        ...

    def ping(self) -> bool: ...

    def sync_lazily(self) -> None:
        """This thread's commits return before they reach the disk (memsvc.ports.EventLog)."""
        ...

    def close(self) -> None: ...
