"""Stateful randomized test of the write path against a plain reference model.

Hypothesis interleaves appends (through the background worker), synchronous builds,
upserts of fresh, stale, replayed and forged records, deletes (ranges, chunk ids, unknown
ids, whole conversations), edits, purges, reindexes to a new version, retirement of the
old one, and restarts of the whole service on the same data dir. After every step:

- no live stored chunk, and no search hit in any mode, holds a deleted turn's text;
- every live stored chunk is its layout chunk (same content) or a superseded tail waiting
  for retirement whose turns are all live; every indexed layout chunk is stored live;
- once the pending chunks are upserted, the live chunks cover every live turn and their
  texts equal a one-call build of the reference model's live turns;
- counts agree with the reference (turns deleted, turns purged).

At the end of each run the store is rebuilt from the event log into a new collection, and
its live chunks equal the live chunks of the store it replaces.

`make test` runs a fixed seed and a moderate number of examples; `make soak` runs many
more (MEMSVC_SOAK_EXAMPLES, default 1000) and its result is recorded in RESULTS.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from memsvc.app import Services, build_services
from memsvc.domain.ids import chunk_id
from memsvc.domain.types import ChunkRecord, MemoryEvent, SearchFilters, SearchMode, SearchRequest
from memsvc.domain.types import TurnRange as Span
from memsvc.embedding.model import Embedder
from tests.conftest import make_settings

SOAK = int(os.environ.get("MEMSVC_SOAK_EXAMPLES", "0"))
_runs = itertools.count()

# Draws never depend on the machine's state (list sizes vary with the worker's timing, and
# Hypothesis must be able to replay a draw sequence): pick an index, reduce it modulo.
PICK = st.integers(0, 63)

_WORDS = ["river", "garden", "violin", "lantern", "harbor", "meadow", "pepper", "canyon"]


def marker(turn_id: int, edit: int) -> str:
    """A token no other turn's text contains: 'zq7e0zq' is not inside 'zq17e0zq'."""
    return f"zq{turn_id}e{edit}zq"


