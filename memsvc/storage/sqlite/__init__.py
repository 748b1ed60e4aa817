"""The embedded backend: the event log, index queue and embedding cache in SQLite files
under the data dir (one process per data dir). `database` (connections and dialect),
`schema` (tables and migrations), `locks` (in-process writer locks), `notify` (in-process
wake-ups)."""

from __future__ import annotations

from pathlib import Path

from memsvc.storage.sql.cache import SqlEmbeddingCache
from memsvc.storage.sql.eventlog import SqlEventLog
from memsvc.storage.sql.queue import SqlIndexQueue
from memsvc.storage.sqlite.database import SqliteDatabase
from memsvc.storage.sqlite.locks import DEFAULT_WAIT_S, ConversationLocks
from memsvc.storage.sqlite.schema import CACHE_MIGRATIONS, LOG_MIGRATIONS, migrate

LOG_FILE = "events.sqlite"
CACHE_FILE = "embed_cache.sqlite"


def open_log(
    data_dir: Path, writer_wait_s: float = DEFAULT_WAIT_S
) -> tuple[SqlEventLog, SqlIndexQueue, ConversationLocks]:
    database = SqliteDatabase(data_dir / LOG_FILE, synchronous="FULL")
    with database.transaction() as sql:
        migrate(sql, LOG_MIGRATIONS, f"event log {database.path}")
    return SqlEventLog(database), SqlIndexQueue(database), ConversationLocks(writer_wait_s)


def open_cache(data_dir: Path) -> SqlEmbeddingCache:
    database = SqliteDatabase(data_dir / CACHE_FILE, synchronous="NORMAL")
    with database.transaction() as sql:
        migrate(sql, CACHE_MIGRATIONS, f"embedding cache {database.path}")
    return SqlEmbeddingCache(database)
