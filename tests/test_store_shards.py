"""A store in shards (issue 85) answers as one collection would: a randomized sequence of
writes, deletes and reads on real Milvus Lite, a store of four shards under a memory budget
that holds about one (so shards are released and loaded again throughout), checked step by
step against a dictionary of the rows it should hold. Then what a shard layout keeps: its
count across restarts, shard 0 as the collection of a one-shard store, loading on first use
after a restart, the gauge of loaded shards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from structlog.testing import capture_logs

from memsvc.domain.records import Candidate, StoredChunk
from memsvc.domain.types import SearchFilters
from memsvc.ports import SearchScope
from memsvc.storage.milvus import lite, schema
from memsvc.storage.milvus import store as milvus_store
from memsvc.storage.milvus.shards import (
    BYTES_PER_ROW,
    ShardMap,
    asked_again,
    first_ask,
    merged,
    shard_index,
)
from memsvc.storage.milvus.store import MilvusChunkStore
from tests.test_store import DIM, ident, record

CONVERSATIONS = [f"t{t}/c{c}" for t in range(3) for c in range(4)]
SHARDS = 4


def shard_store(path: Path, budget_rows: int = 0, by_tenant: bool = False) -> MilvusChunkStore:
    return MilvusChunkStore(
        str(path / "m.db"),
        "c",
        ident("m"),
        shards=SHARDS,
        # Milvus Lite's own memory before any row counts against a budget
        memory_budget_bytes=budget_rows * BYTES_PER_ROW + lite.BASE_BYTES if budget_rows else 0,
        memory_held_outside=lambda: 0,  # the rows alone: this test process's memory aside
        shards_by_tenant=by_tenant,
    )


def scoped(*conversations: str) -> SearchScope:
    # every row written here is current: the default filter then keeps live rows
    return SearchScope(SearchFilters(conversation_ids=conversations))


def nearest(rows: dict[str, StoredChunk], query: np.ndarray, convs: set[str] | None) -> list[str]:
    scored = [
        (float(np.dot(query, c.vector)), cid)
        for cid, c in rows.items()
        if c.vector is not None
        and not c.record.metadata.deleted
        and (convs is None or c.record.metadata.conversation_id in convs)
    ]
    return [cid for _, cid in sorted(scored, reverse=True)]


class ShardedStoreMachine(RuleBasedStateMachine):
    """The store against `model`: chunk id -> the row it holds."""

    by_tenant = False

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="shards-"))
        self.store = shard_store(self.dir, budget_rows=6, by_tenant=self.by_tenant)
        self.model: dict[str, StoredChunk] = {}
        self.turn = 0

    def teardown(self) -> None:
        self.store.close()

    @rule(conv=st.sampled_from(CONVERSATIONS), n=st.integers(1, 3))
    def write(self, conv: str, n: int) -> None:
        rows = []
        for _ in range(n):
            self.turn += 2
            rows.append(record(conv, self.turn, f"{conv} turn {self.turn}"))
        self.store.upsert(rows)
        self.model.update((r.record.chunk_id, r) for r in rows)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), named=st.booleans())
    def delete(self, data: st.DataObject, named: bool) -> None:
        cid = data.draw(st.sampled_from(sorted(self.model)))
        conv = self.model[cid].record.metadata.conversation_id
        self.store.delete([cid], [conv] if named else ())
        del self.model[cid]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def hide(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.model)))
        got = self.store.get(
            [cid],
            with_vectors=True,
            conversations=[self.model[cid].record.metadata.conversation_id],
        )
        self.store.set_deleted(list(got.values()))
        self.model[cid] = _deleted(got[cid])

    @rule(data=st.data(), named=st.booleans())
    def get(self, data: st.DataObject, named: bool) -> None:
        ids = data.draw(st.lists(st.sampled_from(sorted(self.model) or ["chk_none"]), max_size=4))
        ids += ["chk_missing"]
        convs = {self.model[c].record.metadata.conversation_id for c in ids if c in self.model}
        got = self.store.get(ids, conversations=convs if named else ())
        assert set(got) == {c for c in ids if c in self.model}
        for cid, chunk in got.items():
            assert chunk.record == self.model[cid].record

    @rule(conv=st.sampled_from(CONVERSATIONS))
    def reads_of_one_conversation(self, conv: str) -> None:
        mine = {c for c, r in self.model.items() if r.record.metadata.conversation_id == conv}
        assert {c.record.chunk_id for c in self.store.chunks_of(conv, deleted=None)} == mine
        assert set(self.store.digests(conv)) == mine
        live = {c for c in mine if not self.model[c].record.metadata.deleted}
        spans = self.store.live_overlapping(conv, None)
        assert {c.record.chunk_id for c in spans} == live

    @rule(
        convs=st.lists(st.sampled_from(CONVERSATIONS), max_size=3, unique=True),
        seed=st.integers(0, 99),
        limit=st.integers(1, 16),
    )
    def search(self, convs: list[str], seed: int, limit: int) -> None:
        """Past 8, a search of several shards asks each for fewer than `limit` first
        (shards.first_ask), and again in full those whose rows could rank higher."""
        query = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
        found = self.store.search_dense(query, scoped(*convs), limit)
        want = nearest(self.model, query, set(convs) if convs else None)[:limit]
        assert [c.chunk_id for c in found] == want

    @rule(prefix=st.sampled_from(["t0/", "t1/", "t2/c1", "t", ""]), seed=st.integers(0, 99))
    def search_a_prefix(self, prefix: str, seed: int) -> None:
        """A token limited to a prefix: by tenant, a prefix with a "/" asks one shard."""
        query = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
        scope = SearchScope(prefixes=(prefix,) if prefix else ())
        asked = self.store.shards.for_scope(scope)
        found = self.store.search_dense(query, scope, 8)
        mine = {c: r for c, r in self.model.items() if c and _conv(r).startswith(prefix)}
        assert [c.chunk_id for c in found] == nearest(mine, query, None)[:8]
        tenant_wide = self.by_tenant and "/" in prefix
        assert len(asked) == (1 if tenant_wide else SHARDS)

    @invariant()
    def every_row_and_count(self) -> None:
        assert set(self.store.digests()) == set(self.model)
        assert self.store.count(deleted=None) == len(self.model)
        # each row in the shard of its conversation
        for cid, row in self.store.digests().items():
            assert self.store.shards.of(row[0]) == self.store.shards.of(
                self.model[cid].record.metadata.conversation_id
            )


def _conv(chunk: StoredChunk) -> str:
    return chunk.record.metadata.conversation_id


def _deleted(chunk: StoredChunk) -> StoredChunk:
    from dataclasses import replace

    meta = replace(chunk.record.metadata, deleted=True)
    return replace(chunk, record=replace(chunk.record, metadata=meta))


ShardedStoreMachine.TestCase.settings = settings(
    max_examples=12,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_a_store_in_shards_answers_as_one_collection = ShardedStoreMachine.TestCase


class ByTenantMachine(ShardedStoreMachine):
    by_tenant = True


ByTenantMachine.TestCase.settings = ShardedStoreMachine.TestCase.settings
test_a_store_in_shards_by_tenant_answers_as_one_collection = ByTenantMachine.TestCase


def test_a_search_of_shards_asks_again_those_whose_rows_could_rank_higher() -> None:
    """Each shard is asked for its share first; one that returned all it was asked for and
    whose last still ranks among the best `limit` of all may hold more of them."""

    def part(*scores: float) -> list[Candidate]:
        return [Candidate(f"{s}", s) for s in scores]

    assert first_ask(300, 32) == 23 and first_ask(5, 4) == 5 and first_ask(16, 4) == 12
    # one shard holds every best row: it alone is asked again
    parts = [part(0.9, 0.8, 0.7), part(0.3, 0.2), part(0.1)]
    assert asked_again(parts, 3, 4) == [0]
    # the best 4 are 0.9, 0.8, 0.7 and 0.6: shard 1's last (0.4) ranks below them
    assert asked_again([part(0.9, 0.8, 0.7), part(0.6, 0.5, 0.4)], 3, 4) == [0]
    # fewer than `limit` came back: every shard that returned all it was asked for
    assert asked_again([part(0.9, 0.8), part(0.6, 0.5), part(0.4)], 2, 6) == [0, 1]
    assert asked_again(parts, 4, 4) == []
    assert [c.score for c in merged(parts, 4)] == [0.9, 0.8, 0.7, 0.3]


def test_a_search_of_shards_finds_the_best_rows_when_one_shard_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One conversation of 40 rows beside eleven of one: the best of an unscoped search
    are mostly in one shard, which answers its first ask in full and is asked again."""
    store = shard_store(tmp_path)
    rows = [record("t0/c0", 2 * i, f"long {i}") for i in range(40)]
    rows += [record(c, 1000 + 2 * i, f"short {i}") for i, c in enumerate(CONVERSATIONS[1:])]
    store.upsert(rows)
    model = {r.record.chunk_id: r for r in rows}
    again: list[list[int]] = []

    def recording(parts: Any, asked: int, limit: int) -> list[int]:
        again.append(asked_again(parts, asked, limit))
        return again[-1]

    monkeypatch.setattr(milvus_store, "asked_again", recording)
    try:
        for seed in range(4):
            query = np.random.default_rng(seed).random(DIM).astype(np.float32)
            for limit in (16, 30, 51):
                found = store.search_dense(query, SearchScope(SearchFilters()), limit)
                assert [c.chunk_id for c in found] == nearest(model, query, None)[:limit]
    finally:
        store.close()
    assert any(again)