class WritePath(RuleBasedStateMachine):
    services: Services
    data_dir: Path
    embedder: Embedder

    def __init__(self) -> None:
        super().__init__()
        self.conv = f"sm{next(_runs)}"
        # reference model: turn id -> (text, deleted)
        self.turns: dict[int, tuple[str, bool]] = {}
        self.purged: set[int] = set()
        self.edits: dict[int, int] = {}
        self.held: list[ChunkRecord] = []  # records a caller got from builds, any age
        self.version = 1
        self.old_versions: set[int] = set()
        self.rng = random.Random(0)

    # -- helpers ------------------------------------------------------------------------
    @property
    def svc(self) -> Services:
        return WritePath.services

    def event(self, turn_id: int) -> MemoryEvent:
        text, _ = self.turns[turn_id]
        return MemoryEvent(
            conversation_id=self.conv,
            turn_id=turn_id,
            speaker="user" if turn_id % 3 != 1 else "assistant",
            text=text,
            timestamp=f"2026-03-{1 + turn_id // 8:02d}T10:{turn_id % 60:02d}:00+08:00",
            speaker_name="Ana" if turn_id % 3 != 1 else "Bot",
        )

    def new_text(self, turn_id: int, size: int) -> str:
        edit = self.edits.get(turn_id, 0)
        words = " ".join(self.rng.choice(_WORDS) for _ in range(size))
        return f"{marker(turn_id, edit)} {words}."

    def live_turns(self) -> list[int]:
        return sorted(t for t, (_, deleted) in self.turns.items() if not deleted)

    def deleted_markers(self) -> list[str]:
        """Every text a deleted turn ever had (each edit carries its own marker)."""
        return [
            marker(t, e)
            for t, (_, deleted) in self.turns.items()
            if deleted
            for e in range(self.edits.get(t, 0) + 1)
        ]

    def settle(self) -> None:
        """Let the background worker finish this conversation."""
        items = self.svc.queue.status([self.conv])
        if items:
            last = max(self.turns) if self.turns else 0
            self.svc.control.wait_for_indexed(self.conv, last, 120)

    def stored(self, include_deleted: bool = False) -> list[ChunkRecord]:
        page = self.svc.ingest.list_chunks(self.conv, include_deleted, 1000, "")
        return list(page.chunks)

    # -- rules --------------------------------------------------------------------------
    @initialize(n=st.integers(2, 6))
    def start(self, n: int) -> None:
        self.append_turns(n, sync=True)

    def append_turns(self, n: int, sync: bool, long: bool = False) -> None:
        start = max(self.turns) + 1 if self.turns else 0
        for t in range(start, start + n):
            self.turns[t] = (self.new_text(t, 300 if long and t == start else 6), False)
        events = [self.event(t) for t in range(start, start + n)]
        if sync:
            built = self.svc.ingest.build(events, chunk_version=self.version)
            self.held += built.chunks
            result = self.svc.ingest.upsert(built.chunks)
            assert not result.errors, result.errors
        else:
            result = self.svc.ingest.append(events)
            assert result.accepted == n and not result.errors
            self.svc.worker.notify()  # as the AppendEvents servicer does

    @rule(n=st.integers(1, 4), sync=st.booleans(), long=st.booleans())
    def append(self, n: int, sync: bool, long: bool) -> None:
        self.append_turns(n, sync, long)

    @rule(data=st.data())
    def edit(self, data: st.DataObject) -> None:
        live = self.live_turns()
        i = data.draw(PICK)
        if not live:
            return
        t = live[i % len(live)]
        self.edits[t] = self.edits.get(t, 0) + 1
        self.turns[t] = (self.new_text(t, 5), False)
        built = self.svc.ingest.build([self.event(t)], chunk_version=self.version)
        self.held += built.chunks  # held, not upserted: a later rule may (stale or not)

    @rule()
    def build_only(self) -> None:
        built = self.svc.ingest.build([], self.version, conversation_id=self.conv)
        self.held += built.chunks

    @rule(data=st.data())
    def upsert_held(self, data: st.DataObject) -> None:
        """Replay any records a caller once got: fresh ones are stored, stale ones refused."""
        idx = data.draw(st.lists(PICK, min_size=1, max_size=6))
        if not self.held:
            return
        picks = [self.held[i % len(self.held)] for i in idx]
        result = self.svc.ingest.upsert(list({r.chunk_id: r for r in picks}.values()))
        assert {e.reason for e in result.errors} <= {"superseded", "deleted", "mismatch", "unknown"}

    @rule(data=st.data(), kind=st.sampled_from(["text", "version", "orphan", "deleted_flag"]))
    def upsert_forged(self, data: st.DataObject, kind: str) -> None:
        i = data.draw(PICK)
        if not self.held:
            return
        r = self.held[i % len(self.held)]
        m = r.metadata
        if kind == "text":
            forged = dataclasses.replace(r, text=r.text + " forged addition")
        elif kind == "version":
            m2 = dataclasses.replace(m, chunk_version=999)
            cid = chunk_id(m.conversation_id, m.turn_range.start, m.turn_range.end, 999)
            forged = dataclasses.replace(r, chunk_id=cid, metadata=m2)
        elif kind == "orphan":
            m2 = dataclasses.replace(m, conversation_id=self.conv + "-orphan")
            cid = chunk_id(m2.conversation_id, m.turn_range.start, m.turn_range.end, 1)
            forged = dataclasses.replace(r, chunk_id=cid, metadata=m2)
        else:
            forged = dataclasses.replace(r, metadata=dataclasses.replace(m, deleted=True))
        result = self.svc.ingest.upsert([forged])
        if kind != "deleted_flag":
            assert (result.upserted, result.updated) == (0, 0) and len(result.errors) == 1

    @rule(data=st.data())
    def delete_range(self, data: st.DataObject) -> None:
        start, width = data.draw(PICK), data.draw(st.integers(0, 3))
        if not self.turns:
            return
        hi = max(self.turns)
        a = start % (hi + 1)
        b = min(hi, a + width)
        expected = sum(1 for t in range(a, b + 1) if t in self.turns and not self.turns[t][1])
        result = self.svc.deletion.delete(self.conv, Span(a, b), [])
        assert result.events_deleted == expected
        for t in range(a, b + 1):
            if t in self.turns:
                self.turns[t] = (self.turns[t][0], True)

    @rule(data=st.data(), unknown=st.booleans())
    def delete_chunk_ids(self, data: st.DataObject, unknown: bool) -> None:
        # Live chunks only: which deleted rows a store holds depends on the worker's timing,
        # and what Hypothesis draws from must not.
        self.settle()
        known = {c.chunk_id: c for c in self.stored()}
        idx = data.draw(st.lists(PICK, max_size=2))
        ids = list(dict.fromkeys(sorted(known)[i % len(known)] for i in idx)) if known else []
        if unknown:
            ids.append("chk_" + "f" * 32)
        if not ids:
            return
        result = self.svc.deletion.delete(self.conv, None, ids)
        assert [e.chunk_id for e in result.errors] == (["chk_" + "f" * 32] if unknown else [])
        for cid in ids:
            if cid in known:
                span = known[cid].metadata.turn_range
                for t in range(span.start, span.end + 1):
                    if t in self.turns:
                        self.turns[t] = (self.turns[t][0], True)

    @rule()
    def delete_whole(self) -> None:
        self.svc.deletion.delete(self.conv, None, [])
        self.turns = {t: (text, True) for t, (text, _) in self.turns.items()}

    @rule()
    def purge(self) -> None:
        self.settle()
        _, events = self.svc.deletion.purge_deleted(self.conv)
        newly = {t for t, (_, d) in self.turns.items() if d} - self.purged
        assert events == len(newly)
        self.purged |= newly

    @precondition(lambda self: not self.old_versions)
    @rule()
    def reindex(self) -> None:
        self.settle()
        self.old_versions.add(self.version)
        self.version += 1
        self.svc.control.reindex([self.conv], self.version)
        self.svc.ingest.build([], chunk_version=self.version, conversation_id=self.conv)

    @precondition(lambda self: bool(self.old_versions))
    @rule()
    def retire_old(self) -> None:
        self.settle()
        for v in sorted(self.old_versions):
            self.svc.deletion.retire_version(self.conv, v)
        self.old_versions.clear()

    @rule()
    def restart(self) -> None:
        self.svc.close()
        WritePath.services = build_services(
            make_settings(WritePath.data_dir), embedder=WritePath.embedder
        )

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def nothing_deleted_is_live_or_found(self) -> None:
        self.settle()
        markers = self.deleted_markers()
        live = self.stored()
        for chunk in live:
            for m in markers:
                assert m not in chunk.text, (m, chunk.chunk_id)
        if markers:
            query = " ".join(markers[:8])
            for mode in SearchMode:
                _, _, hits = self.svc.search.search(
                    SearchRequest(query, 50, SearchFilters((self.conv,)), mode)
                )
                for h in hits:
                    assert not any(m in h.text for m in markers), (mode, h.chunk_id)

    @invariant()
    def store_matches_layout(self) -> None:
        from memsvc.domain.hashing import content_hash

        live = {c.chunk_id: c for c in self.stored()}
        with self.svc.log.snapshot() as log:
            layout = log.conversation_layout(self.conv)
            superseded = set(log.pending_superseded(self.conv))
        live_turns = set(self.live_turns())
        for cid, chunk in live.items():
            row = layout.get(cid)
            if row is not None and not row.deleted:
                # the layout's chunk, or an older rendering of it awaiting its upsert
                assert row.content_hash == content_hash(chunk) or not row.indexed, cid
            else:
                span = chunk.metadata.turn_range
                assert cid in superseded, cid
                assert {t for t in range(span.start, span.end + 1) if t in self.turns} <= live_turns
        for cid, row in layout.items():
            if row.indexed and not row.deleted:
                assert cid in live, cid

    def teardown(self) -> None:
        try:
            self.settle()
            # Upsert whatever is pending, then the live chunks of the current version are
            # exactly a one-call build of the reference model's live turns.
            built = self.svc.ingest.build([], chunk_version=self.version, conversation_id=self.conv)
            result = self.svc.ingest.upsert(built.chunks)
            assert not result.errors, result.errors
            current = sorted(
                c.text for c in self.stored() if c.metadata.chunk_version == self.version
            )
            ref_conv = self.conv + "-ref"
            ref_events = [
                dataclasses.replace(self.event(t), conversation_id=ref_conv)
                for t in self.live_turns()
            ]
            expected: list[str] = []
            if ref_events:
                ref = self.svc.ingest.build(ref_events, self.version, allow_gaps=True)
                expected = sorted(c.text for c in ref.chunks)
                assert not self.svc.ingest.upsert(ref.chunks).errors
            assert current == expected
        finally:
            self.held.clear()


