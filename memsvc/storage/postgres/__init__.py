"""The shared backend (MEMSVC_DATABASE_URL): the event log, index queue and embedding cache
in one PostgreSQL database any number of memsvc processes share. `database` (the
connection pool and dialect), `schema` (tables and migrations), `queue` (the index queue
across replicas), `locks` (advisory writer locks with leases), `notify` (LISTEN/NOTIFY
wake-ups)."""

from __future__ import annotations

from dataclasses import dataclass

from memsvc.storage.postgres.database import DatabaseUnreachable, PostgresDatabase, redact
from memsvc.storage.postgres.locks import DEFAULT_LEASE_S, AdvisoryLocks
from memsvc.storage.postgres.notify import PgNotifier
from memsvc.storage.postgres.queue import SharedIndexQueue
from memsvc.storage.postgres.schema import migrate
from memsvc.storage.sql.cache import SqlEmbeddingCache
from memsvc.storage.sql.eventlog import SqlEventLog
from memsvc.storage.sqlite.locks import DEFAULT_WAIT_S


@dataclass
class PostgresBackend:
    database: PostgresDatabase
    log: SqlEventLog
    queue: SharedIndexQueue
    locks: AdvisoryLocks
    notifier: PgNotifier
    cache: SqlEmbeddingCache

    def close(self) -> None:
        self.notifier.close()
        self.locks.close()
        self.database.close()


def open_backend(
    url: str,
    pool_size: int,
    lock_holders: int,
    listen: bool = True,
    writer_lease_s: float = DEFAULT_LEASE_S,
    writer_wait_s: float = DEFAULT_WAIT_S,
) -> PostgresBackend:
    """Connect, migrate the schema to this version (once, whoever starts first), and build
    the backend's parts. Errors name the database without its password."""
    database = PostgresDatabase(url, pool_size)
    with database.transaction() as sql:
        migrate(sql)
    return PostgresBackend(
        database,
        SqlEventLog(database),
        SharedIndexQueue(database),
        AdvisoryLocks(
            url, lock_holders, lease_s=writer_lease_s, wait_s=writer_wait_s, liveness=database
        ),
        PgNotifier(database, listen),
        SqlEmbeddingCache(database),
    )


__all__ = ["DatabaseUnreachable", "PostgresBackend", "open_backend", "redact"]
