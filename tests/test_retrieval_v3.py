"""Retrieval v3: long turns as units of their own, turn vectors, hits that each bring new
turns within a budget, standing instructions, time order, oversize turns."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from memsvc.app import Services
from memsvc.domain.chunking import ChunkPolicy, StoredTurn, plan_windows
from memsvc.domain.errors import InvalidArgument
from memsvc.domain.oversize import truncate
from memsvc.domain.records import Candidate
from memsvc.domain.standing import INSTRUCTION_TAG, is_standing
from memsvc.domain.types import (
    REASON_MISMATCH,
    MemoryEvent,
    SearchFilters,
    SearchMode,
    SearchOrder,
    SearchRequest,
    TurnRange,
)
from memsvc.domain.vectors import combine, gist
from memsvc.embedding.model import Embedder
from memsvc.ports import SearchScope
from tests.conftest import conversation, turn

FILLER = (
    " The build uses a small Flask service, a SQLite file for the ledger and a cron job"
    " that exports the monthly report as CSV for the accountant."
)


def chars(texts: list[str]) -> list[int]:
    """A stand-in token counter: one token per character."""
    return [len(t) for t in texts]


def stored(i: int, speaker: str, text: str) -> StoredTurn:
    return StoredTurn(i, speaker, text, f"2026-02-02T10:{i:02d}:00+08:00", tokens=len(text))


# -- layout ------------------------------------------------------------------------------------
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


# -- standing instructions --------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "Always include version numbers when I ask about software dependencies.",
        "Please never use emojis in your answers.",
        "From now on, answer in French.",
        "Whenever I ask about triangles, compare two methods.",
        "I'm building it in Flask and I prefer minimal dependencies, can you help?",
        "You should always cite the documentation page.",
        "以后请用中文回答。",
        "每次我问数据库的问题，请附上SQL。",
        "我更喜欢简短的回答。",
    ],
)
def test_standing_instructions_are_recognised(text: str) -> None:
    assert is_standing(text)


@pytest.mark.parametrize(
    "text",
    [
        "Keep going and never give up!",
        "They brighten up our day and always make us smile.",
        "I'm so glad we can always be there for each other.",
        "Always good to hear! See you later!",
        "他总是迟到。",
        "What is the capital of France?",
    ],
)
def test_habits_and_chat_are_not_instructions(text: str) -> None:
    assert not is_standing(text)


def test_only_the_user_or_system_gives_instructions(services: Services) -> None:
    said = "Always include version numbers when I ask about libraries."
    built = services.ingest.build(
        [turn("rule", 0, "hello", "user"), turn("rule", 1, f"Sure. {said}", "assistant")]
    )
    assert all(c.metadata.intent_tag != INSTRUCTION_TAG for c in built.chunks)
    built = services.ingest.build([turn("rule", 2, said, "user")])
    assert any(c.metadata.intent_tag == INSTRUCTION_TAG for c in built.chunks)


def test_a_standing_instruction_is_a_window_of_its_own() -> None:
    rule = "Always include version numbers when I ask about libraries."
    turns = [
        stored(0, "user", "My ledger app runs on Flask 2.3 with SQLite."),
        stored(1, "assistant", "Nice stack."),
        stored(2, "user", rule),
        stored(3, "assistant", "Noted."),
        stored(4, "user", "The export runs monthly."),
        stored(5, "assistant", "Good."),
    ]
    windows = plan_windows(turns, ChunkPolicy(), chars)
    assert [w.turns for w in windows if 2 in {t.turn_id for t in w.turns}] == [(turns[2],)]
    covered = {t.turn_id for w in windows for t in w.turns}
    assert covered == set(range(6))  # the turns around the rule are still chunked
    # The same rule from the assistant is not one: the exchange stays whole.
    said = [dataclasses.replace(t, speaker="assistant") if t.turn_id == 2 else t for t in turns]
    assert any(
        len(w.turns) > 1 and w.start_turn <= 2 <= w.end_turn
        for w in plan_windows(said, ChunkPolicy(), chars)
    )


def test_a_fact_said_beside_a_rule_is_a_hit(services: Services) -> None:
    # Regression: the fact and the rule shared a chunk, tagged instruction, so the fact
    # came back only in `standing` and `hits` had nothing about it.
    fact = "My ledger app stores every invoice in a SQLite file called books.db."
    rule = "Always include version numbers when I ask about libraries."
    texts = [fact, "Good choice.", rule, "Noted, I will."] + [
        f"Let's talk about day {i} of the hiking trip and the weather." for i in range(12)
    ]
    services.ingest.upsert(services.ingest.build(conversation("fr", texts)).chunks)
    found = services.search.search(
        SearchRequest("Where are my invoices stored?", 6, SearchFilters(("fr",)))
    )
    assert fact in found.hits[0].text
    assert found.hits[0].metadata.intent_tag != INSTRUCTION_TAG
    assert all(fact not in h.text for h in found.standing)


# -- vectors -----------------------------------------------------------------------------------
def test_gist_is_the_start_within_its_tokens(embedder: Embedder) -> None:
    text = "I'm trying to plan my sprint and I need the deadline." + FILLER * 10
    start = gist(text, 64, embedder.count_tokens)
    assert text.startswith(start) and embedder.count_tokens([start])[0] <= 64
    assert len(start) > 100
    assert gist("short text", 64, embedder.count_tokens) == "short text"


def long_turn(i: int) -> str:
    return f"Release notes part {i}: the ledger export now rounds to cents." + FILLER * 14


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


# -- hits, budgets, order ------------------------------------------------------------------------
def chat(conv: str, n: int) -> list[MemoryEvent]:
    topics = ["hiking", "the ledger", "Biscuit the puppy", "the sprint", "Lake Tahoe", "CSV"]
    return [
        turn(
            conv,
            i,
            f"Turn {i} talks about {topics[i % len(topics)]} again.",
            ts=f"2026-02-{1 + i // 10:02d}T10:{i % 60:02d}:00+00:00",
        )
        for i in range(n)
    ]


def covered(hit: object) -> set[int]:
    """The turns a hit returns: its own list when narrowed, else its chunk's range."""
    if hit.turns:  # type: ignore[attr-defined]
        return set(hit.turns)  # type: ignore[attr-defined]
    r = hit.metadata.turn_range  # type: ignore[attr-defined]
    return set(range(r.start, r.end + 1))


