"""Conversation rows in log transactions (mixed into memsvc.storage.sql.eventlog.SqlLog):
the active and building versions, and the durable projection work every log change
records in the same transaction (memsvc.domain.records.Conversation explains the fields).
The worker's own steps on these rows (lease, complete, ...) are in memsvc.storage.sql.queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from memsvc.domain.records import Conversation
from memsvc.observability import tracing
from memsvc.storage.sql.connection import Row, Sql, chunked, marks

# conversations.trace_links keeps the newest few (a traceparent and a space: 56 characters)
TRACE_LINKS_CHARS = 8 * 56
# A conversation whose last reconcile (a rebuild into a new store) is not yet done.
_UNRECONCILED = "reconcile_seq > reconciled_seq OR reconcile_seq > done_seq"

CONV_COLS = (
    "conversation_id, active_version, building_version, work_seq, done_seq, reconcile_seq,"
    " reconciled_seq, active_planned_seq, building_planned_seq, progress_seq,"
    " last_indexed_turn"
)


def conversation_of(r: Row) -> Conversation:
    return Conversation(str(r[0]), *(int(v) for v in r[1:11]))


def prefix_match(prefixes: Sequence[str]) -> tuple[str, list[str | int]]:
    """A WHERE clause keeping conversation ids that start with one of `prefixes` (exact:
    no wildcard or collation is involved), and its parameters."""
    clause = " OR ".join("substr(conversation_id, 1, ?) = ?" for _ in prefixes)
    params: list[str | int] = []
    for p in prefixes:
        params += [len(p), p]
    return f"({clause})", params


class WorkQueries:
    sql: Sql

    # -- reads ------------------------------------------------------------------------------
    def conversation(self, conversation_id: str) -> Conversation | None:
        row = self.sql.one(
            f"SELECT {CONV_COLS} FROM conversations WHERE conversation_id = ?", (conversation_id,)
        )
        return None if row is None else conversation_of(row)

    def conversation_ids(self, prefixes: Sequence[str] = ()) -> list[str]:
        """Every conversation with a row, or those under the prefixes, sorted."""
        if not prefixes:
            rows = self.sql.rows("SELECT conversation_id FROM conversations ORDER BY 1")
        else:
            clause, params = prefix_match(prefixes)
            rows = self.sql.rows(
                f"SELECT conversation_id FROM conversations WHERE {clause} ORDER BY 1", params
            )
        return [str(r[0]) for r in rows]

    def unreconciled(self, conversation_ids: Sequence[str] = ()) -> list[str]:
        """Of the conversations named (none: every one), those whose last reconcile (a
        rebuild into a new store: memsvc.services.model_move) is not yet done, sorted."""
        if not conversation_ids:
            rows = self.sql.rows(
                f"SELECT conversation_id FROM conversations WHERE {_UNRECONCILED} ORDER BY 1"
            )
            return [str(r[0]) for r in rows]
        out: list[str] = []
        for part in chunked(list(dict.fromkeys(conversation_ids))):
            rows = self.sql.rows(
                "SELECT conversation_id FROM conversations"
                f" WHERE conversation_id IN ({marks(len(part))}) AND ({_UNRECONCILED})",
                tuple(part),
            )
            out.extend(str(r[0]) for r in rows)
        return sorted(out)

    def reconcile_counts(self) -> tuple[int, int]:
        """(conversations, of them not yet reconciled): a rebuild's progress."""
        row = self.sql.one(
            f"SELECT COUNT(*), COALESCE(SUM(CASE WHEN {_UNRECONCILED} THEN 1 ELSE 0 END), 0)"
            " FROM conversations"
        )
        return (0, 0) if row is None else (int(row[0]), int(row[1]))

    def active_versions_of_multi(
        self, conversation_ids: Sequence[str] = ()
    ) -> dict[int, list[str]]:
        """For conversations with chunks of several versions in the layout: conversation
        ids by the version searches read (only stores without a `current` mark need it)."""
        sql = (
            "SELECT c.active_version, c.conversation_id FROM conversations c"
            " WHERE c.conversation_id IN (SELECT conversation_id FROM layout"
            " GROUP BY conversation_id HAVING COUNT(DISTINCT chunk_version) > 1){scope}"
        )
        rows: list[Row] = []
        if not conversation_ids:
            rows = self.sql.rows(sql.format(scope=""))
        for part in chunked(list(conversation_ids)):
            scope = f" AND c.conversation_id IN ({marks(len(part))})"
            rows += self.sql.rows(sql.format(scope=scope), part)
        out: dict[int, list[str]] = {}
        for version, conv in rows:
            out.setdefault(int(version), []).append(str(conv))
        return {v: sorted(c) for v, c in out.items()}

    # -- writes -----------------------------------------------------------------------------
    def open_conversation(self, conversation_id: str, version: int) -> Conversation:
        """The conversation's row, created with `version` active if it has none; locked
        for this transaction where the database locks rows."""
        self.sql.run(
            "INSERT INTO conversations (conversation_id, active_version) VALUES (?, ?)"
            " ON CONFLICT DO NOTHING",
            (conversation_id, version),
        )
        row = self.sql.one(
            f"SELECT {CONV_COLS} FROM conversations WHERE conversation_id = ?"
            + self.sql.dialect.for_update,
            (conversation_id,),
        )
        assert row is not None
        return conversation_of(row)

    def record_change(
        self,
        conversation_id: str,
        *,
        turns: int = 0,
        reconcile: bool = False,
        delay_s: float = 0.0,
    ) -> int:
        """New projection work for a conversation (the row must exist); returns its
        sequence number, which the events written with it carry. A failed conversation is
        retried from scratch; `delay_s` lets a caller that builds synchronously upsert
        first before the worker takes the work over."""
        now = self.sql.dialect.now
        # Due at 0 (at once, whatever the clock), or `delay_s` from now; work already due
        # earlier stays due (an append is not held back by a build's grace).
        due = f"CASE WHEN ? > 0 THEN {now} + ? ELSE 0 END"
        row = self.sql.one(
            "UPDATE conversations SET work_seq = work_seq + 1,"
            " reconcile_seq = CASE WHEN ? = 1 THEN work_seq + 1 ELSE reconcile_seq END,"
            " next_attempt_at = CASE WHEN state = 'indexing' THEN next_attempt_at"
            f"  WHEN state = 'pending' AND attempts = 0 AND next_attempt_at < {due}"
            f"   THEN next_attempt_at ELSE {due} END,"
            " state = CASE WHEN state = 'indexing' THEN 'indexing' ELSE 'pending' END,"
            " attempts = 0, dirty = dirty + ?,"
            f" pending_since = CASE WHEN pending_since = 0 THEN {now} ELSE pending_since END,"
            f" trace_links = substr(? || trace_links, 1, {TRACE_LINKS_CHARS})"
            " WHERE conversation_id = ? RETURNING work_seq",
            (
                *(int(reconcile), delay_s, delay_s, delay_s, delay_s, turns),
                f"{traced} " if (traced := tracing.traceparent()) else "",
                conversation_id,
            ),
        )
        assert row is not None, conversation_id
        return int(row[0])

    def set_planned(self, conversation_id: str, version: int, seq: int) -> None:
        """The layout of `version` now reflects the log through `seq`."""
        self.sql.run(
            "UPDATE conversations SET"
            " active_planned_seq = CASE WHEN active_version = ? THEN ? ELSE active_planned_seq"
            "  END,"
            " building_planned_seq = CASE WHEN building_version = ? THEN ?"
            "  ELSE building_planned_seq END"
            " WHERE conversation_id = ?",
            (version, seq, version, seq, conversation_id),
        )

    def start_building(self, conversation_id: str, version: int) -> None:
        self.sql.run(
            "UPDATE conversations SET building_version = ?, building_planned_seq = 0"
            " WHERE conversation_id = ?",
            (version, conversation_id),
        )

    def stop_building(self, conversation_id: str) -> None:
        self.sql.run(
            "UPDATE conversations SET building_version = 0, building_planned_seq = 0"
            " WHERE conversation_id = ?",
            (conversation_id,),
        )

    def switch_version(self, conversation_id: str) -> None:
        """The building version is complete: searches and new turns use it from now on."""
        self.sql.run(
            "UPDATE conversations SET active_version = building_version,"
            " active_planned_seq = building_planned_seq, building_version = 0,"
            " building_planned_seq = 0 WHERE conversation_id = ? AND building_version != 0",
            (conversation_id,),
        )

    def settle(
        self,
        conversation_id: str,
        *,
        done_seq: int,
        reconciled_seq: int,
        progress_seq: int,
        last_indexed_turn: int,
    ) -> Conversation:
        """Record how far the store reflects the log (never backwards), the backlog of turns
        still to be findable, and the state: idle once nothing is left to do."""
        row = self.sql.one(
            "SELECT work_seq, done_seq, reconcile_seq, reconciled_seq, building_version, state,"
            f" pending_since, {self.sql.dialect.now}"
            " FROM conversations WHERE conversation_id = ?" + self.sql.dialect.for_update,
            (conversation_id,),
        )
        assert row is not None
        work, done, reconcile, reconciled, building, state, since, now = row
        done = max(int(done), done_seq)
        reconciled = max(int(reconciled), reconciled_seq)
        if done >= int(work):
            progress_seq, last_indexed_turn = done, self._last_turn(conversation_id)
        backlog = self.sql.one(
            "SELECT COUNT(*) FROM events WHERE conversation_id = ? AND seq > ?"
            " AND NOT (seq <= ? AND turn_id <= ?)",
            (conversation_id, done, progress_seq, last_indexed_turn),
        )
        finished = done >= int(work) and int(building) == 0 and int(reconcile) <= reconciled
        if state == "indexing":
            new_state = "indexing"
        elif finished:
            new_state = "idle"
        else:
            new_state = "failed" if state == "failed" else "pending"
        self.sql.run(
            "UPDATE conversations SET done_seq = ?, reconciled_seq = ?, progress_seq = ?,"
            " last_indexed_turn = ?, dirty = ?, state = ?,"
            " attempts = CASE WHEN ? = 'idle' THEN 0 ELSE attempts END,"
            " last_error = CASE WHEN ? = 'idle' THEN '' ELSE last_error END,"
            " pending_since = CASE WHEN ? = 'idle' THEN 0 ELSE pending_since END,"
            # settled by the calls themselves (no step to link them): forgotten
            " trace_links = CASE WHEN ? = 'idle' THEN '' ELSE trace_links END"
            " WHERE conversation_id = ?",
            (
                done,
                reconciled,
                progress_seq,
                last_indexed_turn,
                int(backlog[0]) if backlog else 0,
                *(new_state,) * 5,
                conversation_id,
            ),
        )
        conv = self.conversation(conversation_id)
        assert conv is not None
        if new_state == "idle" and state != "idle" and float(since or 0) > 0:
            # the oldest accepted turn's wait until searchable (the index-lag SLO)
            conv = replace(conv, searchable_after_s=max(0.0, float(now) - float(since)))
        return conv

    def _last_turn(self, conversation_id: str) -> int:
        row = self.sql.one(
            "SELECT MAX(turn_id) FROM events WHERE conversation_id = ?", (conversation_id,)
        )
        return -1 if row is None or row[0] is None else int(row[0])

    def forget_conversation(self, conversation_id: str) -> None:
        """Drops the row of a conversation that has no events (nothing left to project)."""
        self.sql.run(
            "DELETE FROM conversations WHERE conversation_id = ? AND NOT EXISTS"
            " (SELECT 1 FROM events e WHERE e.conversation_id = conversations.conversation_id)",
            (conversation_id,),
        )
