from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from memsvc.app import Services
from memsvc.domain.errors import InvalidArgument
from memsvc.domain.hashing import content_hash
from memsvc.domain.ids import chunk_id
from memsvc.domain.records import StoredChunk
from memsvc.domain.types import (
    ChunkMetadata,
    ChunkRecord,
    SearchFilters,
    SearchMode,
    SearchRequest,
    TimestampRange,
    TurnRange,
)
from memsvc.services import selection
from memsvc.services.fusion import dedup_text, mmr_select, rrf_fuse, score_fuse
from memsvc.services.recent_records import RecentRecords
from tests.conftest import EN_TURNS, conversation, turn


def chunk(n: int, text: str, vec: list[float]) -> StoredChunk:
    meta = ChunkMetadata("c", TurnRange(n, n), TimestampRange(), (), ("user",), "other", 1)
    v = np.asarray(vec, dtype=np.float32)
    return StoredChunk(ChunkRecord(chunk_id("c", n, n, 1), text, meta), "", v / np.linalg.norm(v))


def test_rrf_rank_one_everywhere_scores_one() -> None:
    fused = rrf_fuse([[("a", 0.9), ("b", 0.5)], [("a", 7.0), ("c", 3.0)]], [1.0, 1.0])
    assert fused[0][0] == "a" and fused[0][1] == pytest.approx(1.0)
    assert {x for x, _ in fused[1:]} == {"b", "c"}
    assert fused[1][1] == pytest.approx(fused[2][1])  # both ranked second once
    weighted = rrf_fuse([[("b", 0.9)], [("c", 1.0)]], [1.0, 3.0])
    assert weighted[0][0] == "c"


def test_score_fusion_scales_each_list_by_its_best() -> None:
    dense = [("a", 0.8), ("b", 0.4)]
    keyword = [("b", 12.0), ("c", 3.0)]
    fused = dict(score_fuse([dense, keyword], [1.0, 1.0]))
    assert fused == pytest.approx({"a": 0.5, "b": 0.75, "c": 0.125})
    # Best in every list scores 1.0; weights shift the balance.
    assert dict(score_fuse([[("a", 0.5)], [("a", 9.0)]], [1.0, 1.0])) == pytest.approx({"a": 1})
    weighted = score_fuse([dense, keyword], [3.0, 1.0])
    assert [cid for cid, _ in weighted] == ["a", "b", "c"]
    # Unlike ranks, a clear winner stays ahead of a close runner-up in its list: RRF
    # puts "x" (first by far in one list) level with "y" (second in both).
    lists = [[("x", 0.9), ("y", 0.3)], [("z", 10.0), ("y", 9.9), ("x", 0.5)]]
    assert score_fuse(lists, [1.0, 1.0])[0][0] == "y"
    assert [cid for cid, _ in score_fuse([[("n", -0.2)], [("k", 2.0)]], [1.0, 1.0])] == [
        "k",
        "n",
    ]


def test_score_fusion_counts_dense_scores_above_the_models_unrelated_floor() -> None:
    """multilingual-e5-small scores everything 0.7-0.9: scaled by the best alone, its
    first and its twentieth candidate were 1.0 and 0.9, and keyword scores decided hybrid
    ranking alone (LoCoMo dev hybrid below MiniLM's although its dense list was better)."""
    dense = [("a", 0.88), ("b", 0.78)]
    keyword = [("b", 10.0), ("a", 6.0)]
    assert score_fuse([dense, keyword], [1.0, 1.0])[0][0] == "b"  # keyword decides
    fused = dict(score_fuse([dense, keyword], [1.0, 1.0], [0.74, 0.0]))
    assert fused == pytest.approx({"a": (1.0 + 0.6) / 2, "b": (0.04 / 0.14 + 1.0) / 2})
    assert max(fused, key=fused.__getitem__) == "a"
    # at or below the floor a dense candidate adds nothing
    assert dict(score_fuse([[("x", 0.7), ("y", 0.9)]], [1.0], [0.74])) == {"y": 1.0, "x": 0.0}
    # and those it levels keep the order of their own scores, not of their chunk ids (a
    # node restored from an export ranked them otherwise: test_cli's backup test)
    levelled = score_fuse([[("a", 0.70), ("b", 0.72), ("c", 0.9)]], [1.0], [0.74])
    assert [cid for cid, _ in levelled] == ["c", "b", "a"]


