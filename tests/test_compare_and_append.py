"""Compare-and-append (AppendEventsRequest.expected_last_turn): a writer that adds what it
found missing (two processes adding one growing ADK session, issue 63) writes only onto the
turn it read; a write that came first makes it read again, and nothing is added twice. On
both event logs."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from memsvc.app import Services
from memsvc.domain.errors import InvalidArgument
from memsvc.domain.types import REASON_LAST_TURN_MOVED, MemoryEvent, TurnRange


def said(conv: str, *texts: str) -> list[MemoryEvent]:
    return [MemoryEvent(conv, 0, "user", t, "") for t in texts]


def last_turn(svc: Services, conv: str) -> int:
    """As a caller reads it: GetIndexStatus's last_appended_turn (-1: none)."""
    rows = svc.control.status([conv])
    return rows[0].last_appended_turn if rows else -1


def test_a_write_lands_only_on_the_turn_it_expected(services_on_both: Services) -> None:
    svc = services_on_both
    assert last_turn(svc, "cas") == -1
    first = svc.ingest.append(
        said("cas", "a", "b", "c"), assign_turn_ids=True, expected_last_turn={"cas": -1}
    )
    assert first.accepted == 3 and not first.errors
    assert last_turn(svc, "cas") == 2
    # expecting what is no longer true: refused with the reason, each event listed; the
    # other conversation of the same call is written
    stale = svc.ingest.append(
        [*said("cas", "d"), *said("cas-other", "e")],
        assign_turn_ids=True,
        expected_last_turn={"cas": -1},
    )
    assert stale.accepted == 1 and stale.turn_ids == [-1, 0]
    assert [e.reason for e in stale.errors] == [REASON_LAST_TURN_MOVED]
    assert "ends at turn 2, not -1" in stale.errors[0].message
    # a deleted turn still counts: ids once used are never given again
    svc.deletion.delete("cas", TurnRange(2, 2), [])
    assert last_turn(svc, "cas") == 2
    after_delete = svc.ingest.append(
        said("cas", "f"), assign_turn_ids=True, expected_last_turn={"cas": 2}
    )
    assert after_delete.turn_ids == [3]
    exported, _ = svc.ingest.export_events("cas", 0, "")
    assert [e.text for e in exported] == ["a", "b", "f"]


def test_of_writers_that_read_the_same_turn_one_writes(services_on_both: Services) -> None:
    svc = services_on_both
    svc.ingest.append(said("cas-race", "start"), assign_turn_ids=True)
    seen = last_turn(svc, "cas-race")
    meet = threading.Barrier(4)

    def add(i: int) -> int:
        meet.wait(timeout=30)
        result = svc.ingest.append(
            said("cas-race", f"from writer {i}", f"and more from {i}"),
            assign_turn_ids=True,
            expected_last_turn={"cas-race": seen},
        )
        return result.accepted

    with ThreadPoolExecutor(4) as pool:
        accepted = list(pool.map(add, range(4)))
    assert sorted(accepted) == [0, 0, 0, 2]
    exported, _ = svc.ingest.export_events("cas-race", 0, "")
    assert len(exported) == 3 and last_turn(svc, "cas-race") == 2


def test_expectations_are_checked_naming_the_field(services_on_both: Services) -> None:
    svc = services_on_both
    events = said("cas-check", "hello")
    with pytest.raises(InvalidArgument, match=r"expected_last_turn\['elsewhere'\]: names no"):
        svc.ingest.append(events, expected_last_turn={"elsewhere": -1})
    with pytest.raises(InvalidArgument, match=r"expected_last_turn\['cas-check'\]: must be -1"):
        svc.ingest.append(events, expected_last_turn={"cas-check": -2})
    with pytest.raises(InvalidArgument, match=r"expected_last_turn\['\\x00'\]"):
        svc.ingest.append(events, expected_last_turn={"\x00": -1})
    assert last_turn(svc, "cas-check") == -1  # nothing written by a refused call
    # a key names the expectation too: the same key expecting another turn is another write
    keyed = svc.ingest.append(
        events, assign_turn_ids=True, idempotency_key="k", expected_last_turn={"cas-check": -1}
    )
    assert keyed.accepted == 1
    with pytest.raises(InvalidArgument, match="idempotency_key"):
        svc.ingest.append(
            events, assign_turn_ids=True, idempotency_key="k", expected_last_turn={"cas-check": 0}
        )


def test_two_spellings_of_one_conversation_are_refused_in_any_order(
    services_on_both: Services,
) -> None:
    """Issue 81, item 5: NFC and NFD keys of one conversation with different expected turns
    were accepted or refused by the map's order. Now refused, naming both keys."""
    svc = services_on_both
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    for expected in ({nfc: -1, nfd: 5}, {nfd: 5, nfc: -1}):
        with pytest.raises(InvalidArgument) as refused:
            svc.ingest.append(said(nfc, "a"), assign_turn_ids=True, expected_last_turn=expected)
        assert repr(nfc) in str(refused.value) and repr(nfd) in str(refused.value)
    assert last_turn(svc, nfc) == -1  # nothing written
