"""Durable event log (SQLite, WAL, fsync on commit) and the chunk bookkeeping kept beside it.

Tables:
- events: every turn received, raw and cleaned, with its token count and deleted flag. A
  purged turn stays as a tombstone (deleted, purged, no text) so turn numbering continues.
- layout: per conversation and chunk_version, the chunks the last build planned (source
  hash = what the chunk was derived from, text hash = what it says, content hash = text
  and metadata as the server renders them: the only record an upsert may store for that
  id). Rows of chunks that covered a deleted turn stay, deleted = 1, until purged.
- chunk_texts: the text hash of every chunk ever rendered, with its turn range, so a purge
  can remove every cached vector derived from a purged turn.
- superseded: tail chunks replaced by a later build; removed from the vector store on the
  next upsert of that conversation (pending = 1 until then), and refused if upserted again.
- store_versions: chunk versions present in the vector store, per conversation.
- index_queue: per conversation, the asynchronous indexing state (see memsvc/worker.py).

A layout row is `indexed` once the vector store holds its text; a rebuild after a crash
between build and upsert re-renders the rows that are not.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from memsvc.chunking import StoredTurn

_SCHEMA = """
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


_LAYOUT_COLS = (
    "chunk_id, conversation_id, chunk_version, start_turn, end_turn, source_hash, text_hash,"
    " deleted, indexed, content_hash"
)
# Columns added after the first release: (table, column, definition).
_MIGRATIONS = (
    ("events", "purged", "INTEGER NOT NULL DEFAULT 0"),
    ("layout", "content_hash", "TEXT NOT NULL DEFAULT ''"),
    ("index_queue", "pending_since", "REAL NOT NULL DEFAULT 0"),
)
# Unix time in SQL (julianday works on every SQLite version; unixepoch() needs 3.38).
_NOW = "((julianday('now') - 2440587.5) * 86400.0)"


@dataclass(frozen=True)
class EventRow:
    conversation_id: str
    turn_id: int
    speaker: str
    speaker_name: str
    text: str
    clean_text: str
    timestamp: str
    participants: tuple[str, ...]
    tokens: int
    deleted: bool = False

    def same_content(self, other: EventRow) -> bool:
        return (self.speaker, self.speaker_name, self.text, self.timestamp, self.participants) == (
            other.speaker,
            other.speaker_name,
            other.text,
            other.timestamp,
            other.participants,
        )


@dataclass(frozen=True)
class LayoutRow:
    chunk_id: str
    conversation_id: str
    chunk_version: int
    start_turn: int
    end_turn: int
    source_hash: str
    text_hash: str
    deleted: bool = False
    indexed: bool = False
    # sha256 of the record as rendered (store.content_hash); "" for rows written before
    # content hashes were kept: such a row is re-rendered on the next build.
    content_hash: str = ""

    def covers(self, turn_id: int) -> bool:
        return self.start_turn <= turn_id <= self.end_turn


