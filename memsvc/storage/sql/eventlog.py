"""The event log and the chunk bookkeeping kept beside it, in shared SQL (tables: see the
schema modules of each backend).

- events: every turn received, raw and cleaned, with its token count and deleted flag. A
  purged turn stays as a tombstone (deleted, purged, no text) so turn numbering continues.
- layout: per conversation and chunk_version, the chunks the last plan holds (memsvc.domain.
  records.LayoutRow). Rows of chunks that covered a deleted turn stay, deleted = 1, until
  purged. A row is `indexed` once the vector store holds its text.
- chunk_texts: the text hash of every chunk ever rendered, with its turn range, so a purge
  can remove every cached vector derived from a purged turn.
- superseded: tail chunks replaced by a later plan; removed from the vector store on the
  next write of that conversation (pending = 1 until then), and refused if upserted again.
- store_versions: chunk versions present in the vector store, per conversation.
- index_queue: per conversation, the asynchronous indexing state (memsvc.storage.sql.queue).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import count

from memsvc.domain.chunking import StoredTurn
from memsvc.domain.records import EventRow, LayoutRow
from memsvc.ports import Span
from memsvc.storage.sql import queue
from memsvc.storage.sql.connection import Database, Row, Sql, chunked, marks

_EVENT_COLS = (
    "conversation_id, turn_id, speaker, speaker_name, text, clean_text, timestamp,"
    " participants, tokens, deleted"
)
_LAYOUT_COLS = (
    "chunk_id, conversation_id, chunk_version, start_turn, end_turn, source_hash, text_hash,"
    " deleted, indexed, content_hash"
)
_savepoints = count()


def _event(r: Row) -> EventRow:
    return EventRow(
        conversation_id=str(r[0]),
        turn_id=int(r[1]),
        speaker=str(r[2]),
        speaker_name=str(r[3]),
        text=str(r[4]),
        clean_text=str(r[5]),
        timestamp=str(r[6]),
        participants=tuple(json.loads(str(r[7]))),
        tokens=int(r[8]),
        deleted=bool(r[9]),
    )


def _layout(r: Row) -> LayoutRow:
    return LayoutRow(
        chunk_id=str(r[0]),
        conversation_id=str(r[1]),
        chunk_version=int(r[2]),
        start_turn=int(r[3]),
        end_turn=int(r[4]),
        source_hash=str(r[5]),
        text_hash=str(r[6]),
        deleted=bool(r[7]),
        indexed=bool(r[8]),
        content_hash=str(r[9]),
    )


class SqlLog:
    """The event log's queries on one snapshot or transaction (memsvc.ports.LogWriter)."""

    def __init__(self, sql: Sql) -> None:
        self.sql = sql

    # -- meta ---------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self.sql.one("SELECT value FROM meta WHERE key = ?", (key,))
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self.sql.run(
            "INSERT INTO meta (key, value) VALUES (?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        with self.sql.savepoint(f"sp{next(_savepoints)}"):
            yield

    # -- events -------------------------------------------------------------------------
    def events(self, conversation_id: str, turn_ids: Iterable[int]) -> dict[int, EventRow]:
        out: dict[int, EventRow] = {}
        for part in chunked(sorted(set(turn_ids))):
            for row in self.sql.rows(
                f"SELECT {_EVENT_COLS} FROM events WHERE conversation_id = ?"
                f" AND turn_id IN ({marks(len(part))})",
                (conversation_id, *part),
            ):
                event = _event(row)
                out[event.turn_id] = event
        return out

    def put_events(self, events: Iterable[EventRow]) -> None:
        self.sql.many(
            f"INSERT INTO events ({_EVENT_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT (conversation_id, turn_id) DO UPDATE SET"
            " speaker = excluded.speaker, speaker_name = excluded.speaker_name,"
            " text = excluded.text, clean_text = excluded.clean_text,"
            " timestamp = excluded.timestamp, participants = excluded.participants,"
            " tokens = excluded.tokens, deleted = excluded.deleted",
            (
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
            ),
        )

    def turn_stats(self, conversation_id: str) -> tuple[int, int, int]:
        row = self.sql.one(
            "SELECT MIN(turn_id), MAX(turn_id), COUNT(*) FROM events WHERE conversation_id = ?",
            (conversation_id,),
        )
        if row is None or not row[2]:
            return (0, -1, 0)
        return (int(row[0]), int(row[1]), int(row[2]))

    def live_turns(self, conversation_id: str) -> list[StoredTurn]:
        rows = self.sql.rows(
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
                participants=tuple(json.loads(str(r[4]))),
                speaker_name=str(r[5]),
                tokens=int(r[6]),
            )
            for r in rows
        ]

    def live_turn_count(self, conversation_id: str) -> int:
        row = self.sql.one(
            "SELECT COUNT(*) FROM events WHERE conversation_id = ? AND deleted = 0",
            (conversation_id,),
        )
        return int(row[0]) if row else 0

    def mark_events_deleted(self, conversation_id: str, spans: Sequence[Span] | None) -> int:
        if spans is None:
            return self.sql.run(
                "UPDATE events SET deleted = 1 WHERE conversation_id = ? AND deleted = 0",
                (conversation_id,),
            )
        return sum(
            self.sql.run(
                "UPDATE events SET deleted = 1 WHERE conversation_id = ? AND deleted = 0"
                " AND turn_id BETWEEN ? AND ?",
                (conversation_id, start, end),
            )
            for start, end in spans
        )

    def deleted_turn_ids(self, conversation_id: str) -> list[int]:
        rows = self.sql.rows(
            "SELECT turn_id FROM events WHERE conversation_id = ? AND deleted = 1 ORDER BY turn_id",
            (conversation_id,),
        )
        return [int(r[0]) for r in rows]

    def purge_events(self, conversation_id: str) -> list[int]:
        turns = [
            int(r[0])
            for r in self.sql.rows(
                "SELECT turn_id FROM events WHERE conversation_id = ? AND deleted = 1"
                " AND purged = 0",
                (conversation_id,),
            )
        ]
        self.sql.run(
            "UPDATE events SET text = '', clean_text = '', speaker_name = '',"
            " participants = '[]', tokens = 0, purged = 1"
            " WHERE conversation_id = ? AND deleted = 1 AND purged = 0",
            (conversation_id,),
        )
        return turns

    def conversations(self) -> list[str]:
        rows = self.sql.rows("SELECT DISTINCT conversation_id FROM events ORDER BY 1")
        return [str(r[0]) for r in rows]

    def conversations_with_deleted(self) -> list[str]:
        rows = self.sql.rows(
            "SELECT conversation_id FROM events WHERE deleted = 1 AND purged = 0"
            " UNION SELECT conversation_id FROM layout WHERE deleted = 1 ORDER BY 1"
        )
        return [str(r[0]) for r in rows]

    def event_texts(self) -> list[tuple[str, int, str]]:
        rows = self.sql.rows("SELECT conversation_id, turn_id, clean_text FROM events")
        return [(str(r[0]), int(r[1]), str(r[2])) for r in rows]

    def set_tokens(self, rows: Iterable[tuple[int, str, int]]) -> None:
        self.sql.many(
            "UPDATE events SET tokens = ? WHERE conversation_id = ? AND turn_id = ?", rows
        )

    # -- layout -------------------------------------------------------------------------
    def layout(self, conversation_id: str, version: int) -> dict[str, LayoutRow]:
        rows = self.sql.rows(
            f"SELECT {_LAYOUT_COLS} FROM layout WHERE conversation_id = ? AND chunk_version = ?",
            (conversation_id, version),
        )
        return {str(r[0]): _layout(r) for r in rows}

    def conversation_layout(self, conversation_id: str) -> dict[str, LayoutRow]:
        rows = self.sql.rows(
            f"SELECT {_LAYOUT_COLS} FROM layout WHERE conversation_id = ?", (conversation_id,)
        )
        return {str(r[0]): _layout(r) for r in rows}

    def layout_rows(self, chunk_ids: Sequence[str]) -> dict[str, LayoutRow]:
        out: dict[str, LayoutRow] = {}
        for part in chunked(list(chunk_ids)):
            for r in self.sql.rows(
                f"SELECT {_LAYOUT_COLS} FROM layout WHERE chunk_id IN ({marks(len(part))})",
                part,
            ):
                out[str(r[0])] = _layout(r)
        return out

    def layout_versions(self, conversation_id: str) -> list[int]:
        rows = self.sql.rows(
            "SELECT DISTINCT chunk_version FROM layout WHERE conversation_id = ? ORDER BY 1",
            (conversation_id,),
        )
        return [int(r[0]) for r in rows]

    def put_layout(self, rows: Iterable[LayoutRow]) -> None:
        rows = list(rows)
        self.sql.many(
            f"INSERT INTO layout ({_LAYOUT_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT (chunk_id) DO UPDATE SET conversation_id = excluded.conversation_id,"
            " chunk_version = excluded.chunk_version, start_turn = excluded.start_turn,"
            " end_turn = excluded.end_turn, source_hash = excluded.source_hash,"
            " text_hash = excluded.text_hash, deleted = excluded.deleted,"
            " indexed = excluded.indexed, content_hash = excluded.content_hash",
            (
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
            ),
        )
        self.sql.many(
            "INSERT INTO chunk_texts (conversation_id, text_hash, start_turn, end_turn)"
            " VALUES (?,?,?,?) ON CONFLICT DO NOTHING",
            ((r.conversation_id, r.text_hash, r.start_turn, r.end_turn) for r in rows),
        )

    def mark_indexed(self, pairs: Iterable[tuple[str, str]]) -> None:
        self.sql.many("UPDATE layout SET indexed = 1 WHERE chunk_id = ? AND text_hash = ?", pairs)

    def reset_indexed(self, conversation_id: str, version: int) -> None:
        self.sql.run(
            "UPDATE layout SET indexed = 0 WHERE conversation_id = ? AND chunk_version = ?",
            (conversation_id, version),
        )

    def forget_store(self) -> None:
        self.sql.run("UPDATE layout SET indexed = 0")
        self.sql.run("DELETE FROM superseded")
        self.sql.run("DELETE FROM store_versions")

    def drop_layout(self, chunk_ids: Iterable[str]) -> None:
        self.sql.many("DELETE FROM layout WHERE chunk_id = ?", ((c,) for c in chunk_ids))

    def mark_layout_deleted(self, chunk_ids: Iterable[str]) -> None:
        self.sql.many("UPDATE layout SET deleted = 1 WHERE chunk_id = ?", ((c,) for c in chunk_ids))

    def drop_layout_version(self, conversation_id: str, version: int) -> None:
        self.sql.run(
            "DELETE FROM layout WHERE conversation_id = ? AND chunk_version = ?",
            (conversation_id, version),
        )

    def purge_layout(self, conversation_id: str, purged_turns: Sequence[int]) -> set[str]:
        hashes = {
            str(r[0])
            for r in self.sql.rows(
                "SELECT text_hash FROM layout WHERE conversation_id = ? AND deleted = 1",
                (conversation_id,),
            )
        }
        self.sql.run(
            "DELETE FROM layout WHERE conversation_id = ? AND deleted = 1", (conversation_id,)
        )
        for turn in purged_turns:
            span = (conversation_id, turn, turn)
            hashes.update(
                str(r[0])
                for r in self.sql.rows(
                    "SELECT text_hash FROM chunk_texts WHERE conversation_id = ?"
                    " AND start_turn <= ? AND end_turn >= ?",
                    span,
                )
            )
            self.sql.run(
                "DELETE FROM chunk_texts WHERE conversation_id = ? AND start_turn <= ?"
                " AND end_turn >= ?",
                span,
            )
        return hashes

    # -- superseded tails ---------------------------------------------------------------
    def add_superseded(self, conversation_id: str, chunk_ids: Iterable[str]) -> None:
        self.sql.many(
            "INSERT INTO superseded (chunk_id, conversation_id, pending) VALUES (?,?,1)"
            " ON CONFLICT (chunk_id) DO UPDATE SET conversation_id = excluded.conversation_id,"
            " pending = 1",
            ((c, conversation_id) for c in chunk_ids),
        )

    def clear_superseded(self, chunk_ids: Iterable[str]) -> None:
        self.sql.many("DELETE FROM superseded WHERE chunk_id = ?", ((c,) for c in chunk_ids))

    def superseded_done(self, chunk_ids: Iterable[str]) -> None:
        self.sql.many(
            "UPDATE superseded SET pending = 0 WHERE chunk_id = ?", ((c,) for c in chunk_ids)
        )

    def pending_superseded(self, conversation_id: str) -> list[str]:
        rows = self.sql.rows(
            "SELECT chunk_id FROM superseded WHERE conversation_id = ? AND pending = 1",
            (conversation_id,),
        )
        return [str(r[0]) for r in rows]

    def superseded_among(self, chunk_ids: Sequence[str]) -> set[str]:
        out: set[str] = set()
        for part in chunked(list(chunk_ids)):
            out.update(
                str(r[0])
                for r in self.sql.rows(
                    f"SELECT chunk_id FROM superseded WHERE chunk_id IN ({marks(len(part))})",
                    part,
                )
            )
        return out

    # -- chunk versions present in the store ----------------------------------------------
    def add_store_versions(self, pairs: Iterable[tuple[str, int]], complete: bool) -> None:
        """Versions now in the store; an incomplete one (a reindex under way) is not yet the
        default for searches."""
        self.sql.many(
            "INSERT INTO store_versions (conversation_id, chunk_version, complete)"
            " VALUES (?,?,?) ON CONFLICT (conversation_id, chunk_version) DO UPDATE SET"
            " complete = CASE WHEN store_versions.complete > excluded.complete"
            "  THEN store_versions.complete ELSE excluded.complete END",
            ((c, v, int(complete)) for c, v in pairs),
        )

    def remove_store_version(self, conversation_id: str, version: int) -> None:
        self.sql.run(
            "DELETE FROM store_versions WHERE conversation_id = ? AND chunk_version = ?",
            (conversation_id, version),
        )

    def complete_versions(self, conversation_id: str) -> list[int]:
        rows = self.sql.rows(
            "SELECT chunk_version FROM store_versions WHERE conversation_id = ? AND complete = 1"
            " ORDER BY chunk_version",
            (conversation_id,),
        )
        return [int(r[0]) for r in rows]

    def multi_version_latest(self, conversation_ids: Sequence[str] = ()) -> dict[str, int]:
        sql = (
            "SELECT conversation_id, COALESCE(MAX(CASE WHEN complete = 1 THEN chunk_version END),"
            " MAX(chunk_version)) FROM store_versions"
            " {where} GROUP BY conversation_id HAVING COUNT(*) > 1"
        )
        if not conversation_ids:
            return {str(r[0]): int(r[1]) for r in self.sql.rows(sql.format(where=""))}
        out: dict[str, int] = {}
        for part in chunked(list(conversation_ids)):
            where = f"WHERE conversation_id IN ({marks(len(part))})"
            out.update({str(r[0]): int(r[1]) for r in self.sql.rows(sql.format(where=where), part)})
        return out

    # -- the index queue's rows (written in the same transaction as the log) ---------------
    def queued_version(self, conversation_id: str) -> int | None:
        return queue.queued_version(self.sql, conversation_id)

    def enqueue(
        self, conversation_id: str, dirty: int, chunk_version: int, reindex: bool = False
    ) -> None:
        queue.enqueue(self.sql, conversation_id, dirty, chunk_version, reindex)

    def stop_reindex(self, conversation_id: str, version: int) -> None:
        queue.stop_reindex(self.sql, conversation_id, version)

    def advance_indexed(self, conversation_id: str) -> None:
        queue.advance_indexed(self.sql, conversation_id)


class SqlEventLog:
    """memsvc.ports.EventLog on a `Database` (SQLite file, or a server database)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    @contextmanager
    def snapshot(self) -> Iterator[SqlLog]:
        with self.database.snapshot() as sql:
            yield SqlLog(sql)

    @contextmanager
    def transaction(self) -> Iterator[SqlLog]:
        with self.database.transaction() as sql:
            yield SqlLog(sql)

    def close(self) -> None:
        self.database.close()
