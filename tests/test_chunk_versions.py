"""One version per conversation: reindexing, appending to a conversation built with
another version, retiring, and searches across conversations mid-migration (issue 24),
on both event-log backends."""

from __future__ import annotations

import pytest

from memsvc.app import Services
from memsvc.domain.errors import FailedPrecondition
from memsvc.domain.types import (
    SearchFilters,
    SearchRequest,
)
from tests.conftest import EN_TURNS, conversation, turn
from tests.support.integrity import found, sync
from tests.support.waiting import until_idle


def test_a_sync_build_with_the_default_version_after_a_reindex_is_searchable(
    services_on_both: Services,
) -> None:
    services = services_on_both  # on both event-log backends
    sync(services, conversation("v-a", EN_TURNS[:4]))
    services.control.reindex(["v-a"], 2)
    assert until_idle(services, "v-a").active_version == 2
    sync(services, [turn("v-a", 4, "The lighthouse keeper plays the cello.")])
    assert services.control.is_indexed("v-a", 4)
    assert "cello" in found(services, "v-a", "lighthouse keeper cello")
    versions = {
        c.metadata.chunk_version for c in services.ingest.list_chunks("v-a", False, 100, "").chunks
    }
    assert 2 in versions


def test_reindex_without_a_version_rebuilds_the_conversations_own(
    services_on_both: Services,
) -> None:
    services = services_on_both  # on both event-log backends
    sync(services, conversation("v-b", EN_TURNS))
    services.control.reindex(["v-b"], 2)
    until_idle(services, "v-b")
    assert services.control.request_reindex(["v-b"], False, 0, False) == 1
    item = until_idle(services, "v-b")
    assert (item.active_version, item.building_version) == (2, 0)
    services.ingest.append([turn("v-b", 6, "We repainted the boat teal.")])
    assert services.control.wait_for_indexed("v-b", 6, 60) is not None
    assert services.control.is_indexed("v-b", 6)
    assert "teal" in found(services, "v-b", "repainted boat teal")


def test_appends_to_a_conversation_built_with_another_version_are_searchable(
    services_on_both: Services,
) -> None:
    services = services_on_both  # on both event-log backends
    sync(services, conversation("v-c", EN_TURNS[:2]), chunk_version=3)
    services.ingest.append([turn("v-c", 2, "My sister collects antique maps.")])
    services.worker.notify()
    assert services.control.wait_for_indexed("v-c", 2, 60) is not None
    assert services.control.is_indexed("v-c", 2)
    hits = services.search.search(SearchRequest("antique maps", 5, SearchFilters(("v-c",)))).hits
    assert hits and hits[0].metadata.chunk_version == 3 and "antique maps" in hits[0].text


def test_retiring_the_searched_version_is_refused(services_on_both: Services) -> None:
    services = services_on_both  # on both event-log backends
    sync(services, conversation("v-d", EN_TURNS))
    with pytest.raises(FailedPrecondition, match="searched"):
        services.deletion.retire_version("v-d", 1)
    assert "Biscuit" in found(services, "v-d", "puppy named Biscuit")


def test_wide_searches_work_with_many_conversations_mid_migration(
    services_on_both: Services,
) -> None:
    services = services_on_both  # on both event-log backends
    convs = [f"mig-{i:02d}" for i in range(60)]
    for conv in convs:
        sync(services, [turn(conv, 0, f"Conversation {conv} talks about kayaks.")])
    assert services.control.reindex(convs, 2) == len(convs)
    for conv in convs:
        assert until_idle(services, conv).active_version == 2
    # every conversation now holds version 1 (kept until retired) and version 2
    hits = services.search.search(SearchRequest("kayaks", 100)).hits
    assert len(hits) == 60 and {h.metadata.chunk_version for h in hits} == {2}