class EventLog:
    """SQLite database under the data dir; one connection per thread, writes serialised."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        conn = self._conn()
        for table, column, definition in _MIGRATIONS:
            if conn.execute(f"SELECT 1 FROM pragma_table_info('{table}')").fetchone() is None:
                continue  # a new database: the schema below creates it whole
            if (
                conn.execute(
                    f"SELECT 1 FROM pragma_table_info('{table}') WHERE name = ?", (column,)
                ).fetchone()
                is None
            ):
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
        conn.executescript(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            # FULL: each commit is fsync'd before the call returns: no acknowledged turn is lost.
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=OFF")
            self._local.conn = conn
        return conn

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT: one writer at a time, all-or-nothing."""
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every query inside sees the same committed state."""
        conn = self._conn()
        conn.execute("BEGIN")
        try:
            yield conn
        finally:
            conn.execute("COMMIT")

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- meta ---------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self._conn().execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, db: sqlite3.Connection, key: str, value: str) -> None:
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    # -- events -------------------------------------------------------------------------
    @staticmethod
    def _event(row: Sequence[object]) -> EventRow:
        return EventRow(
            conversation_id=str(row[0]),
            turn_id=int(row[1]),  # type: ignore[call-overload]
            speaker=str(row[2]),
            speaker_name=str(row[3]),
            text=str(row[4]),
            clean_text=str(row[5]),
            timestamp=str(row[6]),
            participants=tuple(json.loads(str(row[7]))),
            tokens=int(row[8]),  # type: ignore[call-overload]
            deleted=bool(row[9]),
        )

    _EVENT_COLS = (
        "conversation_id, turn_id, speaker, speaker_name, text, clean_text, timestamp,"
        " participants, tokens, deleted"
    )

    def get_events(
        self, db: sqlite3.Connection, conversation_id: str, turn_ids: Iterable[int]
    ) -> dict[int, EventRow]:
        ids = sorted(set(turn_ids))
        out: dict[int, EventRow] = {}
        for start in range(0, len(ids), 500):
            part = ids[start : start + 500]
            marks = ",".join("?" * len(part))
            for row in db.execute(
                f"SELECT {self._EVENT_COLS} FROM events WHERE conversation_id = ?"
                f" AND turn_id IN ({marks})",
                (conversation_id, *part),
            ):
                event = self._event(row)
                out[event.turn_id] = event
        return out

    def put_events(self, db: sqlite3.Connection, events: Iterable[EventRow]) -> None:
        db.executemany(
            f"INSERT OR REPLACE INTO events ({self._EVENT_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
            [
                (
                    e.conversation_id,
                    e.turn_id,
                    e.speaker,
                    e.speaker_name,
                    e.text,
                    e.clean_text,
                    e.timestamp,
                    json.dumps(list(e.participants), ensure_ascii=False),
                    e.tokens,
                    int(e.deleted),
                )
                for e in events
            ],
        )

    def turn_stats(self, db: sqlite3.Connection, conversation_id: str) -> tuple[int, int, int]:
        """(min turn_id, max turn_id, count) over all stored events, deleted included."""
        row = db.execute(
            "SELECT MIN(turn_id), MAX(turn_id), COUNT(*) FROM events WHERE conversation_id = ?",
            (conversation_id,),
        ).fetchone()
        if row is None or row[2] == 0:
            return (0, -1, 0)
        return (int(row[0]), int(row[1]), int(row[2]))

    def live_turns(self, db: sqlite3.Connection, conversation_id: str) -> list[StoredTurn]:
        """Non-deleted turns with text after cleaning, in turn order."""
        rows = db.execute(
            "SELECT turn_id, speaker, clean_text, timestamp, participants, speaker_name, tokens"
            " FROM events WHERE conversation_id = ? AND deleted = 0 AND clean_text != ''"
            " ORDER BY turn_id",
            (conversation_id,),
        )
        return [
            StoredTurn(
                turn_id=int(r[0]),
                speaker=str(r[1]),
                text=str(r[2]),
                timestamp=str(r[3]),
                participants=tuple(json.loads(r[4])),
                speaker_name=str(r[5]),
                tokens=int(r[6]),
            )
            for r in rows
        ]

    def mark_events_deleted(
        self,
        db: sqlite3.Connection,
        conversation_id: str,
        spans: Sequence[tuple[int, int]] | None,
    ) -> int:
        """Marks the events in the inclusive turn spans (None = every turn) deleted; returns
        how many changed."""
        if spans is None:
            return db.execute(
                "UPDATE events SET deleted = 1 WHERE conversation_id = ? AND deleted = 0",
                (conversation_id,),
            ).rowcount
        changed = 0
        for start, end in spans:
            changed += db.execute(
                "UPDATE events SET deleted = 1 WHERE conversation_id = ? AND deleted = 0"
                " AND turn_id BETWEEN ? AND ?",
                (conversation_id, start, end),
            ).rowcount
        return changed

    def deleted_turn_ids(self, db: sqlite3.Connection, conversation_id: str) -> list[int]:
        """Deleted (and purged) turn ids of a conversation, ascending."""
        rows = db.execute(
            "SELECT turn_id FROM events WHERE conversation_id = ? AND deleted = 1 ORDER BY 1",
            (conversation_id,),
        )
        return [int(r[0]) for r in rows]

    def purge_events(self, db: sqlite3.Connection, conversation_id: str) -> list[int]:
        """Erases the text of deleted turns, leaving tombstones (deleted, purged, no text) so
        turn numbering continues. Returns the turn ids erased now."""
        turns = [
            int(r[0])
            for r in db.execute(
                "SELECT turn_id FROM events WHERE conversation_id = ? AND deleted = 1"
                " AND purged = 0",
                (conversation_id,),
            )
        ]
        db.execute(
            "UPDATE events SET text = '', clean_text = '', speaker_name = '',"
            " participants = '[]', tokens = 0, purged = 1"
            " WHERE conversation_id = ? AND deleted = 1 AND purged = 0",
            (conversation_id,),
        )
        return turns

    def conversations_with_deleted(self) -> list[str]:
        """Conversations with deleted turns not yet purged or deleted layout rows."""
        rows = self._conn().execute(
            "SELECT conversation_id FROM events WHERE deleted = 1 AND purged = 0"
            " UNION SELECT conversation_id FROM layout WHERE deleted = 1 ORDER BY 1"
        )
        return [str(r[0]) for r in rows]

    def all_event_texts(self, db: sqlite3.Connection) -> list[tuple[str, int, str]]:
        return [
            (str(r[0]), int(r[1]), str(r[2]))
            for r in db.execute("SELECT conversation_id, turn_id, clean_text FROM events")
        ]

    def set_tokens(self, db: sqlite3.Connection, rows: Iterable[tuple[int, str, int]]) -> None:
        db.executemany(
            "UPDATE events SET tokens = ? WHERE conversation_id = ? AND turn_id = ?", rows
        )

    # -- layout -------------------------------------------------------------------------
    def get_layout(
        self, db: sqlite3.Connection, conversation_id: str, version: int
    ) -> dict[str, LayoutRow]:
        rows = db.execute(
            f"SELECT {_LAYOUT_COLS} FROM layout WHERE conversation_id = ? AND chunk_version = ?",
            (conversation_id, version),
        )
        return {str(r[0]): _layout(r) for r in rows}

    def layout_rows(self, chunk_ids: Sequence[str]) -> dict[str, LayoutRow]:
        db = self._conn()
        out: dict[str, LayoutRow] = {}
        for start in range(0, len(chunk_ids), 500):
            part = list(chunk_ids[start : start + 500])
            marks = ",".join("?" * len(part))
            for r in db.execute(
                f"SELECT {_LAYOUT_COLS} FROM layout WHERE chunk_id IN ({marks})",
                part,
            ):
                out[str(r[0])] = _layout(r)
        return out

    def put_layout(self, db: sqlite3.Connection, rows: Iterable[LayoutRow]) -> None:
        db.executemany(
            f"INSERT OR REPLACE INTO layout ({_LAYOUT_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
            [
                (
                    r.chunk_id,
                    r.conversation_id,
                    r.chunk_version,
                    r.start_turn,
                    r.end_turn,
                    r.source_hash,
                    r.text_hash,
                    int(r.deleted),
                    int(r.indexed),
                    r.content_hash,
                )
                for r in rows
            ],
        )
        db.executemany(
            "INSERT OR IGNORE INTO chunk_texts (conversation_id, text_hash, start_turn, end_turn)"
            " VALUES (?,?,?,?)",
            [(r.conversation_id, r.text_hash, r.start_turn, r.end_turn) for r in rows],
        )

    def mark_indexed(self, pairs: Iterable[tuple[str, str]]) -> None:
        """(chunk_id, text_hash) now in the vector store with that text."""
        rows = list(pairs)
        if not rows:
            return
        with self.transaction() as db:
            db.executemany(
                "UPDATE layout SET indexed = 1 WHERE chunk_id = ? AND text_hash = ?", rows
            )

    def forget_store(self, db: sqlite3.Connection) -> None:
        """The vector store changed (new collection or model): nothing in it is known."""
        db.execute("UPDATE layout SET indexed = 0")
        db.execute("DELETE FROM superseded")
        db.execute("DELETE FROM store_versions")

    def drop_layout(self, db: sqlite3.Connection, chunk_ids: Iterable[str]) -> None:
        db.executemany("DELETE FROM layout WHERE chunk_id = ?", [(c,) for c in chunk_ids])

    def mark_layout_deleted(self, db: sqlite3.Connection, chunk_ids: Iterable[str]) -> None:
        db.executemany(
            "UPDATE layout SET deleted = 1 WHERE chunk_id = ?", [(c,) for c in chunk_ids]
        )

    def layout_versions(self, db: sqlite3.Connection, conversation_id: str) -> list[int]:
        rows = db.execute(
            "SELECT DISTINCT chunk_version FROM layout WHERE conversation_id = ? ORDER BY 1",
            (conversation_id,),
        )
        return [int(r[0]) for r in rows]

    def conversation_layout(
        self, db: sqlite3.Connection, conversation_id: str
    ) -> dict[str, LayoutRow]:
        """Every layout row of a conversation, all versions, deleted ones included."""
        rows = db.execute(
            f"SELECT {_LAYOUT_COLS} FROM layout WHERE conversation_id = ?", (conversation_id,)
        )
        return {str(r[0]): _layout(r) for r in rows}

    def purge_layout(
        self, db: sqlite3.Connection, conversation_id: str, purged_turns: Sequence[int]
    ) -> set[str]:
        """Drops deleted layout rows and the text history of every chunk that covered a
        purged turn; returns those chunks' text hashes (their cached vectors go too)."""
        hashes = {
            str(r[0])
            for r in db.execute(
                "SELECT text_hash FROM layout WHERE conversation_id = ? AND deleted = 1",
                (conversation_id,),
            )
        }
        db.execute(
            "DELETE FROM layout WHERE conversation_id = ? AND deleted = 1", (conversation_id,)
        )
        for turn in purged_turns:
            for r in db.execute(
                "SELECT text_hash FROM chunk_texts WHERE conversation_id = ?"
                " AND start_turn <= ? AND end_turn >= ?",
                (conversation_id, turn, turn),
            ).fetchall():
                hashes.add(str(r[0]))
            db.execute(
                "DELETE FROM chunk_texts WHERE conversation_id = ? AND start_turn <= ?"
                " AND end_turn >= ?",
                (conversation_id, turn, turn),
            )
        return hashes

    def drop_layout_version(
        self, db: sqlite3.Connection, conversation_id: str, version: int
    ) -> None:
        db.execute(
            "DELETE FROM layout WHERE conversation_id = ? AND chunk_version = ?",
            (conversation_id, version),
        )

    # -- superseded tails ---------------------------------------------------------------
    def add_superseded(
        self, db: sqlite3.Connection, conversation_id: str, chunk_ids: Iterable[str]
    ) -> None:
        db.executemany(
            "INSERT OR REPLACE INTO superseded (chunk_id, conversation_id, pending) VALUES (?,?,1)",
            [(c, conversation_id) for c in chunk_ids],
        )

    def clear_superseded(self, db: sqlite3.Connection, chunk_ids: Iterable[str]) -> None:
        db.executemany("DELETE FROM superseded WHERE chunk_id = ?", [(c,) for c in chunk_ids])

    def pending_superseded(self, conversation_id: str) -> list[str]:
        rows = self._conn().execute(
            "SELECT chunk_id FROM superseded WHERE conversation_id = ? AND pending = 1",
            (conversation_id,),
        )
        return [str(r[0]) for r in rows]

    def superseded_done(self, chunk_ids: Iterable[str]) -> None:
        with self.transaction() as db:
            db.executemany(
                "UPDATE superseded SET pending = 0 WHERE chunk_id = ?", [(c,) for c in chunk_ids]
            )

    def superseded_among(self, chunk_ids: Sequence[str]) -> set[str]:
        out: set[str] = set()
        db = self._conn()
        for start in range(0, len(chunk_ids), 500):
            part = list(chunk_ids[start : start + 500])
            marks = ",".join("?" * len(part))
            out.update(
                str(r[0])
                for r in db.execute(
                    f"SELECT chunk_id FROM superseded WHERE chunk_id IN ({marks})", part
                )
            )
        return out

    # -- chunk versions present in the store ----------------------------------------------
    def add_store_versions(self, pairs: Iterable[tuple[str, int]], complete: bool = True) -> None:
        """Versions now in the store; an incomplete one (a reindex under way) is not yet the
        default for searches."""
        with self.transaction() as db:
            db.executemany(
                "INSERT INTO store_versions (conversation_id, chunk_version, complete)"
                " VALUES (?,?,?) ON CONFLICT (conversation_id, chunk_version)"
                " DO UPDATE SET complete = MAX(complete, excluded.complete)",
                [(c, v, int(complete)) for c, v in pairs],
            )

    def remove_store_version(
        self, db: sqlite3.Connection, conversation_id: str, version: int
    ) -> None:
        db.execute(
            "DELETE FROM store_versions WHERE conversation_id = ? AND chunk_version = ?",
            (conversation_id, version),
        )

    def complete_versions(self, db: sqlite3.Connection, conversation_id: str) -> list[int]:
        rows = db.execute(
            "SELECT chunk_version FROM store_versions WHERE conversation_id = ? AND complete = 1"
            " ORDER BY chunk_version",
            (conversation_id,),
        )
        return [int(r[0]) for r in rows]

    def conversations(self) -> list[str]:
        rows = self._conn().execute("SELECT DISTINCT conversation_id FROM events ORDER BY 1")
        return [str(r[0]) for r in rows]

    def live_turn_count(self, db: sqlite3.Connection, conversation_id: str) -> int:
        row = db.execute(
            "SELECT COUNT(*) FROM events WHERE conversation_id = ? AND deleted = 0",
            (conversation_id,),
        ).fetchone()
        return int(row[0])

    def reset_indexed(self, db: sqlite3.Connection, conversation_id: str, version: int) -> None:
        db.execute(
            "UPDATE layout SET indexed = 0 WHERE conversation_id = ? AND chunk_version = ?",
            (conversation_id, version),
        )

    def multi_version_latest(self, conversation_ids: Sequence[str] = ()) -> dict[str, int]:
        """Newest complete version of each conversation that has several versions stored."""
        sql = (
            "SELECT conversation_id, COALESCE(MAX(CASE WHEN complete = 1 THEN chunk_version END),"
            " MAX(chunk_version)) FROM store_versions"
            " {where} GROUP BY conversation_id HAVING COUNT(*) > 1"
        )
        if conversation_ids:
            marks = ",".join("?" * len(conversation_ids))
            rows = self._conn().execute(
                sql.format(where=f"WHERE conversation_id IN ({marks})"), list(conversation_ids)
            )
        else:
            rows = self._conn().execute(sql.format(where=""))
        return {str(r[0]): int(r[1]) for r in rows}


