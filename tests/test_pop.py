"""PopEvents: an agent session's pop in one call (issue 63: the Agents SDK's pop_item took
two round trips, an export of the newest turn and a delete, 15x SQLiteSession's at 1,000
items). The newest live turns come back as appended and are deleted in one transaction,
so callers popping at once never get the same turn. On both event logs."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsvc.app import Services
from memsvc.domain.errors import FailedPrecondition, InvalidArgument, ReplyTooLarge
from memsvc.domain.limits import MAX_RESPONSE_BYTES
from memsvc.domain.pages import ITEM_OVERHEAD_BYTES
from memsvc.domain.records import EventRow
from memsvc.domain.types import MemoryEvent
from memsvc.transports.grpc.convert import event_to_pb
from memsvc.v1 import memory_pb2 as pb


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
    turns, token = [], ""
    while True:  # every page: pages are cut by bytes
        exported, token = svc.ingest.export_events(conv, 0, token)
        turns += [e.turn_id for e in exported]
        if not token:
            return turns


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


def test_a_turn_over_the_reply_budget_is_refused_and_stays(services_on_both: Services) -> None:
    """Issue 81, item 1: a pop over 4 MiB deleted the turn and the stock client's receive
    limit lost it. Now the size is checked before the commit: refused, nothing deleted."""
    svc = services_on_both
    # ~4.8 MB of UTF-8 in 4-byte characters, as in the report (within the limits)
    big = MemoryEvent("pop-huge", 0, "user", "big", "", payload="\U0001f600" * 1_200_000)
    svc.ingest.append([*said("pop-huge", 1), big], assign_turn_ids=True)
    with pytest.raises(ReplyTooLarge, match="max_reply_bytes") as refused:
        svc.deletion.pop("pop-huge", 1)
    assert "4,800," in str(refused.value)  # the bytes it needs
    with pytest.raises(ReplyTooLarge):
        svc.deletion.pop("pop-huge", 2, max_reply_bytes=4 * 1024 * 1024)
    assert live_turns(svc, "pop-huge") == [0, 1]  # nothing deleted
    with pytest.raises(InvalidArgument, match="max_reply_bytes"):
        svc.deletion.pop("pop-huge", 1, max_reply_bytes=MAX_RESPONSE_BYTES + 1)
    # a caller that can receive it gets it (and only what fits beside it)
    (popped,) = svc.deletion.pop("pop-huge", 2, max_reply_bytes=4_800_200)
    assert popped.payload == big.payload
    assert live_turns(svc, "pop-huge") == [0]


def test_a_keyed_pop_retried_returns_the_first_turns(services_on_both: Services) -> None:
    """Issue 81, item 2: a pop whose answer was lost, retried, popped a second turn. With a
    key the retry returns what the first deleted and deletes nothing more."""
    svc = services_on_both
    svc.ingest.append(said("pop-keyed", 4), assign_turn_ids=True)
    first = svc.deletion.pop("pop-keyed", 2, idempotency_key="k-1")
    again = svc.deletion.pop("pop-keyed", 2, idempotency_key="k-1")
    assert [e.turn_id for e in first] == [e.turn_id for e in again] == [2, 3]
    assert [e.payload for e in again] == [e.payload for e in said("pop-keyed", 4)[2:]]
    assert live_turns(svc, "pop-keyed") == [0, 1]
    with pytest.raises(InvalidArgument, match="idempotency_key"):
        svc.deletion.pop("pop-keyed", 1, idempotency_key="k-1")  # another request
    # the same key on another conversation, or for an append, is another write
    assert svc.deletion.pop("pop-none-keyed", 2, idempotency_key="k-1") == []
    svc.ingest.append(said("pop-none-keyed", 1), assign_turn_ids=True)
    assert svc.deletion.pop("pop-none-keyed", 2, idempotency_key="k-1") == []  # as answered
    assert live_turns(svc, "pop-none-keyed") == [0]
    # once purged, the text cannot come back: the retry says so
    svc.deletion.purge_deleted("pop-keyed")
    with pytest.raises(FailedPrecondition, match="purged"):
        svc.deletion.pop("pop-keyed", 2, idempotency_key="k-1")


_names = st.text(min_size=0, max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    conv=st.text(min_size=1, max_size=512),
    turn_id=st.integers(0, 2**53 - 1),
    speaker=st.sampled_from(["user", "assistant", "system"]),
    text=st.text(max_size=3000),
    payload=st.text(max_size=3000),
    long_part=st.integers(0, 300_000),
    participants=st.lists(_names, max_size=64),
    speaker_name=_names,
)
def test_a_turns_page_size_bounds_its_size_on_the_wire(
    conv: str,
    turn_id: int,
    speaker: str,
    text: str,
    payload: str,
    long_part: int,
    participants: list[str],
    speaker_name: str,
) -> None:
    """The pop's budget is checked with EventRow.size before the commit: it must never be
    less than what the reply then takes on the wire, or a stock client's limit is passed."""
    row = EventRow(
        conversation_id=conv,
        turn_id=turn_id,
        speaker=speaker,
        speaker_name=speaker_name,
        text=text + "\U0001f600" * long_part,  # lengths that take 4-byte varints
        clean_text="",
        timestamp="2026-02-02T10:15:30.123456+08:00",
        participants=tuple(participants),
        tokens=0,
        payload=payload,
    )
    wire = pb.PopEventsResponse(events=[event_to_pb(row.as_appended())]).ByteSize()
    assert wire <= row.size() + ITEM_OVERHEAD_BYTES