def test_each_hit_brings_turns_no_earlier_hit_gave(services: Services) -> None:
    services.ingest.upsert(services.ingest.build(chat("nt", 40)).chunks)
    hits = services.search.search(
        SearchRequest("hiking ledger puppy", 100, SearchFilters(("nt",)))
    ).hits
    seen: set[int] = set()
    for h in hits:
        assert covered(h) - seen, h.metadata.turn_range
        seen |= covered(h)


@pytest.mark.parametrize("mode", list(SearchMode))
def test_a_turn_budget_bounds_the_turns_returned(services: Services, mode: SearchMode) -> None:
    services.ingest.upsert(services.ingest.build(chat("tb", 40)).chunks)
    for budget in (4, 7, 20):  # a window holds up to 4 turns: no smaller budget fits one
        found = services.search.search(
            SearchRequest(
                "hiking ledger puppy", 0, SearchFilters(("tb",)), mode, turn_budget=budget
            )
        )
        turns = set().union(*(covered(h) for h in [*found.standing, *found.hits]))
        assert 0 < len(turns) <= budget
    with pytest.raises(InvalidArgument) as err:
        services.search.search(SearchRequest("x", turn_budget=-1))
    assert err.value.field == "turn_budget"


def test_standing_instructions_come_beside_the_hits(services: Services) -> None:
    rule = "Always include version numbers when I ask about software dependencies or libraries."
    texts = [rule, "Noted, I will."] + [
        f"Let's talk about day {i} of the hiking trip and the weather." for i in range(20)
    ]
    services.ingest.upsert(services.ingest.build(conversation("st", texts)).chunks)
    query = "Which libraries does my project depend on?"
    found = services.search.search(SearchRequest(query, 6, SearchFilters(("st",))))
    assert [h.metadata.intent_tag for h in found.standing] == [INSTRUCTION_TAG]
    assert rule in found.standing[0].text
    assert found.standing[0].chunk_id not in {h.chunk_id for h in found.hits}
    without = services.search.search(
        SearchRequest(query, 6, SearchFilters(("st",)), standing=False)
    )
    assert not without.standing
    keyword = services.search.search(
        SearchRequest(query, 6, SearchFilters(("st",)), SearchMode.KEYWORD)
    )
    assert not keyword.standing
    unrelated = services.search.search(
        SearchRequest("weather on the hiking trip", 6, SearchFilters(("st",)))
    )
    assert all(h.score >= 0.25 for h in unrelated.standing)