def _layout(r: Sequence[object]) -> LayoutRow:
    return LayoutRow(
        chunk_id=str(r[0]),
        conversation_id=str(r[1]),
        chunk_version=int(r[2]),  # type: ignore[call-overload]
        start_turn=int(r[3]),  # type: ignore[call-overload]
        end_turn=int(r[4]),  # type: ignore[call-overload]
        source_hash=str(r[5]),
        text_hash=str(r[6]),
        deleted=bool(r[7]),
        indexed=bool(r[8]),
        content_hash=str(r[9]),
    )


@dataclass(frozen=True)
class QueueItem:
    """One conversation's asynchronous indexing state."""

    conversation_id: str
    state: str  # idle | pending | indexing | failed
    chunk_version: int
    dirty: int  # accepted events not yet indexed
    attempts: int
    last_error: str
    last_indexed_turn: int
    reindex: bool
    last_appended_turn: int = -1

    def indexed_through(self, turn_id: int) -> bool:
        return self.state == "idle" and self.last_indexed_turn >= turn_id


_QUEUE_COLS = (
    "q.conversation_id, q.state, q.chunk_version, q.dirty, q.attempts, q.last_error,"
    " q.last_indexed_turn, q.reindex,"
    " (SELECT MAX(turn_id) FROM events e WHERE e.conversation_id = q.conversation_id)"
)


