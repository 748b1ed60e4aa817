"""Which ranked candidates a search returns: judged against the event log, read, and
chosen so that no two hits say the same thing.

A candidate is returned only if the log holds it live now, with the content the record
returned has (`verified`). Among the live ones, in rank order, a hit is skipped when its text
repeats one already chosen (a greeting in every conversation of an unscoped search) or
when every turn it covers is covered already: an overlapping window, or another part of a
long turn whose best part is chosen. So a hit always brings turns the caller has not had,
and a turn budget (`EmbedDbRequest.turn_budget`) counts each turn once; a hit that would
overrun the budget is passed over for a later, smaller one that fits.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from memsvc.domain.hashing import text_hash
from memsvc.domain.records import Scored, StoredChunk
from memsvc.observability.metrics import stage
from memsvc.ports import ChunkStore, EventLog, LogReader
from memsvc.services.narrowing import Narrowing
from memsvc.services.recent_records import RecentRecords

# (conversation, first turn, last turn): what a hit covers.
Span = tuple[str, int, int]

# A hybrid search of conversations holding at most this many chunks has its dense list
# return whole records: that list then holds every chunk in scope, and no read follows.
# Decoding a record in a search costs ~0.1 ms, a read's round trip ~1.5 ms on a shard of
# 30,000 rows (benchmarks/archive/2026-12-06.md, Scale v3).
WHOLE_SCOPE_AT_MOST = 16


class Judged(NamedTuple):
    """What the log's layout says of a live candidate before its record is read."""

    text_hash: str
    span: Span
    content_hash: str


@dataclass
class Coverage:
    """Turns already given to the caller, and the budget left for more."""

    budget: int = 0  # 0 = none
    turns: set[tuple[str, int]] = field(default_factory=set)

    def new_turns(self, span: Span) -> list[tuple[str, int]]:
        conv, start, end = span
        return [(conv, t) for t in range(start, end + 1) if (conv, t) not in self.turns]

    def fits(self, new: Sequence[tuple[str, int]]) -> bool:
        return not self.budget or len(self.turns) + len(new) <= self.budget

    @property
    def full(self) -> bool:
        return bool(self.budget) and len(self.turns) >= self.budget


def span_of(stored: StoredChunk) -> Span:
    m = stored.record.metadata
    return (m.conversation_id, m.turn_range.start, m.turn_range.end)