def test_dedup_keeps_best_of_identical_texts() -> None:
    a, a2, b = (chunk(i, t, [1, 0]) for i, t in enumerate(["same", "same", "other"]))
    records = {c.record.chunk_id: c for c in (a, a2, b)}
    ranked = [(a.record.chunk_id, 0.9), (a2.record.chunk_id, 0.8), (b.record.chunk_id, 0.7)]
    ranked.append(("gone", 0.6))  # removed since the search: no record
    assert [cid for cid, _ in dedup_text(ranked, records)] == [
        a.record.chunk_id,
        b.record.chunk_id,
    ]


def test_mmr_prefers_diverse_candidates() -> None:
    a, a2, b = chunk(0, "a", [1, 0]), chunk(1, "a2", [0.99, 0.01]), chunk(2, "b", [0, 1])
    vectors = {c.record.chunk_id: c for c in (a, a2, b)}
    text = {c.record.chunk_id: c.record.text for c in (a, a2, b)}
    ranked = [(a.record.chunk_id, 0.9), (a2.record.chunk_id, 0.89), (b.record.chunk_id, 0.5)]
    assert [text[c] for c, _ in mmr_select(ranked, vectors, 2, 1.0)] == ["a", "a2"]
    assert [text[c] for c, _ in mmr_select(ranked, vectors, 2, 0.3)] == ["a", "b"]


@pytest.mark.providers
def test_filters_hold_in_every_mode(services: Services) -> None:
    for conv in ("s1", "s2"):
        built = services.ingest.build(conversation(conv, EN_TURNS))
        services.ingest.upsert(built.chunks)
    services.deletion.delete("s1", TurnRange(0, 1), [])
    base = SearchRequest("golden retriever hiking", 10, SearchFilters(conversation_ids=("s1",)))
    for mode in SearchMode:
        for mmr in (0.0, 0.5):
            req = dataclasses.replace(base, mode=mode, mmr_lambda=mmr)
            found = services.search.search(req)
            hits = found.hits
            assert found.mode is mode and found.top_k == 10
            assert hits, (mode, mmr)
            assert {h.metadata.conversation_id for h in hits} == {"s1"}
            assert not any(h.metadata.deleted for h in hits)
            scores = [h.score for h in hits]
            assert scores == sorted(scores, reverse=True)
            late = dataclasses.replace(
                req,
                filters=SearchFilters(
                    ("s1", "s2"),
                    timestamp_range=TimestampRange(start="2026-02-02T10:04:00+08:00"),
                    speakers=("assistant",),
                ),
            )
            hits = services.search.search(late).hits
            assert hits and all(h.metadata.timestamp_range.end >= "2026-02-02T10:04" for h in hits)
            assert all("assistant" in h.metadata.speakers for h in hits)


def test_search_rejects_bad_requests(services: Services) -> None:
    with pytest.raises(InvalidArgument) as err:
        services.search.search(SearchRequest("q", mmr_lambda=1.5))
    assert err.value.field == "mmr_lambda"
    with pytest.raises(InvalidArgument) as err:
        services.search.embed_batch([], False)
    assert err.value.field == "texts"


@pytest.mark.parametrize("mode", list(SearchMode))
def test_a_long_query_is_refused_or_cut_to_its_end(services: Services, mode: SearchMode) -> None:
    """Issue 83: frameworks pass a whole conversation as the query. Refused by default,
    naming the field; with keep_query_end, its end is searched, within the characters
    and the model's tokens, from a word's start."""
    services.ingest.upsert(services.ingest.build(conversation("lq", EN_TURNS)).chunks)
    head = "Earlier we talked about many unrelated things, " * 150
    asked = head + "what about the golden retriever and the hiking trip?"
    req = SearchRequest(asked, 5, SearchFilters(("lq",)), mode)
    with pytest.raises(InvalidArgument) as err:
        services.search.search(req)
    assert err.value.field == "query_text"
    found = services.search.search(dataclasses.replace(req, keep_query_end=True))
    assert found.hits and asked.endswith(found.query_text)
    assert found.query_cut == len(asked) - len(found.query_text) > 0
    assert len(found.query_text) <= 4096 and found.query_text[0] not in " ,"
    assert asked[-len(found.query_text) - 1] == " "  # cut at a word's start
    if mode is not SearchMode.KEYWORD:  # it fits the model, and nearly fills it
        info = services.embedder.info
        limit = info.max_tokens - info.special_tokens
        (n,) = services.embedder.count_tokens([(info.query_instruction or "") + found.query_text])
        assert limit - 20 <= n <= limit
    short = services.search.search(
        dataclasses.replace(req, query_text="hiking", keep_query_end=True)
    )
    assert (short.query_text, short.query_cut) == ("hiking", 0)


