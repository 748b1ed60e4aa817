"""The store checked against the log, continuously: memsvc notices when the projection must
be rebuilt, instead of trusting what it last wrote.

Two ways a store falls out of line with a log that still says "indexed":
- it comes back without its data at the same address (a lost volume, a failover, a new
  file): Milvus answers again, the collection is made anew, and its identity (an id made
  when a collection is created) is not the one the log recorded. The whole store is then
  forgotten and every conversation reconciled (rebuilt) from the log;
- the log is restored from a backup beside a newer store (or the store from one beside a
  newer log): the identity matches, the rows do not.
So on every reconnection, at start, and every `interval_s`, the identity is followed and
each row of the store is compared with the layout (chunk ids, content hashes, deleted
flags; no text, no vector): a conversation whose store holds a row the log does not plan,
or lacks or holds stale a row the log counts as stored, is recorded for reconciling. Until
its reconcile is done it is not idle and WaitForIndexed says false for it; searches check
every hit against the log meanwhile (memsvc.services.selection).

A store in shards under a memory budget is read in part each round (the shards loaded,
and one other in turn: memsvc.storage.milvus.shards), so an audit does not undo the
budget; every shard is read within as many rounds as there are shards.

Reading the whole store takes a while at size (seconds at 100,000 chunks), and the index
worker writes meanwhile: a conversation whose step stored its chunks after the store was
read and marked them indexed before the log was read looks out of line, and is not. So each
conversation found is compared again, alone, under its writer lock (no step half-done), and
only those still out of line are reconciled; a conversation busy for the whole wait is left
for the next audit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog

from memsvc.domain.errors import ConversationBusy
from memsvc.observability import metrics
from memsvc.ports import ChunkStore, EventLog, LogReader, Notifier, WriterLocks
from memsvc.services import bootstrap

log = structlog.get_logger(__name__)

# Conversations compared again one by one at most: more than this many found at once is a
# store or log restored out of step, not writes racing the audit, and all are reconciled.
RECHECK_AT_MOST = 1000
# How long the second look waits for a conversation's writer (an index step).
RECHECK_WAIT_S = 5.0

# chunk id -> (conversation id, content hash, deleted, indexed): the log's plan
Layout = dict[str, tuple[str, str, bool, bool]]
# chunk id -> (conversation id, content hash, deleted): the store's rows
Stored = dict[str, tuple[str, str, bool]]


class StoreAudit:
    def __init__(
        self,
        events: EventLog,
        store: ChunkStore,
        locks: WriterLocks,
        notifier: Notifier,
        interval_s: float,
    ) -> None:
        self.events = events
        self.store = store
        self.locks = locks
        self.notifier = notifier
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._due = threading.Event()
        self._lock = threading.Lock()  # one audit at a time
        self._thread = threading.Thread(target=self._run, name="store-audit", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._due.set()
        self._thread.join(timeout=10)

    def on_store_change(self, up: bool) -> None:
        """A store that comes back may not be the one that went: audit at once."""
        if up:
            self._due.set()

    def run(self) -> list[str]:
        """One audit: follow the store's identity, compare every row of the parts this
        round reads, one part at a time (what it holds is a part's rows and their layout,
        not the whole store's: ~30,000 of a million chunks in 32 shards). Returns the
        conversations recorded for reconciling."""
        began = time.monotonic()
        outcome = "failed"
        try:
            found = self._round()
            outcome = "ok"
            return found
        finally:
            metrics.STORE_AUDITS.labels(outcome).observe(time.monotonic() - began)

    def _round(self) -> list[str]:
        with self._lock:
            bootstrap.follow_store_identity(self.events, self.store.identity)
            parts = self.store.digest_parts()
            with self.events.snapshot() as r:
                held = _by_part(r.conversation_ids(), self.store.part_of)
            whole = len(parts) == 1 and set(held) <= set(parts)
            out_of_line: set[str] = set()
            for part in parts:
                stored = self.store.digests(part=part)
                # read after the store: see the module's note on writes racing the audit
                with self.events.snapshot() as r:
                    layout = r.layout_digests(None if whole else held.get(part, []))
                    waiting = r.all_waiting_superseded()
                    # those already recorded for reconciling are left out: only the
                    # conversations found are looked up (one query per conversation held
                    # took seconds at size)
                    out_of_line.update(
                        c for c in _out_of_line(layout, stored, waiting) if not _pending(r, c)
                    )
                del stored, layout
            found = sorted(out_of_line)
            if len(found) <= RECHECK_AT_MOST:
                found = [conv for conv in found if self._still_out_of_line(conv)]
            if found:
                # One transaction: a conversation written meanwhile is reconciled all the
                # same (reconciling is idempotent), never left marked stored when it is not.
                with self.events.transaction() as tx:
                    for conv in found:
                        if tx.conversation(conv) is not None:
                            tx.record_change(conv, turns=tx.live_turn_count(conv), reconcile=True)
                log.warning(
                    "store_out_of_line",
                    conversations=len(found),
                    example=found[0],
                    effect="reconciling them from the event log; not searchable as logged"
                    " until done (WaitForIndexed false meanwhile)",
                )
                self.notifier.notify()
            return found

    def _still_out_of_line(self, conversation_id: str) -> bool:
        """The conversation compared again, alone, with no step of it under way."""
        try:
            with self.locks.hold(conversation_id, wait_s=RECHECK_WAIT_S):
                stored = self.store.digests(conversation_id)
                with self.events.snapshot() as r:
                    if _pending(r, conversation_id):
                        return False  # recorded for reconciling meanwhile
                    layout = {
                        cid: (conversation_id, row.content_hash, row.deleted, row.indexed)
                        for cid, row in r.conversation_layout(conversation_id).items()
                    }
                    waiting = r.waiting_superseded(list(stored))
        except ConversationBusy:
            return False  # written all along: the next audit looks again
        return bool(_out_of_line(layout, stored, waiting))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._due.wait(self.interval_s)
            self._due.clear()
            if self._stop.is_set():
                return
            if not self.store.up:
                continue
            try:
                self.run()
            except Exception as exc:  # the store or log went away: the next round retries
                log.warning("store_audit_failed", error=str(exc)[:300])


def _by_part(conversations: list[str], part_of: Callable[[str], str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for conv in conversations:
        out.setdefault(part_of(conv), []).append(conv)
    return out


def _out_of_line(layout: Layout, stored: Stored, waiting: set[str]) -> set[str]:
    """The conversations whose store disagrees with the log's plan."""
    out: set[str] = set()
    for cid, (conv, content, deleted, indexed) in layout.items():
        row = stored.get(cid)
        if indexed and not deleted and (row is None or row[1] != content or row[2]):
            out.add(conv)  # the log counts it stored: it is not, or stale
    for cid, (conv, _content, deleted) in stored.items():
        planned = layout.get(cid)
        if not deleted and (planned is None or planned[2]) and cid not in waiting:
            out.add(conv)  # live in the store, not planned live by the log
    return out


def _pending(r: LogReader, conversation_id: str) -> bool:
    conv = r.conversation(conversation_id)
    return conv is not None and conv.needs_reconcile