def test_shard_routing_is_stable_and_spreads_conversations() -> None:
    # the hash is the store's layout on disk: it must never change
    assert [shard_index(c, 64) for c in ("a", "acme/u1", "会话")] == [
        shard_index("a", 64),
        shard_index("acme/u1", 64),
        shard_index("会话", 64),
    ]
    assert shard_index("anything", 1) == 0
    counts = np.bincount([shard_index(f"t{i % 50}/c{i}", 64) for i in range(64_000)], minlength=64)
    assert counts.min() > 0.8 * 1000 and counts.max() < 1.2 * 1000
    assert ShardMap("c", 4).names == ["c", "c_shard1", "c_shard2", "c_shard3"]


def test_shards_by_tenant_hold_a_tenant_in_one_and_its_searches_ask_that_one() -> None:
    by_tenant = ShardMap("c", 64, by_tenant=True)
    assert len({by_tenant.of(f"t7/c{i}") for i in range(100)}) == 1
    assert by_tenant.of("t7/c1") == ShardMap("c", 64).of("t7/")  # the tenant's own hash
    assert len({by_tenant.of(f"t{i}/c1") for i in range(100)}) > 30
    tenant = SearchScope(prefixes=("t7/", "t7/c1"))
    assert by_tenant.for_scope(tenant) == [by_tenant.of("t7/c1")]
    assert by_tenant.for_scope(SearchScope(prefixes=("t7/", "t8/"))) == [
        by_tenant.of("t7/"),
        by_tenant.of("t8/"),
    ]
    # a prefix without "/" spans tenants (`t7` holds `t7/...` and `t70/...`): every shard
    assert len(by_tenant.for_scope(SearchScope(prefixes=("t7",)))) == 64
    assert len(ShardMap("c", 64).for_scope(tenant)) == 64
    named = SearchScope(SearchFilters(conversation_ids=("t7/c1", "t8/c1")), prefixes=("t7/",))
    assert by_tenant.for_scope(named) == [by_tenant.of("t7/"), by_tenant.of("t8/")]


