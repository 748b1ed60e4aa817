"""The index queue: the worker's own steps on the conversations table.

A conversation is `pending` (work waiting), `indexing` (leased until `lease_until` by
`lease_owner` with `lease_token`), `idle`, or `failed` (after too many attempts, with the
last error). Work is recorded in the same transaction as the log change that needs it
(memsvc.storage.sql.work); here a worker leases it, renews the lease while a step runs,
and completes, fails or releases it. Every step after the lease names the token it got:
a worker whose lease expired and was taken by another cannot complete work it no longer
owns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from memsvc.domain.records import QueueGauges, QueueItem
from memsvc.observability import metrics, tracing
from memsvc.storage.sql.connection import Database, Row, Sql, chunked, marks
from memsvc.storage.sql.eventlog import SqlLog
from memsvc.storage.sql.work import TRACE_LINKS_CHARS, prefix_match

# The states of conversations with work: few at any time, whatever the number held.
_AT_WORK = ("pending", "indexing", "failed")

_COLS = (
    "q.conversation_id, q.state, q.active_version, q.building_version, q.dirty, q.attempts,"
    " q.last_error, q.last_indexed_turn,"
    " (SELECT MAX(turn_id) FROM events e WHERE e.conversation_id = q.conversation_id),"
    " q.lease_token, q.leased_seq, q.reconcile_seq > q.reconciled_seq,"
    " (SELECT e.timestamp FROM events e WHERE e.conversation_id = q.conversation_id"
    "  ORDER BY e.turn_id DESC LIMIT 1)"
)


def _item(r: Row) -> QueueItem:
    return QueueItem(
        conversation_id=str(r[0]),
        state=str(r[1]),
        active_version=int(r[2]),
        building_version=int(r[3]),
        dirty=int(r[4]),
        attempts=int(r[5]),
        last_error=str(r[6]),
        last_indexed_turn=int(r[7]),
        last_appended_turn=-1 if r[8] is None else int(r[8]),
        lease_token=int(r[9]),
        leased_seq=int(r[10]),
        needs_reconcile=bool(r[11]),
        last_timestamp="" if r[12] is None else str(r[12]),
    )


# A lease handed back (released, or failed for a retry) returns the links it took: the
# step that does the work later links the calls that queued it. They are older than any
# recorded since, so they go after them, and a full column drops them first.
_RESTORE_LINKS = f"trace_links = substr(trace_links || ?, 1, {TRACE_LINKS_CHARS})"


def _links_of(item: QueueItem) -> str:
    return "".join(f"{link} " for link in item.trace_links)


def _now(sql: Sql, now: float | None) -> tuple[str, list[float]]:
    """The clock of a comparison: the caller's, or the database's (one clock for every
    process sharing the log)."""
    return ("?", [now]) if now is not None else (sql.dialect.now, [])


# In the meta table: "1" while indexing is paused (SetIndexingPaused), for every process.
PAUSED_KEY = "indexing_paused"


class SqlIndexQueue:
    """memsvc.ports.IndexQueue on the log's database."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def paused(self) -> bool:
        with self.database.snapshot() as sql:
            return SqlLog(sql).get_meta(PAUSED_KEY) == "1"

    def set_paused(self, paused: bool) -> None:
        with self.database.transaction() as sql:
            SqlLog(sql).set_meta(PAUSED_KEY, "1" if paused else "0")

    def _paused_in(self, sql: Sql) -> bool:
        """The pause flag, held as read until the lease commits: a pause waits for a lease
        in progress (and then sees it leased), a lease after a pause sees the pause. The
        row is made once if missing, so there is always a row to hold."""
        query = f"SELECT value FROM meta WHERE key = ?{sql.dialect.for_share}"
        row = sql.one(query, (PAUSED_KEY,))
        if row is None:
            sql.run(
                "INSERT INTO meta (key, value) VALUES (?, '0') ON CONFLICT (key) DO NOTHING",
                (PAUSED_KEY,),
            )
            row = sql.one(query, (PAUSED_KEY,))
        return row is not None and str(row[0]) == "1"

    def lease(
        self, now: float | None, lease_s: float, limit: int, owner: str = ""
    ) -> list[QueueItem]:
        """Up to `limit` conversations whose work is due, or whose lease ran out; none while
        indexing is paused."""
        with self.database.transaction() as sql:
            if self._paused_in(sql):
                return []
            clock, at = _now(sql, now)
            rows = sql.rows(
                "SELECT q.conversation_id, q.trace_links FROM conversations q WHERE"
                f" (q.state = 'pending' AND q.next_attempt_at <= {clock})"
                f" OR (q.state = 'indexing' AND q.lease_until < {clock})"
                f" ORDER BY q.next_attempt_at, q.conversation_id LIMIT ?{sql.dialect.skip_locked}",
                (*at, *at, limit),
            )
            links = {str(r[0]): tuple(str(r[1]).split()) for r in rows}
            sql.many(
                "UPDATE conversations SET state = 'indexing', lease_owner = ?,"
                f" lease_token = lease_token + 1, lease_until = {clock} + ?,"
                " leased_seq = work_seq, trace_links = '' WHERE conversation_id = ?",
                ((owner, *at, lease_s, c) for c in links),
            )
            items = self._items(sql, list(links))
            return [replace(i, trace_links=links[i.conversation_id]) for i in items]

    def renew(self, items: Sequence[QueueItem], lease_s: float, now: float | None = None) -> int:
        """Extend leases still held (a heartbeat during a long step); returns how many."""
        with self.database.transaction() as sql:
            clock, at = _now(sql, now)
            return sum(
                sql.run(
                    f"UPDATE conversations SET lease_until = {clock} + ?"
                    " WHERE conversation_id = ? AND lease_token = ? AND state = 'indexing'",
                    (*at, lease_s, i.conversation_id, i.lease_token),
                )
                for i in items
            )

    def complete(
        self, item: QueueItem, retry_in_s: float = 0.0, now: float | None = None
    ) -> str | None:
        """The leased step is over; pending again if work remains (due in `retry_in_s`).
        Returns the new state, None when the lease was no longer held (another worker owns
        the work now)."""
        with self.database.transaction() as sql:
            clock, at = _now(sql, now)
            changed = sql.run(
                "UPDATE conversations SET"
                " state = CASE WHEN work_seq > done_seq OR building_version != 0"
                "  OR reconcile_seq > reconciled_seq THEN 'pending' ELSE 'idle' END,"
                f" lease_owner = '', lease_until = 0, next_attempt_at = {clock} + ?"
                " WHERE conversation_id = ? AND lease_token = ? AND state = 'indexing'",
                (*at, retry_in_s, item.conversation_id, item.lease_token),
            )
            if not changed:
                return None
            row = sql.one(
                f"SELECT state, pending_since, {clock}, trace_links FROM conversations"
                " WHERE conversation_id = ?",
                (*at, item.conversation_id),
            )
            # Idle: this step also did the work queued after its lease (it planned from
            # the log as it found it), so it links those calls too.
            sql.run(
                "UPDATE conversations SET attempts = 0, last_error = '',"
                " pending_since = CASE WHEN state = 'idle' THEN 0 ELSE pending_since END,"
                " trace_links = CASE WHEN state = 'idle' THEN '' ELSE trace_links END"
                " WHERE conversation_id = ?",
                (item.conversation_id,),
            )
        if row is None:
            return None
        state, since, clock_now = str(row[0]), float(row[1] or 0), float(row[2])
        if state == "idle":
            tracing.link(str(row[3]).split())
        if state == "idle" and since > 0:
            # A step that settles its conversation inside the lease goes indexing -> idle
            # here, not in settle: its oldest turn's wait until searchable is observed here.
            metrics.INDEX_LAG.observe(max(0.0, clock_now - since))
        return state

    def fail(
        self,
        item: QueueItem,
        error: str,
        max_attempts: int,
        backoff_s: float,
        now: float | None = None,
    ) -> None:
        """An attempt failed: retried after an exponential back-off, `failed` after
        `max_attempts` (until new work re-queues it)."""
        with self.database.transaction() as sql:
            row = sql.one(
                "SELECT attempts FROM conversations WHERE conversation_id = ?"
                " AND lease_token = ? AND state = 'indexing'" + sql.dialect.for_update,
                (item.conversation_id, item.lease_token),
            )
            if row is None:
                return
            attempts = int(row[0]) + 1
            clock, at = _now(sql, now)
            sql.run(
                "UPDATE conversations SET attempts = ?, last_error = ?, lease_owner = '',"
                f" lease_until = 0, state = ?, next_attempt_at = {clock} + ?, {_RESTORE_LINKS}"
                " WHERE conversation_id = ?",
                (
                    attempts,
                    error[:2000],
                    "failed" if attempts >= max_attempts else "pending",
                    *at,
                    backoff_s * 2 ** (attempts - 1),
                    _links_of(item),
                    item.conversation_id,
                ),
            )

    def release(self, item: QueueItem) -> None:
        """Hand a lease back untouched: pending again, no attempt counted."""
        with self.database.transaction() as sql:
            sql.run(
                "UPDATE conversations SET state = 'pending', lease_owner = '', lease_until = 0,"
                f" {_RESTORE_LINKS}"
                " WHERE conversation_id = ? AND lease_token = ? AND state = 'indexing'",
                (_links_of(item), item.conversation_id, item.lease_token),
            )

    def release_owned(self, owner: str) -> int:
        """Every lease of `owner` (a stopping process) back to pending."""
        with self.database.transaction() as sql:
            return sql.run(
                "UPDATE conversations SET state = 'pending', lease_owner = '', lease_until = 0"
                " WHERE state = 'indexing' AND lease_owner = ?",
                (owner,),
            )

    def release_stale_leases(self) -> int:
        """Every lease back to pending: for a log only this process writes (one process per
        data dir), a lease found at start-up was held by a process that is gone."""
        with self.database.transaction() as sql:
            return sql.run(
                "UPDATE conversations SET state = 'pending', lease_owner = '', lease_until = 0"
                " WHERE state = 'indexing'"
            )

    def status(
        self, conversation_ids: Sequence[str] = (), prefixes: Sequence[str] = ()
    ) -> list[QueueItem]:
        """The named conversations (all when none are named), within `prefixes` if given."""
        with self.database.snapshot() as sql:
            if conversation_ids:
                items: list[QueueItem] = []
                for part in chunked(list(conversation_ids)):
                    rows = sql.rows(
                        f"SELECT {_COLS} FROM conversations q"
                        f" WHERE q.conversation_id IN ({marks(len(part))})",
                        part,
                    )
                    items += [_item(r) for r in rows]
                return sorted(items, key=lambda i: i.conversation_id)
            if prefixes:
                clause, params = prefix_match(prefixes)
                rows = sql.rows(
                    f"SELECT {_COLS} FROM conversations q WHERE {clause}"
                    " ORDER BY q.conversation_id",
                    params,
                )
            else:
                rows = sql.rows(f"SELECT {_COLS} FROM conversations q ORDER BY q.conversation_id")
        return [_item(r) for r in rows]

    def status_page(
        self,
        after: str,
        limit: int,
        prefixes: Sequence[str] = (),
        within: str = "",
        states: Sequence[str] = (),
    ) -> list[QueueItem]:
        """Up to `limit` conversations after `after` in id order (keyset: the primary key's
        order, whatever the number of conversations), within one of `prefixes` if given
        (a token's), starting with `within` and in one of `states` if given."""
        where: list[str] = ["q.conversation_id > ?"]
        params: list[str | int] = [after]
        if prefixes:
            clause, more = prefix_match(prefixes)
            where.append(clause.replace("conversation_id", "q.conversation_id"))
            params += more
        if within:
            where.append("substr(q.conversation_id, 1, ?) = ?")
            params += [len(within), within]
        if states:
            where.append(f"q.state IN ({marks(len(states))})")
            params += list(states)
        with self.database.snapshot() as sql:
            rows = sql.rows(
                f"SELECT {_COLS} FROM conversations q WHERE {' AND '.join(where)}"
                " ORDER BY q.conversation_id LIMIT ?",
                [*params, limit],
            )
        return [_item(r) for r in rows]

    def counts(self, prefixes: Sequence[str] = ()) -> dict[str, tuple[int, int]]:
        """By state: (conversations, backlog), over every conversation or those within
        `prefixes` (read as `_by_state` reads them)."""
        return {state: (n, backlog) for state, (n, backlog, _) in self._by_state(prefixes).items()}

    def gauges(self) -> QueueGauges:
        """Totals for monitoring (read as `_by_state` reads them)."""
        by_state = self._by_state()
        oldest = [since for _, _, since in by_state.values() if since is not None]
        return QueueGauges(
            backlog=sum(backlog for _, backlog, _ in by_state.values()),
            by_state={state: n for state, (n, _, _) in by_state.items()},
            oldest_pending_since=min(oldest) if oldest else None,
        )

    def _by_state(self, prefixes: Sequence[str] = ()) -> dict[str, tuple[int, int, float | None]]:
        """By state: (conversations, backlog, oldest pending_since). Only the conversations
        with work are read, through the state index; idle ones are the rest of a count
        (none has a backlog), so totals do not read every conversation's row with every
        status call (issue 65: 34 ms at 100,000)."""
        clause, params = prefix_match(prefixes) if prefixes else ("1 = 1", [])
        with self.database.snapshot() as sql:
            total = sql.one(f"SELECT COUNT(*) FROM conversations WHERE {clause}", params)
            rows = sql.rows(
                "SELECT state, COUNT(*), SUM(dirty), MIN(CASE WHEN pending_since > 0"
                " THEN pending_since END) FROM conversations"
                f" WHERE state IN ({marks(len(_AT_WORK))}) AND {clause} GROUP BY state",
                [*_AT_WORK, *params],
            )
        found = {
            str(r[0]): (int(r[1]), int(r[2] or 0), None if r[3] is None else float(r[3]))
            for r in rows
        }
        idle = (int(total[0]) if total else 0) - sum(n for n, _, _ in found.values())
        return found | ({"idle": (idle, 0, None)} if idle else {})

    def leased(self) -> int:
        with self.database.snapshot() as sql:
            row = sql.one(
                "SELECT COUNT(*) FROM conversations WHERE state = 'indexing'"
                f" AND lease_until > {sql.dialect.now}"
            )
        return int(row[0]) if row else 0

    def _items(self, sql: Sql, conversation_ids: Sequence[str]) -> list[QueueItem]:
        items: list[QueueItem] = []
        for part in chunked(list(conversation_ids)):
            rows = sql.rows(
                f"SELECT {_COLS} FROM conversations q"
                f" WHERE q.conversation_id IN ({marks(len(part))})",
                part,
            )
            items += [_item(r) for r in rows]
        return sorted(items, key=lambda i: i.conversation_id)
