"""The index_queue table: per conversation, what the background worker has to do.

A row is `pending` (work waiting, `dirty` turns not yet indexed), `indexing` (leased until
`lease_until`), `idle`, or `failed` (after too many attempts, with the last error). Work is
added in the same transaction as the log change that needs it (`enqueue`, called through
the log's transaction object); the worker's own steps (lease, complete, fail, release)
each run in one transaction here.
"""

from __future__ import annotations

from collections.abc import Sequence

from memsvc.domain.records import QueueGauges, QueueItem
from memsvc.storage.sql.connection import Database, Row, Sql, chunked, marks

_COLS = (
    "q.conversation_id, q.state, q.chunk_version, q.dirty, q.attempts, q.last_error,"
    " q.last_indexed_turn, q.reindex,"
    " (SELECT MAX(turn_id) FROM events e WHERE e.conversation_id = q.conversation_id)"
)


def _item(r: Row) -> QueueItem:
    return QueueItem(
        conversation_id=str(r[0]),
        state=str(r[1]),
        chunk_version=int(r[2]),
        dirty=int(r[3]),
        attempts=int(r[4]),
        last_error=str(r[5]),
        last_indexed_turn=int(r[6]),
        reindex=bool(r[7]),
        last_appended_turn=-1 if r[8] is None else int(r[8]),
    )


# -- inside a log transaction -------------------------------------------------------------
def enqueue(sql: Sql, conversation_id: str, dirty: int, chunk_version: int, reindex: bool) -> None:
    now = sql.dialect.now
    sql.run(
        "INSERT INTO index_queue"
        " (conversation_id, state, chunk_version, dirty, reindex, pending_since)"
        f" VALUES (?, 'pending', ?, ?, ?, {now})"
        " ON CONFLICT (conversation_id) DO UPDATE SET"
        "  dirty = index_queue.dirty + excluded.dirty,"
        "  state = CASE WHEN index_queue.state = 'indexing' THEN 'indexing' ELSE 'pending' END,"
        "  chunk_version = CASE WHEN excluded.reindex = 1 THEN excluded.chunk_version"
        "                  ELSE index_queue.chunk_version END,"
        "  reindex = CASE WHEN excluded.reindex = 1 THEN 1 ELSE index_queue.reindex END,"
        "  attempts = 0, next_attempt_at = 0,"
        "  pending_since = CASE WHEN index_queue.pending_since = 0 THEN excluded.pending_since"
        "                  ELSE index_queue.pending_since END",
        (conversation_id, chunk_version, dirty, int(reindex)),
    )


def stop_reindex(sql: Sql, conversation_id: str, version: int) -> None:
    """Back to indexing `version` incrementally (turns appended meanwhile still get
    indexed there)."""
    sql.run(
        "UPDATE index_queue SET reindex = 0, chunk_version = ?, attempts = 0,"
        " state = CASE WHEN state = 'failed' THEN 'pending' ELSE state END"
        " WHERE conversation_id = ?",
        (version, conversation_id),
    )


def advance_indexed(sql: Sql, conversation_id: str) -> None:
    """Chunks were stored outside the worker (a caller's Build + Upsert): move
    last_indexed_turn up to the first turn of the queued version still unindexed, so
    WaitForIndexed sees read-your-writes on mixed synchronous/asynchronous use."""
    row = sql.one(
        f"SELECT chunk_version, last_indexed_turn FROM index_queue WHERE conversation_id = ?"
        f"{sql.dialect.for_update}",
        (conversation_id,),
    )
    if row is None:
        return
    version, current = int(row[0]), int(row[1])
    unindexed = sql.one(
        "SELECT MIN(start_turn) - 1 FROM layout WHERE conversation_id = ?"
        " AND chunk_version = ? AND deleted = 0 AND indexed = 0",
        (conversation_id, version),
    )
    if unindexed is not None and unindexed[0] is not None:
        through = int(unindexed[0])
    else:
        last = sql.one(
            "SELECT MAX(end_turn) FROM layout WHERE conversation_id = ? AND chunk_version = ?",
            (conversation_id, version),
        )
        through = int(last[0]) if last is not None and last[0] is not None else -1
    if through > current:
        sql.run(
            "UPDATE index_queue SET last_indexed_turn = ? WHERE conversation_id = ?",
            (through, conversation_id),
        )


def queued_version(sql: Sql, conversation_id: str) -> int | None:
    row = sql.one(
        "SELECT chunk_version FROM index_queue WHERE conversation_id = ?", (conversation_id,)
    )
    return None if row is None else int(row[0])