class HitSelector:
    def __init__(self, store: ChunkStore, log: EventLog, recent: RecentRecords) -> None:
        self.store = store
        self.log = log
        self.recent = recent

    def reads_whole(self, conversation_ids: Sequence[str]) -> bool:
        """Whether a search of these conversations should return whole records: they hold
        few chunks (WHOLE_SCOPE_AT_MOST), not all kept from recent reads (a read of kept
        records costs nothing)."""
        if not conversation_ids or len(conversation_ids) > WHOLE_SCOPE_AT_MOST:
            return False
        with stage("search", "plan"), self.log.snapshot() as r:
            rows = r.layout_hashes(conversation_ids, WHOLE_SCOPE_AT_MOST + 1)
        return len(rows) <= WHOLE_SCOPE_AT_MOST and not self.recent.hold(rows)

    def top(
        self,
        ranked: Sequence[Scored],
        top_k: int,
        known: Mapping[str, StoredChunk],
        audit: bool,
        coverage: Coverage,
        narrowing: Narrowing | None = None,
    ) -> tuple[list[Scored], dict[str, StoredChunk], dict[str, tuple[int, ...]]]:
        """The first `top_k` candidates that bring new text and new turns within the
        budget, and their records. Records the search returned whole are `known`. The
        others are judged by the log first, in slices of 4 x top_k then twice as large each
        time: which are live, with what content (its layout's content hash), what text
        each holds (its text hash) and which turns. So only the hits are read, in one round trip
        unless texts repeat past the slice, never a copy of a text already kept: a read
        costs ~1 ms a round trip and ~0.05 ms a record, whatever the size of the store,
        and judging a few more ids in the log far less (benchmarks/archive/2026-11-25.md, Speed v4).
        A hit removed between the search and the read, or one the log cannot judge without
        its record (a superseded tail awaiting removal), is read and judged again, and the
        choice is made anew. With `narrowing`, late window hits return some of their turns
        (memsvc.services.narrowing): the turns of each such hit are the third result."""
        records: dict[str, StoredChunk] = dict(self.verified(known, audit))
        live: dict[str, Judged] = {}
        judged: set[str] = set(known)
        start, size = 0, top_k * 4
        while True:
            top, unread, narrowed = _pick(
                ranked[:start], top_k, records, live, judged, coverage, narrowing
            )
            if unread:
                records.update(self._read(unread, live, audit, narrowing))
                judged.update(unread)
                done = set(unread)
                live = {cid: v for cid, v in live.items() if cid not in done}
                continue
            if (
                len(top) >= top_k
                or start >= len(ranked)
                or _filled(top, records, live, coverage, narrowed)
            ):
                _cover(top, records, coverage, narrowed)
                return top, records, narrowed
            part = [cid for cid, _ in ranked[start : start + size]]
            start, size = start + len(part), size * 2
            found, doubtful = self._live_in_log([c for c in part if c not in judged], audit)
            live.update(found)
            judged.update(c for c in part if c not in doubtful)

    def _read(
        self,
        ids: Sequence[str],
        live: Mapping[str, Judged],
        audit: bool,
        narrowing: Narrowing | None = None,
    ) -> dict[str, StoredChunk]:
        """The records of `ids` the log holds live. One with the content the log was just
        asked about needs no second look; any other is verified. A record kept from a
        recent read with that content is not read again, unless it was kept without the
        turn lines narrowing needs."""
        wanted = [(cid, live[cid].content_hash) for cid in ids if cid in live]
        usable = None if narrowing is None else lambda s: not narrowing.reads_lines(s)
        found = self.recent.take(wanted, usable)
        unread = [cid for cid in ids if cid not in found]
        if unread:
            with stage("search", "read"):
                fresh = self.store.get(
                    unread,
                    with_turn_lines=narrowing is not None,
                    conversations={live[cid].span[0] for cid in unread if cid in live},
                )
            self.recent.keep(fresh.values())
            found.update(fresh)
        checked = {
            cid: s
            for cid, s in found.items()
            if cid in live and s.content_hash == live[cid].content_hash
        }
        doubtful = {cid: s for cid, s in found.items() if cid not in checked}
        return checked | self.verified(doubtful, audit)

    def _live_in_log(self, ids: Sequence[str], audit: bool) -> tuple[dict[str, Judged], set[str]]:
        """Of candidates: those the log holds live, with what the layout says of each, and
        those it cannot judge without their records: a superseded tail awaiting removal,
        or any candidate of an audit (the deleted flag, outside the content hash, is read
        from the store). The rest are not live. The search returned no content hash: a
        record is compared with the layout's once read (`_read`), so a store row that
        differs from the log is never returned, and decoding a field of every candidate
        cost more than a hybrid search's fusion (benchmarks/archive/2026-11-28.md)."""
        if audit or not ids:
            return {}, set(ids)
        with stage("search", "verify"), self.log.snapshot() as r:
            layout = r.layout_rows(ids)
            doubtful = r.waiting_superseded([cid for cid in ids if cid not in layout])
            unsettled = _unsettled(r, {row.conversation_id for row in layout.values()})
            deleted = {c: r.deleted_turn_ids(c) for c in unsettled}
        live: dict[str, Judged] = {}
        for cid, row in layout.items():
            if row.deleted:
                continue
            if _span_holds(row.start_turn, row.end_turn, deleted.get(row.conversation_id, [])):
                continue
            span = (row.conversation_id, row.start_turn, row.end_turn)
            live[cid] = Judged(row.text_hash, span, row.content_hash)
        return live, set(doubtful)

    def verified(self, records: Mapping[str, StoredChunk], audit: bool) -> dict[str, StoredChunk]:
        """The records the log holds live now: a chunk of its layout with the same content
        (or a superseded tail awaiting removal). While a conversation's delete or purge is
        committed but not yet reconciled, its layout may predate it: then a chunk whose
        turn range holds a deleted turn is left out too. So what a crash or an outage left
        in the store is never returned, even before the recorded work repairs it. `audit`
        (include deleted) keeps the layout's deleted chunks too."""
        if not records:
            return {}
        with stage("search", "verify"):
            return self._verified_now(records, audit)

    def _verified_now(
        self, records: Mapping[str, StoredChunk], audit: bool
    ) -> dict[str, StoredChunk]:
        ids = list(records)
        convs = {s.record.metadata.conversation_id for s in records.values()}
        with self.log.snapshot() as r:
            layout = r.layout_rows(ids)
            waiting = r.waiting_superseded(ids)
            unsettled = _unsettled(r, convs)
            deleted = {
                c: r.deleted_turn_ids(c) for c in (_conversations_of(records, waiting) | unsettled)
            }
        out: dict[str, StoredChunk] = {}
        for cid, stored in records.items():
            row = layout.get(cid)
            m = stored.record.metadata
            if row is not None:
                known = row.content_hash == stored.content_hash and (audit or not row.deleted)
            else:
                known = cid in waiting
            if not known:
                continue
            # A superseded tail was never re-rendered: its range says what it holds.
            doubtful = row is None or m.conversation_id in unsettled
            turns = deleted.get(m.conversation_id, []) if doubtful else []
            if not audit and _span_holds(m.turn_range.start, m.turn_range.end, turns):
                continue
            out[cid] = stored
        return out