def test_many_identical_texts_are_skipped_in_few_reads(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: an unscoped search over a store where the same chunk text sits in many
    conversations read the records six at a time past every duplicate (one store read per
    slice: ~1 s at 100,000 chunks). Slices now double, and the log's text hashes tell the
    copies apart before any read: only the hits are read."""
    copies = 40
    for i in range(copies):
        built = services.ingest.build(conversation(f"same{i:02d}", EN_TURNS))
        services.ingest.upsert(built.chunks)
    texts = {c.record.text for c in services.store.chunks_of(None, deleted=None)}
    assert 1 < len(texts) < 6  # every candidate past the first few is a duplicate
    reads: list[int] = []
    real_get = services.store.get

    def counting_get(
        chunk_ids: list[str], with_vectors: bool = False, **kwargs: Any
    ) -> dict[str, StoredChunk]:
        reads.append(len(chunk_ids))
        return real_get(chunk_ids, with_vectors, **kwargs)

    monkeypatch.setattr(services.store, "get", counting_get)
    hits = services.search.search(SearchRequest("golden retriever hiking", 6)).hits
    assert sorted(h.text for h in hits) == sorted(texts)  # each text once
    # Each text's record was read once, never a copy's; the log was asked in doubling
    # slices (24, 48, 96, ...), so at most one read per slice.
    assert sum(reads) == len(texts)
    assert len(reads) <= (copies * len(texts) // 24).bit_length() + 1


def removed_before_the_read(
    services: Services, monkeypatch: pytest.MonkeyPatch, removed: str
) -> None:
    """From now on the store's reads miss `removed`, as if it went between a search and
    its read; recent records are forgotten, so the next search reads its hits."""
    monkeypatch.setattr(services.search.current.selector, "recent", RecentRecords(0))
    real_get = services.store.get

    def get_without(
        chunk_ids: list[str], with_vectors: bool = False, **kwargs: Any
    ) -> dict[str, StoredChunk]:
        got = real_get(chunk_ids, with_vectors, **kwargs)
        return {k: v for k, v in got.items() if k != removed}

    monkeypatch.setattr(services.store, "get", get_without)


def test_a_copy_stands_in_for_a_hit_removed_between_search_and_read(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copies are skipped by the log's text hash before any read: when the hit they were
    skipped for is gone by the time it is read, the best-ranked copy is returned instead."""
    for i in range(3):
        services.ingest.upsert(services.ingest.build(conversation(f"copy{i}", EN_TURNS)).chunks)
    request = SearchRequest("golden retriever hiking", 6)
    before = services.search.search(request).hits
    removed = before[0].chunk_id
    removed_before_the_read(services, monkeypatch, removed)
    after = services.search.search(request).hits
    assert removed not in {h.chunk_id for h in after}
    assert sorted(h.text for h in after) == sorted(h.text for h in before)  # each text once
    stand_in = next(h for h in after if h.text == before[0].text)
    assert stand_in.metadata.conversation_id != before[0].metadata.conversation_id


def test_hit_removed_between_search_and_read_is_replaced_by_the_next(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Distinct long turns: each is a chunk of its own, so no hit's turns cover another's.
    filler = " We also talked about the weather and other ordinary things for a while." * 12
    turns = [f"{text} (day {i}){filler}" for i, text in enumerate(EN_TURNS * 3)]
    built = services.ingest.build(conversation("gone", turns))
    assert all(c.metadata.turn_range.start == c.metadata.turn_range.end for c in built.chunks)
    services.ingest.upsert(built.chunks)
    top_k = len({c.text for c in built.chunks}) - 1
    assert top_k >= 2
    request = SearchRequest("golden retriever hiking", top_k)
    before = services.search.search(request).hits
    removed = before[0].chunk_id
    removed_before_the_read(services, monkeypatch, removed)
    after = services.search.search(request).hits
    assert [h.chunk_id for h in after][: top_k - 1] == [h.chunk_id for h in before[1:]]
    assert len(after) == top_k and removed not in {h.chunk_id for h in after}


@pytest.mark.providers
@pytest.mark.parametrize("mode", [SearchMode.DENSE, SearchMode.KEYWORD])
def test_single_list_search_reads_whole_records_in_the_search(
    services: Services, monkeypatch: pytest.MonkeyPatch, mode: SearchMode
) -> None:
    # A dense or keyword search has few candidates: their records come with the search,
    # no second round trip (a read by id was a third of a search's time at 100k chunks).
    built = services.ingest.build(conversation("whole", EN_TURNS))
    services.ingest.upsert(built.chunks)
    stored = {c.record.chunk_id: c.record for c in services.store.chunks_of(None, deleted=None)}
    reads = counted_reads(services, monkeypatch)
    hits = services.search.search(SearchRequest("golden retriever", 6, mode=mode)).hits
    assert hits and reads == []
    for h in hits:
        assert (h.text, h.metadata) == (stored[h.chunk_id].text, stored[h.chunk_id].metadata)


def counted_reads(services: Services, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    reads: list[list[str]] = []
    real_get = services.store.get

    def counting_get(
        chunk_ids: list[str], with_vectors: bool = False, **kwargs: Any
    ) -> dict[str, StoredChunk]:
        reads.append(list(chunk_ids))
        return real_get(chunk_ids, with_vectors, **kwargs)

    monkeypatch.setattr(services.store, "get", counting_get)
    return reads


def stored_records(services: Services, conv: str) -> dict[str, ChunkRecord]:
    return {c.record.chunk_id: c.record for c in services.store.chunks_of(conv, deleted=None)}


@pytest.mark.providers
@pytest.mark.parametrize("turn_budget", [0, 20])
def test_hybrid_hits_returned_recently_are_not_read_again(
    services: Services, monkeypatch: pytest.MonkeyPatch, turn_budget: int
) -> None:
    """Also under a turn budget, where late window hits are narrowed by their turn lines:
    with an embedder that writes none (a remote one), a record kept without them is not
    read again for lines it never has."""
    services.ingest.upsert(services.ingest.build(conversation("again", EN_TURNS)).chunks)
    reads = counted_reads(services, monkeypatch)
    request = SearchRequest("golden retriever hiking", 3, turn_budget=turn_budget)
    first = services.search.search(request).hits
    assert first and reads and {h.chunk_id for h in first} <= {c for r in reads for c in r}
    reads.clear()
    second = services.search.search(request).hits
    assert reads == []
    # the same hits; their scores to float noise: a remote embedder (Infinity batches
    # requests together) can answer the same query with vectors a few ulps apart
    assert [dataclasses.replace(h, score=0.0) for h in second] == [
        dataclasses.replace(h, score=0.0) for h in first
    ]
    assert [h.score for h in second] == pytest.approx([h.score for h in first], rel=1e-6)


def test_a_recent_record_is_never_returned_once_its_chunk_changed_or_was_deleted(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records are kept by content hash: an edited chunk is read anew (its hash changed),
    a deleted one is left out (the log says so), an audit reads the deleted flag."""
    texts = [f"{t} (day {i})" for i, t in enumerate(EN_TURNS * 2)]
    services.ingest.upsert(services.ingest.build(conversation("edit", texts)).chunks)
    request = SearchRequest("golden retriever hiking", 4)
    before = services.search.search(request).hits
    hit = before[0]
    edited_turn = hit.metadata.turn_range.start
    edit = turn("edit", edited_turn, "Biscuit is a golden retriever who hates hiking now.")
    services.ingest.upsert(services.ingest.build([edit]).chunks)
    after = services.search.search(request).hits
    now = stored_records(services, "edit")
    assert after
    for h in after:  # what the store holds now, never what was kept before the edit
        assert (h.text, h.metadata) == (now[h.chunk_id].text, now[h.chunk_id].metadata)
    assert any("hates hiking" in h.text for h in after)

    kept = after[0]
    services.deletion.delete("edit", kept.metadata.turn_range, [])
    live = services.search.search(request).hits
    assert kept.chunk_id not in {h.chunk_id for h in live}
    audit = SearchRequest(
        "golden retriever hiking", 20, filters=SearchFilters(include_deleted=True)
    )
    everything = services.search.search(audit).hits
    deleted = {h.chunk_id: h.metadata.deleted for h in everything}
    assert deleted.get(kept.chunk_id) is True


@pytest.mark.parametrize(
    "request_",
    [
        SearchRequest("golden retriever hiking", 4),
        SearchRequest("golden retriever hiking", 4, mode=SearchMode.DENSE),
        SearchRequest("golden retriever hiking", 4, mode=SearchMode.DENSE, turn_budget=20),
        SearchRequest("golden retriever hiking", 4, mode=SearchMode.KEYWORD, turn_budget=20),
    ],
    ids=["hybrid", "dense", "dense-budget", "keyword-budget"],
)
@pytest.mark.parametrize("kept", [True, False], ids=["recent-kept", "read"])
def test_a_store_row_that_differs_from_the_log_is_never_returned(
    services: Services, monkeypatch: pytest.MonkeyPatch, request_: SearchRequest, kept: bool
) -> None:
    """Candidates carry no content hash: what a hit holds is judged by the log's layout and
    the record read (or kept from a recent read). A row rewritten in the store behind the
    log's back, still matching the query, never reaches the caller, whether its earlier
    record is kept or it is read anew."""
    services.ingest.upsert(services.ingest.build(conversation("drift", EN_TURNS)).chunks)
    before = services.search.search(request_).hits
    assert before
    target = services.store.get([before[0].chunk_id], with_vectors=True)[before[0].chunk_id]
    forged = dataclasses.replace(
        target.record, text=target.record.text + " golden retriever hiking, forged"
    )
    services.store.upsert(
        [dataclasses.replace(target, record=forged, content_hash=content_hash(forged))]
    )
    if not kept:
        monkeypatch.setattr(services.search.current.selector, "recent", RecentRecords(0))
    after = services.search.search(request_).hits
    assert after and all("forged" not in h.text for h in after)
    with services.log.snapshot() as r:
        layout = r.layout_rows([h.chunk_id for h in after])
    for h in after:  # what the log holds live, byte for byte
        record = ChunkRecord(h.chunk_id, h.text, h.metadata)
        assert layout[h.chunk_id].content_hash == content_hash(record)
    if not kept:
        assert target.record.chunk_id not in {h.chunk_id for h in after}


def test_recent_records_keep_the_most_recent_without_vectors() -> None:
    recent = RecentRecords(2)
    a, b, c = (chunk(i, f"text {i}", [1, 0]) for i in range(3))
    a, b, c = (dataclasses.replace(x, content_hash=f"h{i}") for i, x in enumerate((a, b, c)))
    recent.keep([a, b])
    assert recent.take([(a.record.chunk_id, "h0")]) == {
        a.record.chunk_id: dataclasses.replace(a, vector=None)
    }
    recent.keep([c])  # b was used least recently: it goes
    wanted = [(x.record.chunk_id, f"h{i}") for i, x in enumerate((a, b, c))]
    assert set(recent.take(wanted)) == {a.record.chunk_id, c.record.chunk_id}
    assert recent.take([(a.record.chunk_id, "another hash"), (a.record.chunk_id, "")]) == {}
    assert RecentRecords(0).take(wanted) == {}


@pytest.mark.providers
def test_a_hybrid_search_of_a_few_chunks_returns_them_whole_from_its_dense_list(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation of at most WHOLE_SCOPE_AT_MOST chunks is in the dense list whole: no
    read follows the search (a round trip of ~1.5 ms at a million chunks), the hits are the
    ones a read gives, and they are kept for the next search. A larger scope, or one whose
    chunks are all kept, is searched for ids and scores alone."""
    built = services.ingest.build(conversation("few", EN_TURNS))
    services.ingest.upsert(built.chunks)
    assert len(built.chunks) <= selection.WHOLE_SCOPE_AT_MOST
    request = SearchRequest("golden retriever hiking", 3, filters=SearchFilters(("few",)))
    selector = services.search.current.selector
    monkeypatch.setattr(selection, "WHOLE_SCOPE_AT_MOST", 0)
    read = services.search.search(request).hits
    monkeypatch.setattr(selection, "WHOLE_SCOPE_AT_MOST", 16)
    monkeypatch.setattr(selector, "recent", RecentRecords(100))
    asked: list[bool] = []
    real_search = services.store.search_dense

    def recording_search(*args: Any, **kwargs: Any) -> Any:
        asked.append(bool(args[3] if len(args) > 3 else kwargs.get("whole", False)))
        return real_search(*args, **kwargs)

    monkeypatch.setattr(services.store, "search_dense", recording_search)
    reads = counted_reads(services, monkeypatch)
    whole = services.search.search(request).hits
    assert (asked, reads) == ([True], [])
    assert [dataclasses.replace(h, score=0.0) for h in whole] == [
        dataclasses.replace(h, score=0.0) for h in read
    ]
    again = services.search.search(request).hits  # every chunk kept: ids and scores only
    assert (asked, reads) == ([True, False], [])
    assert [h.chunk_id for h in again] == [h.chunk_id for h in whole]

    monkeypatch.setattr(selector, "recent", RecentRecords(100))
    monkeypatch.setattr(selection, "WHOLE_SCOPE_AT_MOST", len(built.chunks) - 1)
    larger = services.search.search(request).hits
    assert [h.chunk_id for h in larger] == [h.chunk_id for h in whole]
    assert asked[-1] is False and reads
