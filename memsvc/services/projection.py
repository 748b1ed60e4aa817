"""The vector store as a projection of the event log.

The event log is the only source of truth. For each conversation and chunk_version the
*layout* is the set of chunks planned from the live (non-deleted) turns; the store holds
what the layout holds, and nothing else stays live. Each step is here, in one place:

- `replan` (plan) recomputes one version's layout from the live turns (from where the
  changes since its last plan can reach: memsvc.domain.replanning). New or changed
  windows are rendered and become *pending* (not yet stored). Chunks that left the layout
  are *deleted* (they covered a turn now deleted: kept for audit, hidden in the store) or
  *superseded* (a tail replaced by a longer window: removed once its replacement is
  stored).
- `reconcile` compares the store with the whole layout of a conversation and repairs it:
  hides what must not be found, removes what no layout holds (purged, retired), moves the
  `current` mark to the active version, and marks for rewriting what is missing. It is
  how every log change that is not an append reaches the store: the change records the
  need in its own transaction, and whoever runs next (the call itself, the worker, a
  restarted process) reconciles; it is idempotent.
- `embed` runs the model on the texts not already cached, outside any lock
  (memsvc.services.vectors: what each chunk's vector is made of).
- `store_records` (write) stores records only if each equals, byte for byte, the chunk the
  layout holds for its id at the moment of writing (checked again under the conversation's
  writer lock, after the model has embedded, so a delete or rebuild that lands meanwhile
  wins). The server authors every chunk.
- `settle` records how far default searches now reflect the log, and switches a complete
  rebuild to be the active version.

Callers hold the conversation's writer lock around `replan`, `reconcile` and `settle`;
`store_records` takes it for its write step.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import structlog

from memsvc.domain.hashing import content_hash, text_hash
from memsvc.domain.layout import PlannedWindow
from memsvc.domain.records import Conversation, LayoutRow, StoredChunk
from memsvc.domain.standing import INSTRUCTION_TAG
from memsvc.domain.types import (
    ChunkRecord,
)
from memsvc.observability import metrics
from memsvc.ports import ChunkStore, Embedder, EmbeddingCache, EventLog, LogWriter, WriterLocks
from memsvc.services.plan_input import PlanInput, read_plan_input, whole_plan_input
from memsvc.services.projection_write import RecordWrites
from memsvc.services.render_processes import Layouts
from memsvc.services.vectors import ChunkVectors

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Replan:
    conversation_id: str
    version: int
    # Chunks of the layout not yet in the store (new, changed, or never stored).
    pending: list[ChunkRecord]
    # Chunks that left the layout in this replan, their turns still live.
    superseded: list[str]
    # Chunks that left the layout in this replan because a turn they cover is deleted.
    deleted: list[str]


@dataclass(frozen=True)
class Reconciled:
    pending: list[ChunkRecord]  # layout chunks the store still lacks
    hidden: int  # chunks hidden (deleted turns, stale renderings)
    removed: int  # chunks no layout holds, removed (purged, retired)


class Projector(RecordWrites):
    def __init__(
        self,
        log: EventLog,
        store: ChunkStore,
        embedder: Embedder,
        cache: EmbeddingCache,
        layouts: Layouts,
        locks: WriterLocks,
    ) -> None:
        self.log = log
        self.store = store
        self.embedder = embedder
        self.cache = cache
        self.layouts = layouts
        self.policy = layouts.policy
        self.locks = locks
        self.vectors = ChunkVectors(log, embedder, cache, layouts.policy)

    # -- plan -----------------------------------------------------------------------------
    def replan(self, conversation_id: str, version: int) -> Replan:
        """Recompute the layout of one conversation and version from its live turns.
        The caller holds the conversation's lock: the rows read here cannot change before
        the write below, except by appends, which the next replan picks up."""
        conv = conversation_id
        with self.log.snapshot() as r:
            row = r.conversation(conv)
            got = read_plan_input(r, conv, version, row)
        # Rendering (jieba, the tokenizer) runs outside any transaction on the shared log,
        # in this process or a render process (memsvc.services.render_processes).
        windows = self.layouts.lay_out(conv, version, got.turns, _stored(got.old))
        if got.from_turn is not None and windows and not self._resumes(windows[0], got):
            # the layout before the change was planned otherwise (another chunk policy)
            with self.log.snapshot() as r:
                row = r.conversation(conv)
                got = whole_plan_input(r, conv, version, row.work_seq if row else 0)
            windows = self.layouts.lay_out(conv, version, got.turns, _stored(got.old))
        seq, old, deleted_turns = got.seq, got.old, got.deleted_turns
        pending: list[ChunkRecord] = []
        fresh: list[LayoutRow] = []
        current: set[str] = set()
        for w in windows:
            cid = w.chunk_id
            current.add(cid)
            previous = old.get(cid)
            same = (
                previous is not None
                and not previous.deleted
                and previous.source_hash == w.source_hash
                and previous.content_hash != ""
            )
            if w.record is None:  # stored as it would be rendered (`_stored`)
                continue
            record = w.record
            pending.append(record)
            if not same:
                fresh.append(
                    LayoutRow(
                        cid,
                        conv,
                        version,
                        w.start_turn,
                        w.end_turn,
                        w.source_hash,
                        text_hash(record.text),
                        content_hash=content_hash(record),
                        standing=record.metadata.intent_tag == INSTRUCTION_TAG,
                    )
                )
        gone = [row for cid, row in old.items() if cid not in current and not row.deleted]
        deleted = sorted(r.chunk_id for r in gone if _covers_any(r, deleted_turns))
        superseded = sorted({r.chunk_id for r in gone} - set(deleted))
        if deleted:
            # A chunk over a now-deleted turn leaves the layout: hide its stored copy first
            # (it may be a re-rendering without that turn, stored live), so a failure below
            # leaves nothing visible and the next replan finds the row gone again.
            stored = self.store.get(deleted, with_vectors=True, conversations=[conv])
            self.locks.ensure(conv)
            self.store.set_deleted([c for c in stored.values() if not c.record.metadata.deleted])
        if fresh or gone or (row is not None and row.planned_seq(version) != seq):
            with self.log.transaction() as tx:
                tx.put_layout(fresh)
                tx.mark_layout_deleted(deleted)
                tx.drop_layout(superseded)
                tx.add_superseded(conv, superseded)
                tx.clear_superseded(r.chunk_id for r in fresh)
                tx.set_planned(conv, version, seq)
        return Replan(conv, version, pending, superseded, deleted)

    def _resumes(self, first: PlannedWindow, got: PlanInput) -> bool:
        """Whether the first window planned again is the layout's window there, derived
        from the same turns by the same policy (memsvc.domain.replanning)."""
        row = got.old.get(first.chunk_id)
        return row is not None and not row.deleted and row.source_hash == first.source_hash

    def plan(self, conversation_id: str) -> list[ChunkRecord]:
        """The chunks a conversation's store still lacks (the active version's first, then
        a rebuild's): a reconcile when a change asked for one, else the replans."""
        with self.log.snapshot() as r:
            conv = r.conversation(conversation_id)
        if conv is None:
            return []
        if conv.needs_reconcile:
            return self.reconcile(conversation_id).pending
        plans = [self.replan(conversation_id, conv.active_version)]
        if conv.building_version:
            plans.append(self.replan(conversation_id, conv.building_version))
        if any(p.superseded for p in plans) and not any(p.pending for p in plans):
            # nothing pending to replace them: no write would retire them
            self.retire_superseded(conversation_id)
        return [c for p in plans for c in p.pending]

    # -- reconcile ------------------------------------------------------------------------
    def reconcile(self, conversation_id: str) -> Reconciled:
        """Repair the store of one conversation against its whole layout (every version
        the layout holds: deleted text is hidden in a version kept after a switch too).
        Idempotent; returns the chunks still to be written, of the searched version and a
        rebuild under way (a version kept after a switch is a frozen copy: never written
        again, so a new store does not get it)."""
        conv = conversation_id
        with self.log.snapshot() as r:
            row = r.conversation(conv)
            versions = set(r.layout_versions(conv))
        if row is None:  # no log left for it: nothing of it may stay in the store
            stale = self.store.chunks_of(conv, deleted=None)
            self.locks.ensure(conv)
            self.store.delete([c.record.chunk_id for c in stale], [conv])
            return Reconciled([], 0, len(stale))
        start_seq = row.work_seq
        versions |= {row.active_version} | ({row.building_version} - {0})
        plans = {v: self.replan(conv, v) for v in sorted(versions)}
        # the replans hid the chunks that left their layouts over deleted turns
        left = sum(len(p.deleted) for p in plans.values())
        with self.log.snapshot() as r:
            row = r.conversation(conv) or row
            layout = r.conversation_layout(conv)
            waiting = set(r.pending_superseded(conv))
            deleted_turns = r.deleted_turn_ids(conv)
        stored = self.store.chunks_of(conv, deleted=None, with_vectors=True)
        hide: list[StoredChunk] = []
        remove: list[str] = []
        mark_on: list[StoredChunk] = []
        mark_off: list[StoredChunk] = []
        rewrite: set[str] = set()
        for s in stored:
            cid, m = s.record.chunk_id, s.record.metadata
            layout_row = layout.get(cid)
            if layout_row is None:
                if cid in waiting and not m.deleted:
                    # a superseded tail, retired once its replacement is stored; hidden
                    # now if it covers a turn deleted since
                    if _span_covers_any(m.turn_range.start, m.turn_range.end, deleted_turns):
                        hide.append(s)
                elif cid not in waiting:
                    remove.append(cid)  # no layout holds it: purged, retired, or orphaned
                continue
            if layout_row.deleted:
                if not m.deleted:
                    hide.append(s)
                continue
            if layout_row.content_hash != s.content_hash or m.deleted:
                if not m.deleted:
                    hide.append(s)  # a stale rendering: hidden until its chunk is written
                rewrite.add(cid)
                continue
            wanted = layout_row.chunk_version == row.active_version
            if s.current != wanted:
                (mark_on if wanted else mark_off).append(s)
        present = {s.record.chunk_id for s in stored}
        rewrite |= {
            cid
            for cid, lr in layout.items()
            if lr.indexed and not lr.deleted and cid not in present
        }
        # The new current rows first, then the old ones off: a search meanwhile sees both
        # (identical texts collapse), never neither.
        self.locks.ensure(conv)
        self.store.set_current(mark_on, True)
        self.store.set_deleted(hide)
        self.store.set_current(mark_off, False)
        self.store.delete(remove, [conv])
        with self.log.transaction() as tx:
            tx.unmark_indexed(sorted(rewrite & {cid for cid, lr in layout.items() if lr.indexed}))
            erasures = tx.erasures()
        if erasures:
            self.cache.forget(erasures)
            with self.log.transaction() as tx:
                tx.clear_erasures(erasures)
        if rewrite:
            plans.update({v: self.replan(conv, v) for v in sorted(versions)})
        with self.log.transaction() as tx:
            observe_lag(
                tx.settle(
                    conv,
                    done_seq=0,
                    reconciled_seq=start_seq,
                    progress_seq=row.progress_seq,
                    last_indexed_turn=row.last_indexed_turn,
                )
            )
        hidden = len(hide) + left
        metrics.CHUNKS_WRITTEN.labels("deleted").inc(hidden)
        if hide or remove or mark_on or mark_off:
            log.info(
                "conversation_reconciled",
                conversation_id=conv,
                hidden=len(hide),
                removed=len(remove),
                marked=len(mark_on) + len(mark_off),
            )
        written = {row.active_version, row.building_version}
        pending = [c for v in sorted(plans) if v in written for c in plans[v].pending]
        return Reconciled(pending, hidden, len(remove))

    # -- embed ----------------------------------------------------------------------------
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors for `texts`, running the model only on texts the cache has not seen."""
        return self.vectors.embed(texts)

    # -- settle ---------------------------------------------------------------------------
    def settle(self, conversation_id: str) -> Conversation | None:
        """Under the conversation's lock, after writes: how far default searches reflect
        the log now, and a complete rebuild made the active version (its `current` marks
        moved by a reconcile, now if the store allows)."""
        conv = conversation_id
        with self.log.transaction() as tx:
            row = tx.conversation(conv)
            if row is None:
                return None
            if _rebuild_complete(row, tx.first_unindexed_turn(conv, row.building_version)):
                tx.switch_version(conv)
                tx.record_change(conv, reconcile=True)
                switched = True
            else:
                switched = False
                row = _settle(tx, row)
        if switched:
            log.info("chunk_version_switched", conversation_id=conv)
            self.reconcile(conv)  # moves the current marks; replans bring plans up to date
            with self.log.transaction() as tx:
                row = tx.conversation(conv)
                if row is not None:
                    row = _settle(tx, row)
        return row


def _stored(old: dict[str, LayoutRow]) -> dict[str, str]:
    """Chunk id -> source hash of the layout rows the store holds as rendered from that
    source: windows planned again with the same source are not rendered again."""
    return {
        cid: row.source_hash
        for cid, row in old.items()
        if not row.deleted and row.content_hash != "" and row.indexed
    }


def _rebuild_complete(row: Conversation, first_unindexed: int | None) -> bool:
    """A rebuild is complete when its layout reflects every change and is wholly stored."""
    return (
        row.building_version != 0
        and not row.needs_reconcile
        and row.building_planned_seq >= row.work_seq
        and first_unindexed is None
    )


def _settle(writer: LogWriter, row: Conversation) -> Conversation:
    """Default searches reflect the log through the active version's plan once that layout
    is wholly stored and no reconcile is outstanding; a bounded step stored part of it."""
    conv = row.conversation_id
    first = writer.first_unindexed_turn(conv, row.active_version)
    done, progress_seq, last = row.done_seq, row.progress_seq, row.last_indexed_turn
    if not row.needs_reconcile:
        if first is None:
            done = max(done, row.active_planned_seq)
        else:
            progress_seq, last = row.active_planned_seq, first - 1
    return observe_lag(
        writer.settle(
            conv,
            done_seq=done,
            reconciled_seq=row.reconciled_seq,
            progress_seq=progress_seq,
            last_indexed_turn=last,
        )
    )


def observe_lag(conv: Conversation) -> Conversation:
    if conv.searchable_after_s is not None:
        metrics.INDEX_LAG.observe(conv.searchable_after_s)
    return conv


def _covers_any(row: LayoutRow, sorted_turns: Sequence[int]) -> bool:
    return _span_covers_any(row.start_turn, row.end_turn, sorted_turns)


def _span_covers_any(start: int, end: int, sorted_turns: Sequence[int]) -> bool:
    i = bisect.bisect_left(sorted_turns, start)
    return i < len(sorted_turns) and sorted_turns[i] <= end
