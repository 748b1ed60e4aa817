"""Stateful randomized test of the write path against a plain reference model.

Hypothesis interleaves appends (through the background worker), synchronous builds (with
and without an explicit version, the worker taking over a build nobody upserts), upserts of
fresh, stale, replayed and forged records, deletes (ranges, chunk ids, unknown ids, whole
conversations), edits, purges, reindexes (in place, and to a new version that becomes the
searched one once complete), retiring versions (the searched one is refused), restarts of
the whole service, and crashes between a change's log commit and its store writes. Calls
name the conversation and the speakers in varying but equivalent Unicode forms (one normal
form is stored). After every step:

- no live stored chunk, and no search hit in any mode, holds a deleted turn's text;
- every live stored chunk is its layout chunk or a superseded tail waiting for retirement
  whose turns are all live; every indexed layout chunk is stored live;
- once the worker is done, every accepted live turn is findable (WaitForIndexed says so,
  and a default search finds its text), in the searched version;
- counts agree with the reference (turns deleted, turns purged);
- a version's layout planned through the last change is the plan of every live turn.

At the end of each run the store is rebuilt from the event log into a new collection, and
its chunks of each conversation's searched version equal those of the store it replaces.

`make test` runs a fixed seed and a moderate number of examples; `make soak` runs many
more (MEMSVC_SOAK_EXAMPLES, default 1000) and its result is recorded in RESULTS.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from memsvc.app import Services, build_services
from memsvc.config import Settings
from memsvc.domain import bm25
from memsvc.domain.chunking import plan_windows
from memsvc.domain.errors import FailedPrecondition
from memsvc.domain.ids import chunk_id
from memsvc.domain.types import ChunkRecord, MemoryEvent, SearchFilters, SearchMode, SearchRequest
from memsvc.domain.types import TurnRange as Span
from memsvc.embedding.model import Embedder
from tests.conftest import make_settings
from tests.support.waiting import until_idle

SOAK = int(os.environ.get("MEMSVC_SOAK_EXAMPLES", "0"))
_runs = itertools.count()

# Draws never depend on the machine's state (list sizes vary with the worker's timing, and
# Hypothesis must be able to replay a draw sequence): pick an index, reduce it modulo.
PICK = st.integers(0, 63)

_WORDS = ["river", "garden", "violin", "lantern", "harbor", "meadow", "pepper", "canyon"]
# Speaker names as callers may send them; each pair has one normal form.
_NAMES = {"user": ("Ana", "Ａｎａ"), "assistant": ("Bot", " Bot ")}


def marker(turn_id: int, edit: int) -> str:
    """A token no other turn's text contains: 'zq7e0zq' is not inside 'zq17e0zq'."""
    return f"zq{turn_id}e{edit}zq"


class Crash(BaseException):
    """The process dies at this point of a call."""


def settings_for(data_dir: Path, **kw: object) -> Settings:
    # A build nobody upserts is taken over by the worker quickly, so the machine also races
    # the worker against callers' upserts.
    return make_settings(data_dir, build_grace_s=0.2, **kw)


