"""Which hits a search returns (retrieval v3): each brings turns no earlier hit gave, a
turn budget bounds the turns returned, and time and newest order."""

from __future__ import annotations

import dataclasses

import pytest

from memsvc.app import Services
from memsvc.domain.errors import InvalidArgument
from memsvc.domain.types import (
    SearchFilters,
    SearchMode,
    SearchOrder,
    SearchRequest,
)
from tests.conftest import turn
from tests.support.retrieval import chat, covered


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


def test_a_conversation_with_turn_ids_far_apart_is_searched_within_a_budget(
    services: Services,
) -> None:
    # issue 62, item 13, on the server: turns 0 and 10**12 are two chunks, and a budgeted
    # search counts the turns they hold, not the ids between them
    far = 10**12
    services.ingest.append(
        [turn("far", 0, "The ferry leaves at noon."), turn("far", far, "The ferry was late.")],
        allow_gaps=True,
    )
    services.worker.notify()
    assert services.control.wait_for_indexed("far", far, 120) is not None
    ranges = {
        (c.metadata.turn_range.start, c.metadata.turn_range.end)
        for c in services.ingest.list_chunks("far", False, 100, "").chunks
    }
    assert ranges == {(0, 0), (far, far)}
    found = services.search.search(
        SearchRequest("ferry", 10, SearchFilters(("far",)), turn_budget=2)
    ).hits
    assert sorted(
        t for h in found for t in range(h.metadata.turn_range.start, h.metadata.turn_range.end + 1)
    ) == [0, far]
