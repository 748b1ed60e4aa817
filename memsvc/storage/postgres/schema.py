"""PostgreSQL schema of the event log (and the shared embedding cache), with forward
migrations, run at start under an advisory lock (replicas starting together migrate once)
or by `memsvc migrate`. The tables mirror the SQLite log at its schema 2; numbers are
BIGINT, times DOUBLE PRECISION (the database's clock), vectors BYTEA."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memsvc.storage.sql.connection import Sql
from memsvc.storage.sqlite.schema import (
    IDEMPOTENCY,
    LAYOUT_STANDING,
    TRACE_LINKS,
    SchemaTooNew,
    layout_spans,
    term_docs,
)

Migration = Callable[[Sql], None]

# An advisory lock key of memsvc's own (a conversation's key is a hash of its id).
MIGRATION_LOCK = 0x6D656D73_76630001

_V1 = """
CREATE TABLE events (
    conversation_id TEXT NOT NULL,
    turn_id BIGINT NOT NULL,
    speaker TEXT NOT NULL,
    speaker_name TEXT NOT NULL,
    text TEXT NOT NULL,
    clean_text TEXT NOT NULL,
    timestamp TEXT NOT NULL,
    participants TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    purged INTEGER NOT NULL DEFAULT 0,
    seq BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (conversation_id, turn_id)
);
CREATE INDEX events_seq ON events (conversation_id, seq);
CREATE TABLE layout (
    chunk_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    chunk_version BIGINT NOT NULL,
    start_turn BIGINT NOT NULL,
    end_turn BIGINT NOT NULL,
    source_hash TEXT NOT NULL,
    text_hash TEXT NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    indexed INTEGER NOT NULL DEFAULT 0,
    content_hash TEXT NOT NULL DEFAULT ''
);
CREATE INDEX layout_conv ON layout (conversation_id, chunk_version);
CREATE TABLE chunk_texts (
    conversation_id TEXT NOT NULL,
    text_hash TEXT NOT NULL,
    start_turn BIGINT NOT NULL,
    end_turn BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, text_hash)
);
CREATE TABLE superseded (
    chunk_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    pending INTEGER NOT NULL
);
CREATE INDEX superseded_conv ON superseded (conversation_id, pending);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE conversations (
    conversation_id TEXT PRIMARY KEY,
    active_version BIGINT NOT NULL,
    building_version BIGINT NOT NULL DEFAULT 0,
    work_seq BIGINT NOT NULL DEFAULT 0,
    done_seq BIGINT NOT NULL DEFAULT 0,
    reconcile_seq BIGINT NOT NULL DEFAULT 0,
    reconciled_seq BIGINT NOT NULL DEFAULT 0,
    active_planned_seq BIGINT NOT NULL DEFAULT 0,
    building_planned_seq BIGINT NOT NULL DEFAULT 0,
    progress_seq BIGINT NOT NULL DEFAULT 0,
    last_indexed_turn BIGINT NOT NULL DEFAULT -1,
    dirty BIGINT NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT 'idle',
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    last_error TEXT NOT NULL DEFAULT '',
    pending_since DOUBLE PRECISION NOT NULL DEFAULT 0,
    lease_owner TEXT NOT NULL DEFAULT '',
    lease_token BIGINT NOT NULL DEFAULT 0,
    lease_until DOUBLE PRECISION NOT NULL DEFAULT 0,
    leased_seq BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX conversations_queue ON conversations (state, next_attempt_at);
CREATE TABLE chunk_history (
    chunk_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    chunk_version BIGINT NOT NULL,
    start_turn BIGINT NOT NULL,
    end_turn BIGINT NOT NULL
);
CREATE INDEX chunk_history_conv ON chunk_history (conversation_id);
CREATE TABLE erasures (text_hash TEXT PRIMARY KEY);
CREATE TABLE vectors (
    model TEXT NOT NULL,
    text_hash TEXT NOT NULL,
    vector BYTEA NOT NULL,
    PRIMARY KEY (model, text_hash)
)
"""


def _v1(sql: Sql) -> None:
    for statement in _V1.split(";"):
        if statement.strip():
            sql.run(statement)


def _v2(sql: Sql) -> None:
    """Events keep an opaque payload beside their text (MemoryEvent.payload)."""
    sql.run("ALTER TABLE events ADD COLUMN payload TEXT NOT NULL DEFAULT ''")


def _v3(sql: Sql) -> None:
    """Layout rows mark standing instructions (LayoutRow.standing)."""
    for statement in LAYOUT_STANDING:
        sql.run(statement)


def _v4(sql: Sql) -> None:
    """Keyed writes keep their first answer (AppendEventsRequest.idempotency_key)."""
    for statement in IDEMPOTENCY:
        sql.run(statement)


def _v5(sql: Sql) -> None:
    """Queued work remembers the traces that queued it (spans of index steps link them)."""
    for statement in TRACE_LINKS:
        sql.run(statement)


MIGRATIONS: tuple[Migration, ...] = (_v1, _v2, _v3, _v4, _v5, term_docs, layout_spans)


def migrate(sql: Sql, migrations: Sequence[Migration] = MIGRATIONS) -> tuple[int, int]:
    """Brings the database (in the caller's transaction, holding the migration lock) to
    the newest version; returns (version found, version now)."""
    sql.run("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK,))
    sql.run(
        "CREATE TABLE IF NOT EXISTS schema_version (id INTEGER PRIMARY KEY CHECK (id = 1),"
        " version INTEGER NOT NULL)"
    )
    row = sql.one("SELECT version FROM schema_version WHERE id = 1")
    current = int(row[0]) if row else 0
    if current > len(migrations):
        raise SchemaTooNew(
            f"the database is at memsvc schema version {current}, newer than this memsvc"
            f" knows ({len(migrations)}): run the memsvc version that wrote it"
        )
    for version in range(current + 1, len(migrations) + 1):
        migrations[version - 1](sql)
    if current < len(migrations):
        sql.run(
            "INSERT INTO schema_version (id, version) VALUES (1, ?)"
            " ON CONFLICT (id) DO UPDATE SET version = excluded.version",
            (len(migrations),),
        )
    return current, len(migrations)