def test_a_search_asks_the_store_for_rules_only_where_the_log_holds_some(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The standing list is a second store search: a search of conversations whose layout
    holds no standing instruction makes one, and a rule written later is found at once."""
    rule = "Always include version numbers when I ask about software dependencies or libraries."
    chat = [f"Let's talk about day {i} of the hiking trip and the weather." for i in range(8)]
    for conv, texts in (("rules", [rule, "Noted, I will.", *chat]), ("plain", chat)):
        services.ingest.upsert(services.ingest.build(conversation(conv, texts)).chunks)
    store = services.search.store
    searched: list[str] = []
    search_dense = store.search_dense

    def counted(vector: np.ndarray, scope: SearchScope, *args: object) -> list[Candidate]:
        searched.append(scope.filters.intent_tag or "all")
        return search_dense(vector, scope, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "search_dense", counted)
    query = "Which libraries does my project depend on?"

    def stores_searched(request: SearchRequest) -> tuple[list[str], list[str]]:
        searched.clear()
        found = services.search.search(request)
        return sorted(searched), [h.text for h in found.standing]

    for mode in (SearchMode.DENSE, SearchMode.HYBRID):
        assert stores_searched(SearchRequest(query, 6, SearchFilters(("plain",)), mode)) == (
            ["all"],
            [],
        )
        searches, standing = stores_searched(
            SearchRequest(query, 6, SearchFilters(("plain", "rules")), mode)
        )
        assert searches == ["all", INSTRUCTION_TAG] and rule in standing[0]
        searches, standing = stores_searched(SearchRequest(query, 6, mode=mode))
        assert searches == ["all", INSTRUCTION_TAG] and rule in standing[0]
    services.ingest.upsert(
        services.ingest.build([turn("plain", len(chat), rule, speaker="user")]).chunks
    )
    searches, standing = stores_searched(SearchRequest(query, 6, SearchFilters(("plain",))))
    assert searches == ["all", INSTRUCTION_TAG] and rule in standing[0]


def test_time_and_newest_order(services: Services) -> None:
    services.ingest.upsert(services.ingest.build(chat("to", 40)).chunks)
    base = SearchRequest("hiking ledger puppy sprint", 8, SearchFilters(("to",)))
    relevance = services.search.search(base).hits
    oldest = services.search.search(dataclasses.replace(base, order=SearchOrder.TIME)).hits
    newest = services.search.search(dataclasses.replace(base, order=SearchOrder.NEWEST)).hits
    assert (
        {h.chunk_id for h in oldest}
        == {h.chunk_id for h in relevance}
        == {h.chunk_id for h in newest}
    )
    starts = [h.metadata.timestamp_range.start for h in oldest]
    assert starts == sorted(starts)
    assert [h.chunk_id for h in newest] == [h.chunk_id for h in reversed(oldest)]


# -- oversize turns ----------------------------------------------------------------------------
def test_truncation_keeps_the_limit_and_says_so() -> None:
    events = [MemoryEvent("c", 0, "user", "y" * 5000, "2026-02-02T10:00:00Z")]
    out, cut = truncate(events, 1000)
    assert len(out[0].text) == 1000 and out[0].text.startswith("y" * 900)
    assert "truncated by memsvc" in out[0].text and "5,000" in out[0].text
    assert cut[0].field == "events[0].text" and cut[0].original_chars == 5000
    assert cut[0].kept_chars == out[0].text.index(" [")
    assert truncate(out, 1000) == (out, [])