class WritePath(RuleBasedStateMachine):
    services: Services
    data_dir: Path
    embedder: Embedder
    backend: dict[str, object]

    def __init__(self) -> None:
        super().__init__()
        self.conv = f"sm{next(_runs)}/café"  # a tenant of its own (keyword statistics)
        # reference model: turn id -> (text, deleted)
        self.turns: dict[int, tuple[str, bool]] = {}
        self.purged: set[int] = set()
        self.edits: dict[int, int] = {}
        self.held: list[ChunkRecord] = []  # records a caller got from builds, any age
        self.active = 1  # the version searches read
        self.next_version = 2
        self.rng = random.Random(0)
        self.variant = 0

    # -- helpers ------------------------------------------------------------------------
    @property
    def svc(self) -> Services:
        return WritePath.services

    def conv_as_sent(self) -> str:
        """The conversation id in one of its equivalent forms."""
        self.variant += 1
        form = ("NFC", "NFD", "NFC")[self.variant % 3]
        padding = " " if self.variant % 4 == 0 else ""
        return padding + unicodedata.normalize(form, self.conv) + padding

    def event(self, turn_id: int) -> MemoryEvent:
        text, _ = self.turns[turn_id]
        speaker = "user" if turn_id % 3 != 1 else "assistant"
        return MemoryEvent(
            conversation_id=self.conv_as_sent(),
            turn_id=turn_id,
            speaker=speaker,
            text=text,
            timestamp=f"2026-03-{1 + turn_id // 8:02d}T10:{turn_id % 60:02d}:00+08:00",
            speaker_name=_NAMES[speaker][(turn_id + self.variant) % 2],
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
        if self.svc.queue.status([self.conv]):
            until_idle(self.svc, self.conv, timeout_s=120)

    def stored(self, include_deleted: bool = False) -> list[ChunkRecord]:
        page = self.svc.ingest.list_chunks(self.conv_as_sent(), include_deleted, 1000, "")
        return list(page.chunks)

    def restart(self) -> None:
        self.svc.close()
        WritePath.services = build_services(
            settings_for(WritePath.data_dir, **WritePath.backend), embedder=WritePath.embedder
        )

    def crashing(self) -> object:
        """Store writes raise as if the process died just before them."""
        store = self.svc.store

        class Patch:
            def __enter__(self) -> None:
                def die(*args: object, **kwargs: object) -> None:
                    raise Crash()

                self.saved = store.upsert, store.delete
                store.upsert, store.delete = die, die  # type: ignore[method-assign,assignment]

            def __exit__(self, *exc: object) -> bool:
                store.upsert, store.delete = self.saved  # type: ignore[method-assign]
                return exc[0] is Crash

        return Patch()

    # -- rules --------------------------------------------------------------------------
    @initialize(n=st.integers(2, 6))
    def start(self, n: int) -> None:
        self.append_turns(n, sync=True)

    def append_turns(
        self, n: int, sync: bool, long: bool = False, explicit_version: bool = False
    ) -> None:
        start = max(self.turns) + 1 if self.turns else 0
        for t in range(start, start + n):
            self.turns[t] = (self.new_text(t, 300 if long and t == start else 6), False)
        events = [self.event(t) for t in range(start, start + n)]
        if sync:
            version = self.active if explicit_version else 0
            built = self.svc.ingest.build(events, chunk_version=version)
            self.held += built.chunks
            result = self.svc.ingest.upsert(built.chunks)
            assert not result.errors, result.errors
        else:
            result = self.svc.ingest.append(events)
            assert result.accepted == n and not result.errors
            self.svc.worker.notify()  # as the AppendEvents servicer does

    @rule(n=st.integers(1, 4), sync=st.booleans(), long=st.booleans(), explicit=st.booleans())
    def append(self, n: int, sync: bool, long: bool, explicit: bool) -> None:
        self.append_turns(n, sync, long, explicit)

    @rule(n=st.integers(12, 20))
    def append_a_stretch(self, n: int) -> None:
        """Enough turns that later changes plan again from a window, not from the start."""
        self.append_turns(n, sync=False)

    @rule(data=st.data())
    def edit(self, data: st.DataObject) -> None:
        live = self.live_turns()
        i = data.draw(PICK)
        if not live:
            return
        t = live[i % len(live)]
        self.edits[t] = self.edits.get(t, 0) + 1
        self.turns[t] = (self.new_text(t, 5), False)
        built = self.svc.ingest.build([self.event(t)])
        self.held += built.chunks  # held, not upserted: a later rule may (stale or not)

    @rule()
    def build_only(self) -> None:
        built = self.svc.ingest.build([], conversation_id=self.conv_as_sent())
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

    def delete_span(self, a: int, b: int, crash: bool) -> None:
        expected = sum(1 for t in range(a, b + 1) if t in self.turns and not self.turns[t][1])
        if crash:
            with self.crashing():  # type: ignore[attr-defined]
                self.svc.deletion.delete(self.conv_as_sent(), Span(a, b), [])
            self.restart()
        else:
            result = self.svc.deletion.delete(self.conv_as_sent(), Span(a, b), [])
            assert result.events_deleted == expected
        for t in range(a, b + 1):
            if t in self.turns:
                self.turns[t] = (self.turns[t][0], True)

    @rule(data=st.data(), crash=st.booleans())
    def delete_range(self, data: st.DataObject, crash: bool) -> None:
        start, width = data.draw(PICK), data.draw(st.integers(0, 3))
        if not self.turns:
            return
        hi = max(self.turns)
        a = start % (hi + 1)
        self.delete_span(a, min(hi, a + width), crash)

    @rule(data=st.data(), unknown=st.booleans())
    def delete_chunk_ids(self, data: st.DataObject, unknown: bool) -> None:
        # Any chunk a caller ever got (superseded tails included) names the turns it covers.
        idx = data.draw(st.lists(PICK, max_size=2))
        held = {c.chunk_id: c for c in self.held}
        ids = list(dict.fromkeys(sorted(held)[i % len(held)] for i in idx)) if held else []
        if unknown:
            ids.append("chk_" + "f" * 32)
        if not ids:
            return
        result = self.svc.deletion.delete(self.conv_as_sent(), None, ids)
        assert [e.chunk_id for e in result.errors] == (["chk_" + "f" * 32] if unknown else [])
        for cid in ids:
            if cid in held:
                span = held[cid].metadata.turn_range
                for t in range(span.start, span.end + 1):
                    if t in self.turns:
                        self.turns[t] = (self.turns[t][0], True)

    @rule()
    def delete_whole(self) -> None:
        self.svc.deletion.delete(self.conv_as_sent(), None, [])
        self.turns = {t: (text, True) for t, (text, _) in self.turns.items()}

    @rule(crash=st.booleans())
    def purge(self, crash: bool) -> None:
        newly = {t for t, (_, d) in self.turns.items() if d} - self.purged
        if crash:
            with self.crashing():  # type: ignore[attr-defined]
                self.svc.deletion.purge_deleted(self.conv_as_sent())
            self.restart()
        else:
            self.settle()
            _, events = self.svc.deletion.purge_deleted(self.conv_as_sent())
            assert events == len(newly)
        self.purged |= newly

    @rule(in_place=st.booleans(), by_build=st.booleans())
    def reindex(self, in_place: bool, by_build: bool) -> None:
        """In place (version 0), or to a new version, by Reindex or by a Build naming it;
        the new version becomes the searched one once wholly stored."""
        if in_place:
            assert self.svc.control.reindex([self.conv], 0) == 1
        elif by_build:
            built = self.svc.ingest.build(
                [], chunk_version=self.next_version, conversation_id=self.conv_as_sent()
            )
            self.held += built.chunks
        else:
            assert self.svc.control.reindex([self.conv], self.next_version) == 1
        self.svc.worker.notify()
        self.settle()
        if not in_place:
            self.active, self.next_version = self.next_version, self.next_version + 1
        assert self.svc.queue.status([self.conv])[0].active_version == self.active

    @rule(data=st.data())
    def retire(self, data: st.DataObject) -> None:
        with self.svc.log.snapshot() as log:
            versions = sorted(set(log.layout_versions(self.conv)) | {self.active})
        version = versions[data.draw(PICK) % len(versions)]
        if version == self.active:
            try:
                self.svc.deletion.retire_version(self.conv_as_sent(), version)
            except FailedPrecondition:
                return
            raise AssertionError("retiring the searched version must be refused")
        self.svc.deletion.retire_version(self.conv_as_sent(), version)

    @rule()
    def restart_cleanly(self) -> None:
        self.restart()

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
                hits = self.svc.search.search(
                    SearchRequest(query, 50, SearchFilters((self.conv_as_sent(),)), mode)
                ).hits
                for h in hits:
                    assert not any(m in h.text for m in markers), (mode, h.chunk_id)

    @invariant()
    def every_live_turn_is_findable(self) -> None:
        self.settle()
        live = self.live_turns()
        if not live:
            return
        for t in live:
            assert self.svc.control.is_indexed(self.conv, t), t
        current = {t: marker(t, self.edits.get(t, 0)) for t in live}
        hits = self.svc.search.search(
            SearchRequest(
                " ".join(current.values()),
                100,
                SearchFilters((self.conv_as_sent(),)),
                SearchMode.KEYWORD,
            )
        ).hits
        texts = "\n".join(h.text for h in hits)
        assert all(m in texts for m in current.values()), [
            t for t, m in current.items() if m not in texts
        ]
        assert {h.metadata.chunk_version for h in hits} == {self.active}

    @invariant()
    def keyword_statistics_count_the_live_turns(self) -> None:
        """The log's keyword statistics are a count over the live turns (in blocks), and a
        deleted or replaced text leaves no term behind (not even one only it held)."""
        with self.svc.log.snapshot() as log:
            rows = log.events(self.conv, self.live_turns())
        assert sorted(t for t, r in rows.items() if not r.deleted) == self.live_turns()
        live = bm25.block_documents(
            (
                self.conv,
                t,
                bm25.turn_document(r.timestamp, r.speaker, r.speaker_name, self.turns[t][0]),
            )
            for t, r in rows.items()
        )
        expected = {term: n for (_, term), n in bm25.frequency_changes({}, live).items()}
        documents = expected.pop(bm25.DOCUMENTS, 0)
        gone = {
            bm25.term_id(word)
            for t in self.turns
            for e in range(self.edits.get(t, 0) + 1)
            for word in bm25.terms(marker(t, e))
        } - set(expected)
        tenants = bm25.Tenants(names=frozenset({bm25.tenant(self.conv)}))
        with self.svc.log.snapshot() as log:
            found = log.term_frequencies(tenants, [*expected, *gone])
        assert found == (documents, expected)

    @invariant()
    def layout_is_the_plan_of_every_live_turn(self) -> None:
        """A replan plans again only from where a change can reach (memsvc.domain.
        replanning); planned through the last change, each version's layout is still the
        plan of all the live turns."""
        with self.svc.log.snapshot() as log:
            row = log.conversation(self.conv)
            assert row is not None
            turns = log.live_turns(self.conv)
            layouts = {
                v: log.layout(self.conv, v)
                for v in {row.active_version, row.building_version} - {0}
                if row.planned_seq(v) == row.work_seq
            }
        for version, layout in layouts.items():
            planned = plan_windows(turns, self.svc.projector.policy, self.svc.embedder.count_tokens)
            assert {cid: r.source_hash for cid, r in layout.items() if not r.deleted} == {
                w.chunk_id(self.conv, version): w.source_hash(version, self.svc.projector.policy)
                for w in planned
            }, version

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
            if row.indexed and not row.deleted and row.chunk_version == self.active:
                assert cid in live, cid

    def teardown(self) -> None:
        try:
            self.settle()
            # Upsert whatever is pending, then the live chunks of the searched version are
            # exactly a one-call build of the reference model's live turns.
            built = self.svc.ingest.build([], conversation_id=self.conv_as_sent())
            result = self.svc.ingest.upsert(built.chunks)
            assert not result.errors, result.errors
            current = sorted(
                c.text for c in self.stored() if c.metadata.chunk_version == self.active
            )
            ref_conv = self.conv + "-ref"
            ref_events = [
                dataclasses.replace(self.event(t), conversation_id=ref_conv)
                for t in self.live_turns()
            ]
            expected: list[str] = []
            if ref_events:
                ref = self.svc.ingest.build(ref_events, self.active, allow_gaps=True)
                expected = sorted(c.text for c in ref.chunks)
                assert not self.svc.ingest.upsert(ref.chunks).errors
            assert current == expected
        finally:
            self.held.clear()


def searched_versions(svc: Services) -> dict[str, str]:
    """Live chunks of each conversation's searched version (what a rebuild restores)."""
    out: dict[str, str] = {}
    with svc.log.snapshot() as log:
        rows = {c: log.conversation(c) for c in log.conversation_ids()}
    for conv, row in rows.items():
        assert row is not None
        chunks = svc.ingest.list_chunks(conv, False, 1000, "", row.active_version).chunks
        out.update({c.chunk_id: c.text for c in chunks})
    return out


def run_machine(
    services_dir: Path,
    embedder: Embedder,
    backend: dict[str, object],
    examples: int,
    steps: int,
    fixed_seed: bool = True,
) -> None:
    WritePath.data_dir = services_dir
    WritePath.embedder = embedder
    WritePath.backend = backend
    WritePath.services = build_services(settings_for(services_dir, **backend), embedder=embedder)
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
        before = searched_versions(WritePath.services)
    finally:
        WritePath.services.close()
    # Drop the projection and rebuild it from the log: the same live chunks.
    rebuilt = build_services(
        settings_for(services_dir, collection="rebuilt", **backend), embedder=embedder
    )
    try:
        with rebuilt.log.snapshot() as log:
            convs = log.conversation_ids()
        for conv in convs:
            until_idle(rebuilt, conv, timeout_s=300)
        after = searched_versions(rebuilt)
    finally:
        rebuilt.close()
    assert after == before


def test_write_path_state_machine(
    tmp_path: Path, embedder: Embedder, backend: dict[str, object]
) -> None:
    run_machine(tmp_path, embedder, backend, examples=25, steps=15)


@pytest.mark.soak
def test_write_path_soak(tmp_path: Path, embedder: Embedder, backend: dict[str, object]) -> None:
    run_machine(tmp_path, embedder, backend, examples=SOAK or 1000, steps=30, fixed_seed=False)