def within(
    ordered: Sequence[Scored], records: Mapping[str, StoredChunk], coverage: Coverage
) -> list[Scored]:
    """Of hits already chosen in order (MMR), those that bring new turns within the
    budget; their turns are then covered."""
    out: list[Scored] = []
    for cid, score in ordered:
        new = coverage.new_turns(span_of(records[cid]))
        if new and coverage.fits(new):
            coverage.turns.update(new)
            out.append((cid, score))
    return out


def _pick(
    ranked: Sequence[Scored],
    top_k: int,
    records: Mapping[str, StoredChunk],
    live: Mapping[str, Judged],
    judged: set[str],
    coverage: Coverage,
    narrowing: Narrowing | None,
) -> tuple[list[Scored], list[str], dict[str, tuple[int, ...]]]:
    """The best-ranked candidates with distinct texts and new turns, up to `top_k` and the
    turn budget, and the records still to be read before that choice is final: the picks
    the log holds live (known by their text hash, not yet read), and every candidate
    ranked before the last pick that the log could not judge (its text, once read, may
    come first). A late window hit (`narrowing`) not yet read is counted as its kept
    turns would be, at most; once read, by the turns it keeps (the third result)."""
    seen: set[str] = set()
    covered = set(coverage.turns)
    used = len(covered)
    top: list[Scored] = []
    unread: list[str] = []
    narrowed: dict[str, tuple[int, ...]] = {}
    for cid, score in ranked:
        if len(top) >= top_k or (coverage.budget and used >= coverage.budget):
            break
        stored = records.get(cid)
        if stored is not None:
            key, span = text_hash(stored.record.text), span_of(stored)
        elif cid in live:
            key, span = live[cid].text_hash, live[cid].span
        elif cid not in judged:
            unread.append(cid)
            continue
        else:
            continue  # not live, or gone since the search
        conv, first, last = span
        new = {(conv, t) for t in range(first, last + 1)} - covered
        if key in seen or not new:
            continue
        left = coverage.budget - used if coverage.budget else len(new)
        narrowed_hit = narrowing is not None and narrowing.applies(len(top), first, last)
        # the budget's last turns: a hit that does not fit gives its best ones, as one vector
        # per turn would fill them (5 turns: two narrowed hits of 2 left one unused)
        fill = narrowing is not None and len(new) > left and last > first
        if narrowing is not None and (narrowed_hit or fill):
            keep = min(narrowing.keep, left) if narrowed_hit else left
            if stored is None:  # which turns it keeps is known once it is read
                cost = min(keep, len(new))
                seen.add(key)
                used += cost
                top.append((cid, score))
                unread.append(cid)
                continue
            kept = narrowing.turns(stored, keep)
            if kept is not None:
                new = {(conv, t) for t in kept} - covered
                if not new:
                    continue
                narrowed[cid] = tuple(sorted(t for _, t in new))  # never a turn given before
        if coverage.budget and used + len(new) > coverage.budget:
            continue
        seen.add(key)
        covered |= new
        used += len(new)
        top.append((cid, score))
        if stored is None:
            unread.append(cid)
    return top, unread, narrowed


def _turns(
    cid: str,
    records: Mapping[str, StoredChunk],
    live: Mapping[str, Judged],
    narrowed: Mapping[str, tuple[int, ...]],
) -> list[tuple[str, int]]:
    """The turns a pick returns."""
    conv, first, last = span_of(records[cid]) if cid in records else live[cid].span
    return [(conv, t) for t in narrowed.get(cid, range(first, last + 1))]


def _filled(
    top: Sequence[Scored],
    records: Mapping[str, StoredChunk],
    live: Mapping[str, Judged],
    coverage: Coverage,
    narrowed: Mapping[str, tuple[int, ...]],
) -> bool:
    """The picks use the whole turn budget: no later candidate can be added."""
    if not coverage.budget:
        return False
    turns = set(coverage.turns)
    for cid, _ in top:
        turns.update(_turns(cid, records, live, narrowed))
    return len(turns) >= coverage.budget


def _cover(
    top: Sequence[Scored],
    records: Mapping[str, StoredChunk],
    coverage: Coverage,
    narrowed: Mapping[str, tuple[int, ...]],
) -> None:
    for cid, _ in top:
        coverage.turns.update(_turns(cid, records, {}, narrowed))


def _unsettled(r: LogReader, conversation_ids: set[str]) -> set[str]:
    """Those whose delete or purge is committed but not yet reconciled: their layout may
    predate it, so a chunk's range is checked against their deleted turns."""
    rows = {c: r.conversation(c) for c in conversation_ids}
    return {c for c, conv in rows.items() if conv is not None and conv.needs_reconcile}


def _conversations_of(records: Mapping[str, StoredChunk], ids: set[str]) -> set[str]:
    return {records[cid].record.metadata.conversation_id for cid in ids if cid in records}


def _span_holds(start: int, end: int, sorted_turns: Sequence[int]) -> bool:
    i = bisect.bisect_left(sorted_turns, start)
    return i < len(sorted_turns) and sorted_turns[i] <= end