def current_versions(svc: Services) -> dict[str, str]:
    """Live chunks of each conversation's newest version (what a rebuild restores; an
    older version kept during a migration is not rebuilt)."""
    out: dict[str, str] = {}
    with svc.log.snapshot() as log:
        conversations = log.conversations()
    for conv in conversations:
        chunks = svc.ingest.list_chunks(conv, False, 1000, "").chunks
        newest = max((c.metadata.chunk_version for c in chunks), default=0)
        out.update({c.chunk_id: c.text for c in chunks if c.metadata.chunk_version == newest})
    return out


def run_machine(
    services_dir: Path, embedder: Embedder, examples: int, steps: int, fixed_seed: bool = True
) -> None:
    WritePath.data_dir = services_dir
    WritePath.embedder = embedder
    WritePath.services = build_services(make_settings(services_dir), embedder=embedder)
    try:
        run_state_machine_as_test(
            WritePath,
            settings=settings(
                max_examples=examples,
                stateful_step_count=steps,
                deadline=None,
                derandomize=fixed_seed,
                database=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
        before = current_versions(WritePath.services)
    finally:
        WritePath.services.close()
    # Drop the projection and rebuild it from the log: the same live chunks.
    rebuilt = build_services(make_settings(services_dir, collection="rebuilt"), embedder=embedder)
    try:
        with rebuilt.log.snapshot() as log:
            convs = log.conversations()
        for conv in convs:
            status = rebuilt.queue.status([conv])
            if status:
                rebuilt.control.wait_for_indexed(conv, status[0].last_appended_turn, 300)
        after = current_versions(rebuilt)
    finally:
        rebuilt.close()
    assert after == before


def test_write_path_state_machine(tmp_path: Path, embedder: Embedder) -> None:
    run_machine(tmp_path, embedder, examples=25, steps=15)


@pytest.mark.soak
def test_write_path_soak(tmp_path: Path, embedder: Embedder) -> None:
    run_machine(tmp_path, embedder, examples=SOAK or 1000, steps=30, fixed_seed=False)
