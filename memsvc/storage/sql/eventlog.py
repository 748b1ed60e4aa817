"""The event log: events and meta here; layout queries in memsvc.storage.sql.layout,
conversation rows (versions, durable projection work) in memsvc.storage.sql.work. One
`SqlLog` carries all of them for one snapshot or transaction (memsvc.ports.LogWriter).

- events: every turn received, raw and cleaned, with its token count, deleted flag, and
  the work sequence number of the change that last wrote it. A purged turn stays as a
  tombstone (deleted, purged, no text) so turn numbering continues.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import count

from memsvc.domain.chunking import StoredTurn
from memsvc.domain.records import EventRow
from memsvc.ports import Span
from memsvc.storage.sql.connection import Database, Row, Sql, chunked, marks
from memsvc.storage.sql.layout import NO_TURN, LayoutQueries
from memsvc.storage.sql.term_docs import TermQueries
from memsvc.storage.sql.work import WorkQueries

_EVENT_COLS = (
    "conversation_id, turn_id, speaker, speaker_name, text, clean_text, timestamp,"
    " participants, tokens, deleted, payload"
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
        payload=str(r[10]),
    )


class SqlLog(LayoutQueries, WorkQueries, TermQueries):
    """The log's queries on one snapshot or transaction (memsvc.ports.LogWriter)."""

    def __init__(self, sql: Sql) -> None:
        self.sql = sql
        self.term_changes = Counter()

    # -- meta ---------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self.sql.one("SELECT value FROM meta WHERE key = ?", (key,))
        return None if row is None else str(row[0])

    def meta_with_prefix(self, prefix: str) -> dict[str, str]:
        rows = self.sql.rows(
            "SELECT key, value FROM meta WHERE substr(key, 1, ?) = ?", (len(prefix), prefix)
        )
        return {str(r[0]): str(r[1]) for r in rows}

    def clock(self) -> float:
        row = self.sql.one(f"SELECT {self.sql.dialect.now}", ())
        assert row is not None
        return float(row[0])

    def claim_key(
        self, key: str, request_hash: str, expire_before: float
    ) -> tuple[str, str] | None:
        self.sql.run("DELETE FROM idempotency WHERE created < ?", (expire_before,))
        claimed = self.sql.run(
            "INSERT INTO idempotency (key, request_hash, answer, created)"
            f" VALUES (?, ?, '', {self.sql.dialect.now}) ON CONFLICT (key) DO NOTHING",
            (key, request_hash),
        )
        if claimed:
            return None
        row = self.sql.one("SELECT request_hash, answer FROM idempotency WHERE key = ?", (key,))
        assert row is not None  # it conflicted: another write committed it
        return str(row[0]), str(row[1])

    def answer_key(self, key: str, answer: str) -> None:
        self.sql.run("UPDATE idempotency SET answer = ? WHERE key = ?", (answer, key))

    def delete_meta(self, key: str) -> None:
        self.sql.run("DELETE FROM meta WHERE key = ?", (key,))

    def set_meta(self, key: str, value: str) -> None:
        self.sql.run(
            "INSERT INTO meta (key, value) VALUES (?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        kept = Counter(self.term_changes)
        try:
            with self.sql.savepoint(f"sp{next(_savepoints)}"):
                yield
        except BaseException:
            self.term_changes = kept  # rolled back with the rest
            raise

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

    def events_after(self, conversation_id: str, after_turn: int, limit: int) -> list[EventRow]:
        return [
            _event(r)
            for r in self.sql.rows(
                f"SELECT {_EVENT_COLS} FROM events WHERE conversation_id = ? AND turn_id > ?"
                " AND deleted = 0 ORDER BY turn_id LIMIT ?",
                (conversation_id, after_turn, limit),
            )
        ]

    def nth_newest_live_turn(self, conversation_id: str, n: int) -> int | None:
        row = self.sql.one(
            "SELECT turn_id FROM events WHERE conversation_id = ? AND deleted = 0"
            " ORDER BY turn_id DESC LIMIT 1 OFFSET ?",
            (conversation_id, n - 1),
        )
        return None if row is None else int(row[0])

    def seq_through(self, conversation_id: str, turn_id: int) -> int | None:
        if (
            self.sql.one(
                "SELECT 1 FROM events WHERE conversation_id = ? AND turn_id = ?",
                (conversation_id, turn_id),
            )
            is None
        ):
            return None
        # Newest seq first (events_seq): the turns after turn_id are few when it is recent.
        row = self.sql.one(
            "SELECT seq FROM events WHERE conversation_id = ? AND turn_id <= ?"
            " ORDER BY seq DESC LIMIT 1",
            (conversation_id, turn_id),
        )
        return None if row is None else int(row[0])

    def put_events(self, events: Iterable[EventRow], seq: int) -> None:
        by_conversation: dict[str, list[EventRow]] = {}
        for e in events:
            by_conversation.setdefault(e.conversation_id, []).append(e)
        for conv, rows in by_conversation.items():
            with self.counting_terms(conv, [(e.turn_id, e.turn_id) for e in rows]):
                self._put_events(rows, seq)

    def _put_events(self, events: Iterable[EventRow], seq: int) -> None:
        self.sql.many(
            f"INSERT INTO events ({_EVENT_COLS}, seq) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT (conversation_id, turn_id) DO UPDATE SET"
            " speaker = excluded.speaker, speaker_name = excluded.speaker_name,"
            " text = excluded.text, clean_text = excluded.clean_text,"
            " timestamp = excluded.timestamp, participants = excluded.participants,"
            " tokens = excluded.tokens, deleted = excluded.deleted, payload = excluded.payload,"
            " seq = excluded.seq",
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
                    e.payload,
                    seq,
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

    def live_turns(self, conversation_id: str, from_turn: int | None = None) -> list[StoredTurn]:
        rows = self.sql.rows(
            "SELECT turn_id, speaker, clean_text, timestamp, participants, speaker_name, tokens"
            " FROM events WHERE conversation_id = ? AND deleted = 0 AND clean_text != ''"
            " AND turn_id >= ? ORDER BY turn_id",
            (conversation_id, NO_TURN if from_turn is None else from_turn),
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

    def live_turn_before(self, conversation_id: str, turn_id: int, n: int) -> int | None:
        row = self.sql.one(
            "SELECT turn_id FROM events WHERE conversation_id = ? AND deleted = 0"
            " AND clean_text != '' AND turn_id < ? ORDER BY turn_id DESC LIMIT 1 OFFSET ?",
            (conversation_id, turn_id, n - 1),
        )
        return None if row is None else int(row[0])

    def first_turn_written_since(self, conversation_id: str, seq: int) -> int | None:
        row = self.sql.one(
            "SELECT MIN(turn_id) FROM events WHERE conversation_id = ? AND seq > ?",
            (conversation_id, seq),
        )
        return None if row is None or row[0] is None else int(row[0])

    def live_turn_count(self, conversation_id: str) -> int:
        row = self.sql.one(
            "SELECT COUNT(*) FROM events WHERE conversation_id = ? AND deleted = 0",
            (conversation_id,),
        )
        return int(row[0]) if row else 0

    def mark_events_deleted(
        self, conversation_id: str, spans: Sequence[Span] | None, seq: int
    ) -> int:
        with self.counting_terms(conversation_id, spans):
            if spans is None:
                return self.sql.run(
                    "UPDATE events SET deleted = 1, seq = ? WHERE conversation_id = ?"
                    " AND deleted = 0",
                    (seq, conversation_id),
                )
            return sum(
                self.sql.run(
                    "UPDATE events SET deleted = 1, seq = ? WHERE conversation_id = ?"
                    " AND deleted = 0 AND turn_id BETWEEN ? AND ?",
                    (seq, conversation_id, start, end),
                )
                for start, end in spans
            )

    def deleted_turn_ids(self, conversation_id: str, from_turn: int | None = None) -> list[int]:
        rows = self.sql.rows(
            "SELECT turn_id FROM events WHERE conversation_id = ? AND deleted = 1"
            " AND turn_id >= ? ORDER BY turn_id",
            (conversation_id, NO_TURN if from_turn is None else from_turn),
        )
        return [int(r[0]) for r in rows]

    def purge_events(self, conversation_id: str, seq: int) -> list[int]:
        turns = [
            int(r[0])
            for r in self.sql.rows(
                "SELECT turn_id FROM events WHERE conversation_id = ? AND deleted = 1"
                " AND purged = 0",
                (conversation_id,),
            )
        ]
        self.sql.run(
            "UPDATE events SET text = '', clean_text = '', speaker_name = '', payload = '',"
            " participants = '[]', tokens = 0, purged = 1, seq = ?"
            " WHERE conversation_id = ? AND deleted = 1 AND purged = 0",
            (seq, conversation_id),
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

    def holds_deleted(self, conversation_id: str) -> bool:
        return (
            self.sql.one(
                "SELECT 1 FROM events WHERE conversation_id = ? AND deleted = 1 AND purged = 0"
                " UNION ALL SELECT 1 FROM layout WHERE conversation_id = ? AND deleted = 1"
                " LIMIT 1",
                (conversation_id, conversation_id),
            )
            is not None
        )

    def event_texts(self) -> list[tuple[str, int, str]]:
        rows = self.sql.rows("SELECT conversation_id, turn_id, clean_text FROM events")
        return [(str(r[0]), int(r[1]), str(r[2])) for r in rows]

    def event_texts_after(
        self, conversation_id: str, turn_id: int, limit: int
    ) -> list[tuple[str, int, str, str]]:
        rows = self.sql.rows(
            "SELECT conversation_id, turn_id, text, clean_text FROM events"
            " WHERE conversation_id > ? OR (conversation_id = ? AND turn_id > ?)"
            " ORDER BY conversation_id, turn_id LIMIT ?",
            (conversation_id, conversation_id, turn_id, limit),
        )
        return [(str(r[0]), int(r[1]), str(r[2]), str(r[3])) for r in rows]

    def set_tokens(self, rows: Iterable[tuple[int, str, int]]) -> None:
        self.sql.many(
            "UPDATE events SET tokens = ? WHERE conversation_id = ? AND turn_id = ?", rows
        )
        # Layouts were planned from the old counts: the next replans plan them whole.
        self.sql.run("UPDATE conversations SET active_planned_seq = 0, building_planned_seq = 0")


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
            tx = SqlLog(sql)
            yield tx
            tx.write_term_counts()

    def erase(self) -> None:
        self.database.erase()

    def sync_lazily(self) -> None:
        self.database.sync_lazily()

    def ping(self) -> bool:
        return self.database.ping()

    def close(self) -> None:
        self.database.close()
