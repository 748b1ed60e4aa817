"""Search filters on time: a range spans a chunk from its earliest to its latest turn, and
a range that starts after it ends is invalid (issue 24), on both event-log backends."""

from __future__ import annotations

import pytest

from memsvc.app import Services
from memsvc.domain.errors import InvalidArgument
from memsvc.domain.types import (
    SearchFilters,
    SearchRequest,
    TimestampRange,
)
from tests.conftest import turn
from tests.support.integrity import found, sync


def test_a_time_range_filter_spans_a_chunks_earliest_to_latest_turn(
    services_on_both: Services,
) -> None:
    services = services_on_both  # on both event-log backends
    events = [
        turn("tr", 0, "We moved the meeting to the afternoon.", ts="2026-03-01T15:00:00+00:00"),
        turn(
            "tr",
            1,
            "Back-dated note: the morning call was cancelled.",
            ts="2026-03-01T08:00:00+00:00",
        ),
    ]
    sync(services, events)
    chunk = next(iter(services.ingest.list_chunks("tr", False, 10, "").chunks))
    assert chunk.metadata.timestamp_range == TimestampRange(
        "2026-03-01T08:00:00+00:00", "2026-03-01T15:00:00+00:00"
    )
    window = TimestampRange("2026-03-01T07:30:00+00:00", "2026-03-01T08:30:00+00:00")
    assert "morning call" in found(services, "tr", "morning call cancelled", timestamp_range=window)


def test_a_time_range_starting_after_it_ends_is_invalid(services_on_both: Services) -> None:
    services = services_on_both  # on both event-log backends
    backwards = TimestampRange("2026-03-02T00:00:00+00:00", "2026-03-01T00:00:00+00:00")
    with pytest.raises(InvalidArgument) as err:
        services.search.search(SearchRequest("x", 5, SearchFilters(timestamp_range=backwards)))
    assert err.value.field == "filters.timestamp_range"
