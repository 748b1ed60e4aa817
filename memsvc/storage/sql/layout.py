"""Layout queries of the log (mixed into memsvc.storage.sql.eventlog.SqlLog).

- layout: per conversation and chunk_version, the chunks the last plan holds. Rows of
  chunks that covered a deleted turn stay, deleted = 1, until purged. A row is `indexed`
  once the vector store holds its text.
- chunk_history: every chunk id a conversation ever had, with its turn range, so a delete
  by chunk id works for any id a search ever returned (superseded tails included).
- chunk_texts: the text hash of every chunk ever rendered (and of every other text
  embedded for a chunk: a turn's head and gist), with its turn range, so a purge can
  remove every cached vector derived from a purged turn.
- superseded: tail chunks replaced by a later plan; removed from the vector store on the
  next write of that conversation (pending = 1 until then), and refused if upserted again.
- erasures: text hashes whose cached vectors a purge must still forget.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from memsvc.domain.records import LayoutRow
from memsvc.ports import Span
from memsvc.storage.sql.connection import Row, Sql, chunked, marks
from memsvc.storage.sql.work import prefix_match

# Below every turn id (ids are non-negative): "from the first turn".
NO_TURN = -1

_LAYOUT_COLS = (
    "chunk_id, conversation_id, chunk_version, start_turn, end_turn, source_hash, text_hash,"
    " deleted, indexed, content_hash, standing"
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
        standing=bool(r[10]),
    )


class LayoutQueries:
    sql: Sql

    # -- reads ------------------------------------------------------------------------------
    def layout(
        self, conversation_id: str, version: int, from_turn: int | None = None
    ) -> dict[str, LayoutRow]:
        rows = self.sql.rows(
            f"SELECT {_LAYOUT_COLS} FROM layout WHERE conversation_id = ? AND chunk_version = ?"
            " AND start_turn >= ?",
            (conversation_id, version, NO_TURN if from_turn is None else from_turn),
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

    def may_hold_standing(self, conversation_ids: Sequence[str] = ()) -> bool:
        if not conversation_ids:
            return self.sql.one("SELECT 1 FROM layout WHERE standing = 1 LIMIT 1") is not None
        return any(
            self.sql.one(
                "SELECT 1 FROM layout WHERE standing = 1"
                f" AND conversation_id IN ({marks(len(part))}) LIMIT 1",
                tuple(part),
            )
            is not None
            for part in chunked(conversation_ids)
        )

    def standing_conversations(self, prefixes: Sequence[str], limit: int) -> list[str]:
        where, params = "standing = 1", list[str | int]()
        if prefixes:
            clause, params = prefix_match(prefixes)
            where += f" AND {clause}"
        rows = self.sql.rows(
            f"SELECT DISTINCT conversation_id FROM layout WHERE {where} LIMIT ?", (*params, limit)
        )
        return [str(r[0]) for r in rows]

    def layout_hashes(self, conversation_ids: Sequence[str], limit: int) -> list[tuple[str, str]]:
        rows = self.sql.rows(
            "SELECT chunk_id, content_hash FROM layout WHERE deleted = 0"
            f" AND conversation_id IN ({marks(len(conversation_ids))}) LIMIT ?",
            (*conversation_ids, limit),
        )
        return [(str(r[0]), str(r[1])) for r in rows]

    def layout_versions(self, conversation_id: str) -> list[int]:
        rows = self.sql.rows(
            "SELECT DISTINCT chunk_version FROM layout WHERE conversation_id = ? ORDER BY 1",
            (conversation_id,),
        )
        return [int(r[0]) for r in rows]

    def first_unindexed_turn(self, conversation_id: str, version: int) -> int | None:
        """The first turn of a live layout row of this version not yet in the store."""
        return self._first_live_start(conversation_id, version, "indexed = 0")

    def first_turn_to_render(self, conversation_id: str, version: int) -> int | None:
        # Two lookups, one per partial index (layout_unstored, layout_unhashed): an OR of
        # both conditions would scan every row of the conversation.
        starts = [
            self._first_live_start(conversation_id, version, condition)
            for condition in ("indexed = 0", "content_hash = ''")
        ]
        return min((s for s in starts if s is not None), default=None)

    def _first_live_start(self, conversation_id: str, version: int, condition: str) -> int | None:
        row = self.sql.one(
            "SELECT MIN(start_turn) FROM layout WHERE conversation_id = ? AND chunk_version = ?"
            f" AND deleted = 0 AND {condition}",
            (conversation_id, version),
        )
        return None if row is None or row[0] is None else int(row[0])

    def history_spans(self, conversation_id: str, chunk_ids: Sequence[str]) -> dict[str, Span]:
        out: dict[str, Span] = {}
        for part in chunked(list(chunk_ids)):
            for r in self.sql.rows(
                "SELECT chunk_id, start_turn, end_turn FROM chunk_history"
                f" WHERE conversation_id = ? AND chunk_id IN ({marks(len(part))})",
                (conversation_id, *part),
            ):
                out[str(r[0])] = (int(r[1]), int(r[2]))
        return out

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

    def waiting_superseded(self, chunk_ids: Sequence[str]) -> set[str]:
        """Those of the ids that are superseded tails not yet removed from the store."""
        out: set[str] = set()
        for part in chunked(list(chunk_ids)):
            out.update(
                str(r[0])
                for r in self.sql.rows(
                    "SELECT chunk_id FROM superseded WHERE pending = 1"
                    f" AND chunk_id IN ({marks(len(part))})",
                    part,
                )
            )
        return out

    def pending_superseded(self, conversation_id: str) -> list[str]:
        rows = self.sql.rows(
            "SELECT chunk_id FROM superseded WHERE conversation_id = ? AND pending = 1",
            (conversation_id,),
        )
        return [str(r[0]) for r in rows]

    def layout_digests(
        self, conversation_ids: Sequence[str] | None = None
    ) -> dict[str, tuple[str, str, bool, bool]]:
        cols = "SELECT chunk_id, conversation_id, content_hash, deleted, indexed FROM layout"
        if conversation_ids is None:
            rows = self.sql.rows(cols)
        else:
            rows = [
                r
                for part in chunked(conversation_ids)
                for r in self.sql.rows(
                    f"{cols} WHERE conversation_id IN ({marks(len(part))})", tuple(part)
                )
            ]
        return {str(r[0]): (str(r[1]), str(r[2]), bool(r[3]), bool(r[4])) for r in rows}

    def all_waiting_superseded(self) -> set[str]:
        return {
            str(r[0]) for r in self.sql.rows("SELECT chunk_id FROM superseded WHERE pending = 1")
        }

    def erasures(self) -> list[str]:
        return [str(r[0]) for r in self.sql.rows("SELECT text_hash FROM erasures")]

    # -- writes -----------------------------------------------------------------------------
    def put_layout(self, rows: Iterable[LayoutRow]) -> None:
        rows = list(rows)
        self.sql.many(
            f"INSERT INTO layout ({_LAYOUT_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT (chunk_id) DO UPDATE SET conversation_id = excluded.conversation_id,"
            " chunk_version = excluded.chunk_version, start_turn = excluded.start_turn,"
            " end_turn = excluded.end_turn, source_hash = excluded.source_hash,"
            " text_hash = excluded.text_hash, deleted = excluded.deleted,"
            " indexed = excluded.indexed, content_hash = excluded.content_hash,"
            " standing = excluded.standing",
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
                    int(r.standing),
                )
                for r in rows
            ),
        )
        self.sql.many(
            "INSERT INTO chunk_texts (conversation_id, text_hash, start_turn, end_turn)"
            " VALUES (?,?,?,?) ON CONFLICT DO NOTHING",
            ((r.conversation_id, r.text_hash, r.start_turn, r.end_turn) for r in rows),
        )
        self.sql.many(
            "INSERT INTO chunk_history (chunk_id, conversation_id, chunk_version, start_turn,"
            " end_turn) VALUES (?,?,?,?,?) ON CONFLICT DO NOTHING",
            (
                (r.chunk_id, r.conversation_id, r.chunk_version, r.start_turn, r.end_turn)
                for r in rows
            ),
        )

    def record_texts(self, conversation_id: str, rows: Iterable[tuple[str, int, int]]) -> None:
        self.sql.many(
            "INSERT INTO chunk_texts (conversation_id, text_hash, start_turn, end_turn)"
            " VALUES (?,?,?,?) ON CONFLICT DO NOTHING",
            ((conversation_id, h, start, end) for h, start, end in rows),
        )

    def mark_indexed(self, pairs: Iterable[tuple[str, str]]) -> None:
        self.sql.many("UPDATE layout SET indexed = 1 WHERE chunk_id = ? AND text_hash = ?", pairs)

    def unmark_indexed(self, chunk_ids: Iterable[str]) -> None:
        self.sql.many("UPDATE layout SET indexed = 0 WHERE chunk_id = ?", ((c,) for c in chunk_ids))

    def reset_indexed(self, conversation_id: str, version: int) -> None:
        self.sql.run(
            "UPDATE layout SET indexed = 0 WHERE conversation_id = ? AND chunk_version = ?",
            (conversation_id, version),
        )

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

    def forget_store(self) -> None:
        self.sql.run("UPDATE layout SET indexed = 0")
        self.sql.run("DELETE FROM superseded")
        self.sql.run(
            "UPDATE conversations SET done_seq = 0, progress_seq = 0, last_indexed_turn = -1,"
            " active_planned_seq = 0, building_planned_seq = 0"
        )

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

    def add_erasures(self, text_hashes: Iterable[str]) -> None:
        self.sql.many(
            "INSERT INTO erasures (text_hash) VALUES (?) ON CONFLICT DO NOTHING",
            ((h,) for h in text_hashes),
        )

    def clear_erasures(self, text_hashes: Iterable[str]) -> None:
        self.sql.many("DELETE FROM erasures WHERE text_hash = ?", ((h,) for h in text_hashes))