# -- the worker's own steps -----------------------------------------------------------------
class SqlIndexQueue:
    """memsvc.ports.IndexQueue on the log's database."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def release_stale_leases(self) -> int:
        """Every lease back to pending: for a log only this process writes (one process per
        data dir), a lease found at start-up was held by a process that is gone."""
        with self.database.transaction() as sql:
            return sql.run(
                "UPDATE index_queue SET state = 'pending', lease_until = 0 WHERE state = 'indexing'"
            )

    def release(self, conversation_id: str) -> None:
        with self.database.transaction() as sql:
            sql.run(
                "UPDATE index_queue SET state = 'pending', lease_until = 0, leased_dirty = 0"
                " WHERE conversation_id = ? AND state = 'indexing'",
                (conversation_id,),
            )

    def lease(self, now: float, lease_s: float, limit: int) -> list[QueueItem]:
        with self.database.transaction() as sql:
            rows = sql.rows(
                f"SELECT {_COLS} FROM index_queue q WHERE"
                " (q.state = 'pending' AND q.next_attempt_at <= ?)"
                " OR (q.state = 'indexing' AND q.lease_until < ?)"
                f" ORDER BY q.next_attempt_at, q.conversation_id LIMIT ?{sql.dialect.skip_locked}",
                (now, now, limit),
            )
            sql.many(
                "UPDATE index_queue SET state = 'indexing', lease_until = ?,"
                " leased_dirty = dirty WHERE conversation_id = ?",
                ((now + lease_s, r[0]) for r in rows),
            )
        return [_item(r) for r in rows]

    def complete(self, conversation_id: str, indexed_turn: int, again: bool = False) -> None:
        """The leased work is stored through `indexed_turn`. `again`: more remains (a
        bounded step, or the layout moved on meanwhile): pending again, a reindex stays one."""
        more = int(again)
        with self.database.transaction() as sql:
            sql.run(
                "UPDATE index_queue SET"
                " dirty = CASE WHEN dirty > leased_dirty THEN dirty - leased_dirty ELSE 0 END + ?,"
                " state = CASE WHEN dirty - leased_dirty + ? > 0 THEN 'pending' ELSE 'idle' END,"
                " pending_since = CASE WHEN dirty - leased_dirty + ? > 0 THEN pending_since"
                "  ELSE 0 END,"
                " reindex = CASE WHEN ? = 1 THEN reindex ELSE 0 END,"
                " last_indexed_turn = CASE WHEN last_indexed_turn > ? THEN last_indexed_turn"
                "  ELSE ? END,"
                " leased_dirty = 0, attempts = 0, last_error = '', lease_until = 0"
                " WHERE conversation_id = ?",
                (more, more, more, more, indexed_turn, indexed_turn, conversation_id),
            )

    def fail(
        self, conversation_id: str, error: str, now: float, max_attempts: int, backoff_s: float
    ) -> None:
        with self.database.transaction() as sql:
            row = sql.one(
                "SELECT attempts FROM index_queue WHERE conversation_id = ?"
                + sql.dialect.for_update,
                (conversation_id,),
            )
            attempts = (int(row[0]) if row else 0) + 1
            sql.run(
                "UPDATE index_queue SET attempts = ?, last_error = ?, lease_until = 0,"
                " leased_dirty = 0, state = ?, next_attempt_at = ? WHERE conversation_id = ?",
                (
                    attempts,
                    error[:2000],
                    "failed" if attempts >= max_attempts else "pending",
                    now + backoff_s * 2 ** (attempts - 1),
                    conversation_id,
                ),
            )

    def status(self, conversation_ids: Sequence[str] = ()) -> list[QueueItem]:
        with self.database.snapshot() as sql:
            if not conversation_ids:
                rows = sql.rows(f"SELECT {_COLS} FROM index_queue q ORDER BY q.conversation_id")
                return [_item(r) for r in rows]
            items: list[QueueItem] = []
            for part in chunked(list(conversation_ids)):
                items += [
                    _item(r)
                    for r in sql.rows(
                        f"SELECT {_COLS} FROM index_queue q"
                        f" WHERE q.conversation_id IN ({marks(len(part))})",
                        part,
                    )
                ]
        return sorted(items, key=lambda i: i.conversation_id)

    def gauges(self) -> QueueGauges:
        """Totals for monitoring, in one query."""
        with self.database.snapshot() as sql:
            rows = sql.rows(
                "SELECT state, COUNT(*), SUM(dirty), MIN(CASE WHEN pending_since > 0"
                " THEN pending_since END) FROM index_queue GROUP BY state"
            )
        oldest = [float(r[3]) for r in rows if r[3] is not None and r[0] != "idle"]
        return QueueGauges(
            backlog=sum(int(r[2] or 0) for r in rows),
            by_state={str(r[0]): int(r[1]) for r in rows},
            oldest_pending_since=min(oldest) if oldest else None,
        )
