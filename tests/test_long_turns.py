"""Long turns (retrieval v3): a long turn is a unit of its own, cut into parts within the
part budget that keep every word, each part carrying the turn's vector (its head and
gist); a chunk whose turn changed since its build is not stored; truncation says so."""

from __future__ import annotations

import numpy as np

from memsvc.app import Services
from memsvc.domain.chunking import ChunkPolicy, plan_windows
from memsvc.domain.oversize import truncate
from memsvc.domain.types import (
    REASON_MISMATCH,
    MemoryEvent,
    SearchFilters,
    SearchMode,
    SearchRequest,
    TurnRange,
)
from memsvc.domain.vectors import combine, gist
from memsvc.embedding.model import Embedder
from tests.conftest import conversation, turn
from tests.support.retrieval import chars, stored

FILLER = (
    " The build uses a small Flask service, a SQLite file for the ledger and a cron job"
    " that exports the monthly report as CSV for the accountant."
)


def long_turn(i: int) -> str:
    return f"Release notes part {i}: the ledger export now rounds to cents." + FILLER * 14


def test_a_long_turn_is_a_unit_of_its_own() -> None:
    policy = ChunkPolicy(turn_unit_tokens=40, part_tokens=60)
    turns = [
        stored(0, "user", "short question"),
        stored(1, "assistant", "x" * 50),  # over 40 with its label: a unit
        stored(2, "user", "ok"),
        stored(3, "assistant", "fine"),
    ]
    windows = plan_windows(turns, policy, chars)
    spans = [(w.start_turn, w.end_turn) for w in windows]
    assert (1, 1) in spans
    assert all(not (w.start_turn <= 1 <= w.end_turn) or len(w.turns) == 1 for w in windows)
    assert (2, 3) in spans  # short turns are still grouped into exchanges


def test_parts_of_a_turn_unit_fit_the_part_budget_and_keep_every_word() -> None:
    policy = ChunkPolicy(turn_unit_tokens=40, part_tokens=60)
    text = " ".join(f"Sentence number {i} says something." for i in range(20))
    windows = plan_windows([stored(0, "assistant", text)], policy, chars)
    assert len(windows) > 1
    assert all(len(w.piece) + 8 <= 60 for w in windows)  # 8: the role label's tokens
    assert " ".join(w.piece for w in windows).split() == text.split()
    assert {w.head for w in windows} == {windows[0].piece}


def test_gist_is_the_start_within_its_tokens(embedder: Embedder) -> None:
    text = "I'm trying to plan my sprint and I need the deadline." + FILLER * 10
    start = gist(text, 64, embedder.count_tokens)
    assert text.startswith(start) and embedder.count_tokens([start])[0] <= 64
    assert len(start) > 100
    assert gist("short text", 64, embedder.count_tokens) == "short text"


def test_every_part_of_a_turn_carries_the_turn_vector(
    services: Services, embedder: Embedder
) -> None:
    built = services.ingest.build(conversation("tv", ["What changed?", long_turn(1)]))
    services.ingest.upsert(built.chunks)
    parts = [c for c in built.chunks if c.metadata.turn_range == TurnRange(1, 1)]
    assert len(parts) > 1 and {c.metadata.part_count for c in parts} == {len(parts)}
    rows = services.store.get([c.chunk_id for c in parts], with_vectors=True)
    vectors = [rows[c.chunk_id].vector for c in parts]
    head = parts[0].text.split("\n", 1)[1].split(": ", 1)[1]  # the first part, no label
    with services.log.snapshot() as r:
        text = r.events("tv", [1])[1].clean_text
    expected = combine(embedder.encode_passages([head, gist(text, 64, embedder.count_tokens)]))
    for v in vectors:
        assert np.allclose(v, expected, atol=1e-5)


def test_a_chunk_whose_turn_changed_since_its_build_is_not_stored(services: Services) -> None:
    built = services.ingest.build(conversation("ed", ["Where is it?", long_turn(2)]))
    services.ingest.append([turn("ed", 1, long_turn(3))])  # an edit the layout has not seen
    result = services.ingest.upsert(built.chunks)
    stale = {e.chunk_id for e in result.errors if e.reason == REASON_MISMATCH}
    assert stale and all(
        c.metadata.turn_range.start == 1 for c in built.chunks if c.chunk_id in stale
    )
    again = services.ingest.build([], conversation_id="ed")
    assert not services.ingest.upsert(again.chunks).errors
    hits = services.search.search(
        SearchRequest("Release notes part 3", 3, SearchFilters(("ed",)), SearchMode.KEYWORD)
    ).hits
    assert hits and "part 3" in hits[0].text


def test_truncation_keeps_the_limit_and_says_so() -> None:
    events = [MemoryEvent("c", 0, "user", "y" * 5000, "2026-02-02T10:00:00Z")]
    out, cut = truncate(events, 1000)
    assert len(out[0].text) == 1000 and out[0].text.startswith("y" * 900)
    assert "truncated by memsvc" in out[0].text and "5,000" in out[0].text
    assert cut[0].field == "events[0].text" and cut[0].original_chars == 5000
    assert cut[0].kept_chars == out[0].text.index(" [")
    assert truncate(out, 1000) == (out, [])