def test_a_store_keeps_the_placement_it_was_made_with(tmp_path: Path) -> None:
    store = shard_store(tmp_path, by_tenant=True)
    rows = [record(c, 2, f"{c} hello") for c in CONVERSATIONS]
    store.upsert(rows)
    store.close()
    with capture_logs() as logs:
        again = MilvusChunkStore(str(tmp_path / "m.db"), "c", ident("m"), shards=SHARDS)
    try:
        assert again.shards.by_tenant
        assert any(e["event"] == "store_shards_kept" for e in logs)
        for conv in CONVERSATIONS:
            assert [c.record.chunk_id for c in again.chunks_of(conv)] == [
                r.record.chunk_id for r in rows if _conv(r) == conv
            ]
    finally:
        again.close()
    one = MilvusChunkStore(str(tmp_path / "one.db"), "c", ident("m"), shards_by_tenant=True)
    try:
        assert (one.shards.count, one.shards.by_tenant) == (1, False)
    finally:
        one.close()


def test_a_store_keeps_its_shards_and_loads_them_when_used(tmp_path: Path) -> None:
    store = shard_store(tmp_path)
    rows = [record(c, 2, f"{c} hello") for c in CONVERSATIONS]
    store.upsert(rows)
    store.close()
    # opened again with another count configured: the count it was made with is kept
    with capture_logs() as logs:
        again = MilvusChunkStore(str(tmp_path / "m.db"), "c", ident("m"), shards=1)
    try:
        assert again.shards.count == SHARDS
        assert any(e["event"] == "store_shards_kept" for e in logs)
        # nothing loaded until used; a read of one conversation loads its shard alone
        assert again.residency.progress() == (0, SHARDS)
        conv = CONVERSATIONS[0]
        assert [c.record.chunk_id for c in again.chunks_of(conv)] == [rows[0].record.chunk_id]
        assert again.residency.progress() == (1, SHARDS)
        # a count reads the others without loading them
        assert again.count(deleted=None) == len(rows)
        assert again.residency.progress() == (1, SHARDS)
        query = np.ones(DIM, dtype=np.float32)
        assert len(again.search_dense(query, SearchScope(), 50)) == len(rows)
        assert again.residency.progress() == (SHARDS, SHARDS)
    finally:
        again.close()


