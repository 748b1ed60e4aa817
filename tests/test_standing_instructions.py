"""Standing instructions (retrieval v3): recognised from the user or the system only, never
habits or chat; a window of their own; a fact said beside a rule still a hit; returned
beside the hits; the store asked for them only where the log holds some."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from memsvc.app import Services
from memsvc.domain.chunking import ChunkPolicy, plan_windows
from memsvc.domain.records import Candidate
from memsvc.domain.standing import INSTRUCTION_TAG, is_standing
from memsvc.domain.types import (
    SearchFilters,
    SearchMode,
    SearchRequest,
)
from memsvc.ports import SearchScope
from tests.conftest import conversation, turn
from tests.support.retrieval import chars, stored


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


def test_a_small_budget_keeps_most_of_its_turns_for_the_hits(services: Services) -> None:
    # Three rules applied to a query took 3 of a 5-turn budget, leaving 2 turns of hits:
    # on BEAM dev (e5) the main questions found 0.428 within 5 turns, one vector per turn
    # 0.531. A rule now takes at most one turn in five of a budget.
    rules = [
        "Always include version numbers when I ask about Python libraries.",
        "Always mention the license of any Python library you suggest.",
        "Never suggest Python libraries that are no longer maintained.",
    ]
    texts = [t for rule in rules for t in (rule, "Noted, I will.")] + [
        f"Let's talk about day {i} of the hiking trip and the weather." for i in range(20)
    ]
    services.ingest.upsert(services.ingest.build(conversation("sb", texts)).chunks)

    def standing(budget: int) -> int:
        query = "Which Python library should I use to parse dates?"
        request = SearchRequest(query, 0, SearchFilters(("sb",)), turn_budget=budget)
        return len(services.search.search(request).standing)

    assert [standing(b) for b in (0, 5, 9, 10, 20)] == [3, 1, 1, 2, 3]


def test_a_search_asks_the_store_for_rules_only_where_the_log_holds_some(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The standing list is a second store search: a search of conversations whose layout
    holds no standing instruction makes one, and a rule written later is found at once."""
    rule = "Always include version numbers when I ask about software dependencies or libraries."
    chat = [f"Let's talk about day {i} of the hiking trip and the weather." for i in range(8)]
    for conv, texts in (("rules", [rule, "Noted, I will.", *chat]), ("plain", chat)):
        services.ingest.upsert(services.ingest.build(conversation(conv, texts)).chunks)
    store = services.search.current.store
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


def test_a_search_of_every_conversation_asks_for_rules_only_where_the_log_holds_some(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scale v3: a search naming no conversation looked for standing instructions in every
    conversation, a call on each shard of a store in shards (~50 ms at a million chunks in
    32). It names the conversations holding some when they are few, and finds their rules
    as before; past that many it looks everywhere."""
    from memsvc.services import standing_rules

    rule = "Always include version numbers when I ask about software dependencies or libraries."
    chat = [f"Let's talk about day {i} of the hiking trip and the weather." for i in range(8)]
    for conv, texts in (
        ("t/rules", [rule, "Noted, I will.", *chat]),
        ("u/rules", ["Please never use emojis in your answers.", "OK.", *chat]),
        ("t/plain", chat),
    ):
        services.ingest.upsert(services.ingest.build(conversation(conv, texts)).chunks)
    store = services.search.current.store
    asked: list[tuple[str, ...]] = []
    search_dense = store.search_dense

    def recorded(vector: np.ndarray, scope: SearchScope, *args: object) -> list[Candidate]:
        if scope.filters.intent_tag == INSTRUCTION_TAG:
            asked.append(scope.filters.conversation_ids)
        return search_dense(vector, scope, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "search_dense", recorded)
    query = "Which libraries does my project depend on?"
    for mode in (SearchMode.DENSE, SearchMode.HYBRID):
        asked.clear()
        found = services.search.search(SearchRequest(query, 6, mode=mode))
        assert [set(convs) for convs in asked] == [{"t/rules", "u/rules"}]
        assert rule in found.standing[0].text
    monkeypatch.setattr(standing_rules, "STANDING_NARROWED_AT_MOST", 1)
    asked.clear()
    found = services.search.search(SearchRequest(query, 6))
    assert asked == [()] and rule in found.standing[0].text
    with services.log.snapshot() as r:  # a token limited to prefixes: theirs alone
        assert r.standing_conversations(["t/"], 10) == ["t/rules"]
        assert len(r.standing_conversations([], 1)) == 1