def _queue_item(r: Sequence[object]) -> QueueItem:
    return QueueItem(
        conversation_id=str(r[0]),
        state=str(r[1]),
        chunk_version=int(r[2]),  # type: ignore[call-overload]
        dirty=int(r[3]),  # type: ignore[call-overload]
        attempts=int(r[4]),  # type: ignore[call-overload]
        last_error=str(r[5]),
        last_indexed_turn=int(r[6]),  # type: ignore[call-overload]
        reindex=bool(r[7]),
        last_appended_turn=-1 if r[8] is None else int(r[8]),  # type: ignore[call-overload]
    )


@dataclass(frozen=True)
class QueueGauges:
    backlog: int
    by_state: dict[str, int]
    oldest_pending_since: float | None  # unix time; None = nothing waiting


class IndexQueue:
    """The index_queue table: what the background worker has to do, leased with expiry."""

    def __init__(self, log: EventLog) -> None:
        self.log = log

    def enqueue(
        self,
        db: sqlite3.Connection,
        conversation_id: str,
        dirty: int,
        chunk_version: int,
        reindex: bool = False,
    ) -> None:
        """New work for a conversation; a failed one is retried from scratch."""
        db.execute(
            "INSERT INTO index_queue"
            " (conversation_id, state, chunk_version, dirty, reindex, pending_since)"
            f" VALUES (?, 'pending', ?, ?, ?, {_NOW})"
            " ON CONFLICT (conversation_id) DO UPDATE SET"
            "  dirty = dirty + excluded.dirty,"
            "  state = CASE WHEN state = 'indexing' THEN 'indexing' ELSE 'pending' END,"
            "  chunk_version = CASE WHEN excluded.reindex = 1 THEN excluded.chunk_version"
            "                  ELSE chunk_version END,"
            "  reindex = MAX(reindex, excluded.reindex),"
            "  attempts = 0, next_attempt_at = 0,"
            f"  pending_since = CASE WHEN pending_since = 0 THEN {_NOW} ELSE pending_since END",
            (conversation_id, chunk_version, dirty, int(reindex)),
        )

    def release_stale_leases(self) -> int:
        """At start-up: leases held by a process that is gone go back to pending."""
        with self.log.transaction() as db:
            return db.execute(
                "UPDATE index_queue SET state = 'pending', lease_until = 0 WHERE state = 'indexing'"
            ).rowcount

    def stop_reindex(self, db: sqlite3.Connection, conversation_id: str, version: int) -> None:
        """Back to indexing `version` incrementally (turns appended meanwhile still get
        indexed there)."""
        db.execute(
            "UPDATE index_queue SET reindex = 0, chunk_version = ?, attempts = 0,"
            " state = CASE WHEN state = 'failed' THEN 'pending' ELSE state END"
            " WHERE conversation_id = ?",
            (version, conversation_id),
        )

    def release(self, conversation_id: str) -> None:
        """Hand a lease back untouched: pending again, no attempt counted."""
        with self.log.transaction() as db:
            db.execute(
                "UPDATE index_queue SET state = 'pending', lease_until = 0, leased_dirty = 0"
                " WHERE conversation_id = ? AND state = 'indexing'",
                (conversation_id,),
            )

    def lease(self, now: float, lease_s: float, limit: int) -> list[QueueItem]:
        with self.log.transaction() as db:
            rows = db.execute(
                f"SELECT {_QUEUE_COLS} FROM index_queue q WHERE"
                " (q.state = 'pending' AND q.next_attempt_at <= ?)"
                " OR (q.state = 'indexing' AND q.lease_until < ?)"
                " ORDER BY q.next_attempt_at, q.conversation_id LIMIT ?",
                (now, now, limit),
            ).fetchall()
            db.executemany(
                "UPDATE index_queue SET state = 'indexing', lease_until = ?, leased_dirty = dirty"
                " WHERE conversation_id = ?",
                [(now + lease_s, r[0]) for r in rows],
            )
        return [_queue_item(r) for r in rows]

    def complete(self, conversation_id: str, indexed_turn: int, again: bool = False) -> None:
        """The leased work is stored through `indexed_turn`. `again`: more remains (a
        bounded step, or the layout moved on meanwhile): pending again, a reindex stays one."""
        more = int(again)
        with self.log.transaction() as db:
            db.execute(
                "UPDATE index_queue SET dirty = MAX(0, dirty - leased_dirty) + ?,"
                " leased_dirty = 0,"
                " state = CASE WHEN dirty - leased_dirty + ? > 0 THEN 'pending' ELSE 'idle' END,"
                " attempts = 0, last_error = '', lease_until = 0,"
                " reindex = CASE WHEN ? THEN reindex ELSE 0 END,"
                " pending_since = CASE WHEN dirty - leased_dirty + ? > 0 THEN pending_since"
                "  ELSE 0 END,"
                " last_indexed_turn = MAX(last_indexed_turn, ?) WHERE conversation_id = ?",
                (more, more, more, more, indexed_turn, conversation_id),
            )

    def fail(
        self, conversation_id: str, error: str, now: float, max_attempts: int, backoff_s: float
    ) -> None:
        with self.log.transaction() as db:
            row = db.execute(
                "SELECT attempts FROM index_queue WHERE conversation_id = ?", (conversation_id,)
            ).fetchone()
            attempts = (int(row[0]) if row else 0) + 1
            failed = attempts >= max_attempts
            db.execute(
                "UPDATE index_queue SET attempts = ?, last_error = ?, lease_until = 0,"
                " leased_dirty = 0, state = ?, next_attempt_at = ? WHERE conversation_id = ?",
                (
                    attempts,
                    error[:2000],
                    "failed" if failed else "pending",
                    now + backoff_s * 2 ** (attempts - 1),
                    conversation_id,
                ),
            )

    def status(self, conversation_ids: Sequence[str] = ()) -> list[QueueItem]:
        db = self.log._conn()
        if conversation_ids:
            marks = ",".join("?" * len(conversation_ids))
            rows = db.execute(
                f"SELECT {_QUEUE_COLS} FROM index_queue q WHERE q.conversation_id IN ({marks})"
                " ORDER BY q.conversation_id",
                list(conversation_ids),
            )
        else:
            rows = db.execute(f"SELECT {_QUEUE_COLS} FROM index_queue q ORDER BY q.conversation_id")
        return [_queue_item(r) for r in rows]

    def gauges(self) -> QueueGauges:
        """Totals for monitoring, in one query."""
        rows = (
            self.log._conn()
            .execute(
                "SELECT state, COUNT(*), SUM(dirty), MIN(CASE WHEN pending_since > 0"
                " THEN pending_since END) FROM index_queue GROUP BY state"
            )
            .fetchall()
        )
        oldest = [float(r[3]) for r in rows if r[3] is not None and r[0] != "idle"]
        return QueueGauges(
            backlog=sum(int(r[2] or 0) for r in rows),
            by_state={str(r[0]): int(r[1]) for r in rows},
            oldest_pending_since=min(oldest) if oldest else None,
        )

    def advance_indexed(self, db: sqlite3.Connection, conversation_id: str) -> None:
        """Chunks were stored outside the worker (a caller's Build + Upsert): move
        last_indexed_turn up to the first turn of the queued version still unindexed, so
        WaitForIndexed sees read-your-writes on mixed synchronous/asynchronous use."""
        db.execute(
            "UPDATE index_queue SET last_indexed_turn = MAX(last_indexed_turn, COALESCE("
            "  (SELECT MIN(l.start_turn) - 1 FROM layout l WHERE l.conversation_id = ?"
            "   AND l.chunk_version = index_queue.chunk_version AND l.deleted = 0"
            "   AND l.indexed = 0),"
            "  (SELECT MAX(l.end_turn) FROM layout l WHERE l.conversation_id = ?"
            "   AND l.chunk_version = index_queue.chunk_version),"
            "  -1)) WHERE conversation_id = ?",
            (conversation_id, conversation_id, conversation_id),
        )

    def version_of(self, db: sqlite3.Connection, conversation_id: str) -> int | None:
        row = db.execute(
            "SELECT chunk_version FROM index_queue WHERE conversation_id = ?", (conversation_id,)
        ).fetchone()
        return None if row is None else int(row[0])