def test_a_memory_budget_releases_the_least_recently_used_shards(tmp_path: Path) -> None:
    store = shard_store(tmp_path, budget_rows=4)
    try:
        by_shard: dict[str, list[str]] = {}
        for c in CONVERSATIONS:
            by_shard.setdefault(store.shards.of(c), []).append(c)
        assert len(by_shard) >= 3
        for convs in by_shard.values():
            store.upsert([record(c, t, f"{c} {t}") for c in convs[:1] for t in (2, 4, 6)])
        # three rows a shard, a budget of four rows: one shard loaded at a time
        loaded, _ = store.residency.progress()
        assert loaded == 1 and store.residency.releases >= len(by_shard) - 1
        for convs in by_shard.values():
            assert len(store.chunks_of(convs[0])) == 3
        assert store.residency.progress()[0] == 1
    finally:
        store.close()


def test_a_memory_budget_counts_what_the_node_holds_outside_the_shards(tmp_path: Path) -> None:
    """The budget bounds the node: memory held outside the shards (memsvc's own, as the
    app counts it; here a fixed amount) leaves the shards the rest."""
    outside_rows = 0

    def held_outside() -> int:
        return outside_rows * BYTES_PER_ROW

    store = MilvusChunkStore(
        str(tmp_path / "m.db"),
        "c",
        ident("m"),
        shards=SHARDS,
        memory_budget_bytes=10 * BYTES_PER_ROW + lite.BASE_BYTES,
        memory_held_outside=held_outside,
    )
    try:
        by_shard: dict[str, str] = {}
        for c in CONVERSATIONS:
            by_shard.setdefault(store.shards.of(c), c)
        firsts = list(by_shard.values())[:3]
        for c in firsts:
            store.upsert([record(c, t, f"{c} {t}") for t in (2, 4, 6)])
        # three rows a shard, ten rows of budget and nothing outside: three shards fit
        assert store.residency.progress()[0] == 3 and store.residency.releases == 0
        outside_rows = 7  # the node's own memory grew: room for one shard's rows
        assert len(store.chunks_of(firsts[0])) == 3  # used: loaded, or kept
        store.upsert([record(firsts[1], 8, f"{firsts[1]} 8")])  # a write makes room
        assert store.residency.progress()[0] == 1
        for c in firsts:
            assert len(store.chunks_of(c)) == (4 if c == firsts[1] else 3)
        assert store.residency.progress()[0] == 1
    finally:
        store.close()


