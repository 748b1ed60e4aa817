"""SQLite schemas of the event log and the embedding cache, with forward migrations.

`schema_version` holds the version a database is at; each migration moves it up by one,
in the same transaction as its changes. A database written by a newer memsvc is refused
(its schema may mean things this code does not know). Databases from before the version
table (memsvc <= 040bf11) are recognised by their tables and brought to version 1."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memsvc.storage.sql.connection import Sql
from memsvc.storage.sql.term_docs import count_all_terms

Migration = Callable[[Sql], None]


class SchemaTooNew(RuntimeError):
    pass


_LOG_V1 = """
CREATE TABLE IF NOT EXISTS events (
    conversation_id TEXT NOT NULL,
    turn_id INTEGER NOT NULL,
    speaker TEXT NOT NULL,
    speaker_name TEXT NOT NULL,
    text TEXT NOT NULL,
    clean_text TEXT NOT NULL,
    timestamp TEXT NOT NULL,
    participants TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    purged INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (conversation_id, turn_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS layout (
    chunk_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    chunk_version INTEGER NOT NULL,
    start_turn INTEGER NOT NULL,
    end_turn INTEGER NOT NULL,
    source_hash TEXT NOT NULL,
    text_hash TEXT NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0,
    indexed INTEGER NOT NULL DEFAULT 0,
    content_hash TEXT NOT NULL DEFAULT ''
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS layout_conv ON layout (conversation_id, chunk_version);
CREATE TABLE IF NOT EXISTS chunk_texts (
    conversation_id TEXT NOT NULL,
    text_hash TEXT NOT NULL,
    start_turn INTEGER NOT NULL,
    end_turn INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, text_hash)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS superseded (
    chunk_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    pending INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS superseded_conv ON superseded (conversation_id, pending);
CREATE TABLE IF NOT EXISTS store_versions (
    conversation_id TEXT NOT NULL,
    chunk_version INTEGER NOT NULL,
    complete INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (conversation_id, chunk_version)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS index_queue (
    conversation_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    chunk_version INTEGER NOT NULL,
    dirty INTEGER NOT NULL DEFAULT 0,
    leased_dirty INTEGER NOT NULL DEFAULT 0,
    lease_until REAL NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL DEFAULT 0,
    last_error TEXT NOT NULL DEFAULT '',
    last_indexed_turn INTEGER NOT NULL DEFAULT -1,
    reindex INTEGER NOT NULL DEFAULT 0,
    pending_since REAL NOT NULL DEFAULT 0
) WITHOUT ROWID;
"""

# Columns added to the first releases' tables before the version table existed.
_LEGACY_COLUMNS = (
    ("events", "purged", "INTEGER NOT NULL DEFAULT 0"),
    ("layout", "content_hash", "TEXT NOT NULL DEFAULT ''"),
    ("index_queue", "pending_since", "REAL NOT NULL DEFAULT 0"),
)


def _script(sql: Sql, script: str) -> None:
    for statement in script.split(";"):
        if statement.strip():
            sql.run(statement)


def _log_v1(sql: Sql) -> None:
    for table, column, definition in _LEGACY_COLUMNS:
        if sql.one("SELECT 1 FROM pragma_table_info(?)", (table,)) is None:
            continue  # a new database: the schema below creates it whole
        if sql.one("SELECT 1 FROM pragma_table_info(?) WHERE name = ?", (table, column)) is None:
            sql.run(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
    _script(sql, _LOG_V1)


_LOG_V2 = """
CREATE TABLE conversations (
    conversation_id TEXT PRIMARY KEY,
    active_version INTEGER NOT NULL,
    building_version INTEGER NOT NULL DEFAULT 0,
    work_seq INTEGER NOT NULL DEFAULT 0,
    done_seq INTEGER NOT NULL DEFAULT 0,
    reconcile_seq INTEGER NOT NULL DEFAULT 0,
    reconciled_seq INTEGER NOT NULL DEFAULT 0,
    active_planned_seq INTEGER NOT NULL DEFAULT 0,
    building_planned_seq INTEGER NOT NULL DEFAULT 0,
    progress_seq INTEGER NOT NULL DEFAULT 0,
    last_indexed_turn INTEGER NOT NULL DEFAULT -1,
    dirty INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT 'idle',
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL DEFAULT 0,
    last_error TEXT NOT NULL DEFAULT '',
    pending_since REAL NOT NULL DEFAULT 0,
    lease_owner TEXT NOT NULL DEFAULT '',
    lease_token INTEGER NOT NULL DEFAULT 0,
    lease_until REAL NOT NULL DEFAULT 0,
    leased_seq INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX conversations_queue ON conversations (state, next_attempt_at);
CREATE TABLE chunk_history (
    chunk_id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    chunk_version INTEGER NOT NULL,
    start_turn INTEGER NOT NULL,
    end_turn INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX chunk_history_conv ON chunk_history (conversation_id);
CREATE TABLE erasures (text_hash TEXT PRIMARY KEY) WITHOUT ROWID;
ALTER TABLE events ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
CREATE INDEX events_seq ON events (conversation_id, seq)
"""


def _log_v2(sql: Sql) -> None:
    """Integrity v3: one version per conversation and durable projection work.

    Every conversation gets a row: its active version is the newest version it has
    complete in the store (else the one its queue row indexed, else its newest layout
    version, else 1), a rebuild under way is its building version. Each is queued for one
    reconcile (the store compared with the layout as a whole), which heals what a crash of
    an older version may have left; conversations that were idle stay findable meanwhile."""
    _script(sql, _LOG_V2)
    queue = {
        str(r[0]): r
        for r in sql.rows(
            "SELECT conversation_id, state, chunk_version, reindex, last_indexed_turn"
            " FROM index_queue"
        )
    }
    complete: dict[str, list[int]] = {}
    for conv, version in sql.rows(
        "SELECT conversation_id, chunk_version FROM store_versions WHERE complete = 1"
    ):
        complete.setdefault(str(conv), []).append(int(version))
    layout: dict[str, list[int]] = {}
    for conv, version in sql.rows("SELECT DISTINCT conversation_id, chunk_version FROM layout"):
        layout.setdefault(str(conv), []).append(int(version))
    convs = {str(r[0]) for r in sql.rows("SELECT DISTINCT conversation_id FROM events")}
    for conv in sorted(convs | set(queue)):
        q = queue.get(conv)
        if complete.get(conv):
            active = max(complete[conv])
        elif q is not None and not q[3]:
            active = int(q[2])
        else:
            active = max(layout.get(conv, []), default=1)
        building = int(q[2]) if q is not None and q[3] and int(q[2]) != active else 0
        idle = q is None or q[1] == "idle"
        sql.run(
            "INSERT INTO conversations (conversation_id, active_version, building_version,"
            " work_seq, done_seq, reconcile_seq, reconciled_seq, active_planned_seq,"
            " last_indexed_turn, state, pending_since)"
            " VALUES (?, ?, ?, 2, ?, 2, 0, ?, ?, 'pending', " + sql.dialect.now + ")",
            (conv, active, building, 1 if idle else 0, 1 if idle else 0, int(q[4]) if q else -1),
        )
        sql.run("UPDATE events SET seq = ? WHERE conversation_id = ?", (1 if idle else 2, conv))
    sql.run(
        "INSERT INTO chunk_history (chunk_id, conversation_id, chunk_version, start_turn,"
        " end_turn) SELECT chunk_id, conversation_id, chunk_version, start_turn, end_turn"
        " FROM layout"
    )
    sql.run("DROP TABLE index_queue")
    sql.run("DROP TABLE store_versions")


def _log_v3(sql: Sql) -> None:
    """Events keep an opaque payload beside their text (MemoryEvent.payload)."""
    sql.run("ALTER TABLE events ADD COLUMN payload TEXT NOT NULL DEFAULT ''")


# Layout rows say which chunks are standing instructions, so a search of conversations
# that hold none skips their list (a second store search). Rows written before are marked
# as if they were: their intent is not known without rendering them again.
LAYOUT_STANDING = (
    "ALTER TABLE layout ADD COLUMN standing INTEGER NOT NULL DEFAULT 1",
    "CREATE INDEX layout_standing ON layout (conversation_id) WHERE standing = 1",
)


def _log_v4(sql: Sql) -> None:
    """Layout rows mark standing instructions (LayoutRow.standing)."""
    for statement in LAYOUT_STANDING:
        sql.run(statement)


# AppendEventsRequest.idempotency_key: the first answer to a keyed write, for its retries.
IDEMPOTENCY = (
    "CREATE TABLE idempotency (key TEXT PRIMARY KEY, request_hash TEXT NOT NULL,"
    " answer TEXT NOT NULL, created DOUBLE PRECISION NOT NULL)",
    "CREATE INDEX idempotency_created ON idempotency (created)",
)


def _log_v5(sql: Sql) -> None:
    """Keyed writes keep their first answer (AppendEventsRequest.idempotency_key)."""
    for statement in IDEMPOTENCY:
        sql.run(statement)


# The traceparents of the calls that queued a conversation's work since its last lease,
# newest first, space-separated, cut at TRACE_LINKS_CHARS (a few): the index step links them.
TRACE_LINKS = ("ALTER TABLE conversations ADD COLUMN trace_links TEXT NOT NULL DEFAULT ''",)


def _log_v6(sql: Sql) -> None:
    """Queued work remembers the traces that queued it (spans of index steps link them)."""
    for statement in TRACE_LINKS:
        sql.run(statement)


# Keyword statistics per tenant (memsvc.storage.sql.term_docs).
TERM_DOCS = (
    "CREATE TABLE term_docs (tenant TEXT NOT NULL, term BIGINT NOT NULL,"
    " docs INTEGER NOT NULL, PRIMARY KEY (tenant, term))",
)


def term_docs(sql: Sql) -> None:
    """Each tenant's keyword statistics, counted from the live events."""
    for statement in TERM_DOCS:
        sql.run(statement)
    count_all_terms(sql)


# A replan reads the layout from the turn a change can reach, and the index step asks for
# the first row still to render or store: without these, both scan every row of the
# conversation (a few ms per call at 10,000 turns).
LAYOUT_SPANS = (
    "CREATE INDEX layout_start ON layout (conversation_id, chunk_version, start_turn)",
    "CREATE INDEX layout_unstored ON layout (conversation_id, chunk_version, start_turn)"
    " WHERE deleted = 0 AND indexed = 0",
    "CREATE INDEX layout_unhashed ON layout (conversation_id, chunk_version, start_turn)"
    " WHERE deleted = 0 AND content_hash = ''",
)


def layout_spans(sql: Sql) -> None:
    """Layout rows are found by their first turn (replans and the index step read a few)."""
    for statement in LAYOUT_SPANS:
        sql.run(statement)


LOG_MIGRATIONS: tuple[Migration, ...] = (
    _log_v1,
    _log_v2,
    _log_v3,
    _log_v4,
    _log_v5,
    _log_v6,
    term_docs,
    layout_spans,
)


def _cache_v1(sql: Sql) -> None:
    sql.run(
        "CREATE TABLE IF NOT EXISTS vectors (model TEXT NOT NULL, text_hash TEXT NOT NULL,"
        " vector BLOB NOT NULL, PRIMARY KEY (model, text_hash)) WITHOUT ROWID"
    )


CACHE_MIGRATIONS: tuple[Migration, ...] = (_cache_v1,)


def migrate(sql: Sql, migrations: Sequence[Migration], what: str) -> int:
    """Brings the database (in the caller's transaction) to the newest version; returns it."""
    sql.run(
        "CREATE TABLE IF NOT EXISTS schema_version (id INTEGER PRIMARY KEY CHECK (id = 1),"
        " version INTEGER NOT NULL)"
    )
    row = sql.one("SELECT version FROM schema_version WHERE id = 1")
    current = int(row[0]) if row else 0
    if current > len(migrations):
        raise SchemaTooNew(
            f"the {what} is at schema version {current}, newer than this memsvc knows"
            f" ({len(migrations)}): run the memsvc version that wrote it, or restore a backup"
        )
    for version in range(current + 1, len(migrations) + 1):
        migrations[version - 1](sql)
    if current < len(migrations):
        sql.run(
            "INSERT INTO schema_version (id, version) VALUES (1, ?)"
            " ON CONFLICT (id) DO UPDATE SET version = excluded.version",
            (len(migrations),),
        )
    return len(migrations)
