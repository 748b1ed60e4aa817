"""PopEvents: an agent session's pop in one call (issue 63: the Agents SDK's pop_item took
two round trips, an export of the newest turn and a delete, 15x SQLiteSession's at 1,000
items). The newest live turns come back as appended and are deleted in one transaction,
so callers popping at once never get the same turn. On both event logs."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from memsvc.app import Services
from memsvc.domain.errors import InvalidArgument
from memsvc.domain.types import MemoryEvent


def said(conv: str, count: int, payload_chars: int = 0) -> list[MemoryEvent]:
    return [
        MemoryEvent(
            conv,
            0,
            "user",
            f"item {i}",
            "",
            payload=json.dumps({"n": i, "pad": "x" * payload_chars}),
        )
        for i in range(count)
    ]


def live_turns(svc: Services, conv: str) -> list[int]:
    exported, _ = svc.ingest.export_events(conv, 0, "")
    return [e.turn_id for e in exported]


def test_a_pop_returns_the_newest_as_appended_and_deletes_it(services_on_both: Services) -> None:
    svc = services_on_both
    assert svc.deletion.pop("pop-none", 0) == []
    assert svc.queue.status(["pop-none"]) == []  # nothing to pop: no work recorded
    added = svc.ingest.append(said("pop-a", 5), assign_turn_ids=True)
    assert added.turn_ids == [0, 1, 2, 3, 4]
    (newest,) = svc.deletion.pop("pop-a", 0)
    assert (newest.turn_id, newest.text, newest.payload) == (
        4,
        "item 4",
        said("pop-a", 5)[4].payload,
    )
    assert live_turns(svc, "pop-a") == [0, 1, 2, 3]
    assert [e.turn_id for e in svc.deletion.pop("pop-a", 2)] == [2, 3]  # in turn order
    assert [e.turn_id for e in svc.deletion.pop("pop-a", 100)] == [0, 1]  # fewer are left
    assert svc.deletion.pop("pop-a", 1) == []
    # ids once used are never given again, and a popped turn is gone from every read
    assert svc.ingest.append(said("pop-a", 1), assign_turn_ids=True).turn_ids == [5]
    with pytest.raises(InvalidArgument, match="count"):
        svc.deletion.pop("pop-a", 101)


def test_callers_popping_at_once_get_different_turns(services_on_both: Services) -> None:
    svc = services_on_both
    svc.ingest.append(said("pop-race", 8), assign_turn_ids=True)
    meet = threading.Barrier(8)

    def pop(_: int) -> list[int]:
        meet.wait(timeout=30)
        return [e.turn_id for e in svc.deletion.pop("pop-race", 1)]

    with ThreadPoolExecutor(8) as pool:
        popped = [t for turns in pool.map(pop, range(8)) for t in turns]
    assert sorted(popped) == list(range(8))
    assert live_turns(svc, "pop-race") == []


def test_a_pop_is_cut_by_bytes_and_the_newest_always_comes(services_on_both: Services) -> None:
    svc = services_on_both
    svc.ingest.append(said("pop-big", 3, payload_chars=2_000_000), assign_turn_ids=True)
    assert [e.turn_id for e in svc.deletion.pop("pop-big", 3)] == [2]  # 2 MB each, 3 MiB a pop
    assert [e.turn_id for e in svc.deletion.pop("pop-big", 3)] == [1]
    assert live_turns(svc, "pop-big") == [0]