def test_a_budget_below_what_the_node_holds_outside_the_shards_is_named(
    tmp_path: Path,
) -> None:
    """A budget that memsvc's own memory already fills keeps no shard loaded past its call:
    the log says so at start, with both figures."""
    from structlog.testing import capture_logs

    store = MilvusChunkStore(
        str(tmp_path / "m.db"),
        "c",
        ident("m"),
        shards=SHARDS,
        memory_budget_bytes=64 << 20,
        memory_held_outside=lambda: 200 << 20,
    )
    try:
        with capture_logs() as logs:
            store.load_in_background()
        said = [e for e in logs if e["event"] == "store_budget_below_node"]
        assert said and said[0]["budget_mib"] == 64 and said[0]["held_outside_mib"] == 200 + 32
        store.upsert([record(c, 2, f"{c} 2") for c in CONVERSATIONS])
        assert {c: len(store.chunks_of(c)) for c in CONVERSATIONS} == dict.fromkeys(
            CONVERSATIONS, 1
        )
    finally:
        store.close()


def test_the_shards_of_a_collection_are_dropped_with_it(tmp_path: Path) -> None:
    from memsvc.storage.milvus.previous import PreviousCollection

    store = shard_store(tmp_path)
    try:
        client: Any = store._client
        assert schema.shard_names(client, "c") == ShardMap("c", SHARDS).names
        assert schema.is_shard(client, "c_shard2") and not schema.is_shard(client, "c")
        # a moved-from collection in shards, beside the store: dropped whole at the move's end
        schema.ensure_collection(client, "old", store.uri, ident("m"), shards=3)
        assert schema.shard_names(client, "old") == ["old", "old_shard1", "old_shard2"]
        PreviousCollection(store, "old", ident("m")).drop()
        assert not any(n.startswith("old") for n in client.list_collections())
    finally:
        store.close()


def test_a_ping_behind_a_shard_load_does_not_take_the_store_for_down(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Regression (scale v3, under a memory budget at a million chunks): Milvus Lite serves
    one call at a time, so the health ping behind a shard's load (seconds at ~30,000 rows)
    timed out, the store was marked down and its Milvus Lite restarted mid-load. A ping
    does not ask while a load is in flight; once none is, a failing ping is down again."""
    import threading

    store = shard_store(tmp_path)
    rows = [record(c, 2, f"{c} hello") for c in CONVERSATIONS]
    store.upsert(rows)
    store.close()
    store = shard_store(tmp_path)  # opened again: nothing loaded
    try:
        loading, finish = threading.Event(), threading.Event()
        load = store._client.load_collection

        def slow_load(name: str, **kw: Any) -> None:
            loading.set()
            assert finish.wait(60)
            load(name, **kw)

        monkeypatch.setattr(store._client, "load_collection", slow_load)

        def stuck_behind_the_load(*args: Any, **kw: Any) -> str:
            raise TimeoutError("DEADLINE_EXCEEDED")

        monkeypatch.setattr(schema, "collection_id", stuck_behind_the_load)
        reader = threading.Thread(target=store.chunks_of, args=(CONVERSATIONS[0],))
        reader.start()
        assert loading.wait(60)
        assert store.ping()  # behind the load: not asked
        finish.set()
        reader.join(60)
        assert not store.residency.loading
        assert not store.ping()  # no load in flight: the failed ping counts
    finally:
        finish.set()
        store.close()
