"""Deletes: by any chunk id the conversation ever had, with no model call under the
writer lock, new turns on deleted ids refused, and a restore that brings an exported
conversation back (issues 24, 37 and 40), on both event-log backends."""

from __future__ import annotations

import threading

import pytest

from memsvc.app import Services
from memsvc.domain.access import Access, Role
from memsvc.domain.errors import PermissionDenied
from memsvc.domain.types import TurnRange
from memsvc.embedding.model import Embedder
from memsvc.services.turns import TurnsDeleted
from tests.conftest import EN_TURNS, conversation, turn
from tests.support.integrity import findable, found, live, sync
from tests.support.waiting import until_idle


def _free(svc: Services, conv: str) -> bool:
    """Whether the conversation's writer lock can be had within a second."""
    got = threading.Event()

    def take() -> None:
        with svc.locks.hold(conv):
            got.set()

    t = threading.Thread(target=take, daemon=True)
    t.start()
    return got.wait(1.0)


def test_deleting_a_superseded_tail_by_its_id_deletes_its_turns(services_on_both: Services) -> None:
    services = services_on_both  # on both event-log backends
    first = sync(services, conversation("tail", EN_TURNS[:2]))
    tail = first[-1].chunk_id
    sync(services, conversation("tail", EN_TURNS[2:4], start=2))
    assert tail not in live(services, "tail")  # replaced by a longer window
    result = services.deletion.delete("tail", None, [tail])
    assert result.errors == [] and result.events_deleted == 2
    assert "Biscuit" not in found(services, "tail", "puppy named Biscuit")


def test_6_a_delete_runs_no_model_under_the_writer_lock(
    services_on_both: Services, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (issue 37, 6): a delete embedded the surviving neighbours' new chunks
    while holding the conversation's lock; a Build of the same conversation waited 9 s."""
    svc = services_on_both
    texts = [f"Turn {i} is about the harbour, the ferry and the lighthouse." for i in range(12)]
    svc.ingest.upsert(svc.ingest.build(conversation("lk", texts)).chunks)
    locked_during_model: list[bool] = []
    real = embedder.encode_passages

    def watched(batch: list[str]) -> object:
        probe: list[bool] = []
        # another thread tries the conversation's lock while the model runs
        t = threading.Thread(target=lambda: probe.append(_free(svc, "lk")))
        t.start()
        t.join(30)
        locked_during_model.append(probe == [False])
        return real(batch)

    monkeypatch.setattr(embedder, "encode_passages", watched)
    result = svc.deletion.delete("lk", TurnRange(5, 5), [])
    assert result.events_deleted == 1
    assert locked_during_model and not any(locked_during_model)
    svc.ingest.build([turn("lk", 12, "And the ferry was late.")])


def test_8_new_turns_on_deleted_ids_are_an_error_not_duplicates(
    services_on_both: Services,
) -> None:
    """Regression (issue 37, 8): new turns sent with the ids of deleted turns were dropped
    silently, reported as duplicates, with WaitForIndexed true."""
    svc = services_on_both
    svc.ingest.upsert(svc.ingest.build(conversation("reuse", EN_TURNS[:4])).chunks)
    svc.deletion.delete("reuse", TurnRange(2, 3), [])
    fresh = [turn("reuse", 2, "A brand new turn on an old id."), turn("other", 0, "Unrelated.")]
    result = svc.ingest.append(fresh)
    assert (result.accepted, result.duplicates) == (1, 0)  # the other conversation is written
    assert [(e.chunk_id, e.reason) for e in result.errors] == [("reuse#2", "deleted")]
    assert "restore" in result.errors[0].message
    with pytest.raises(TurnsDeleted):
        svc.ingest.build([turn("reuse", 3, "Another new turn on an old id.")])
    assert not findable(svc, "reuse", ["A brand new turn on an old id."])


def test_restore_brings_an_exported_conversation_back(services_on_both: Services) -> None:
    """Export, delete, restore: the export's events are the conversation again (issue 40)."""
    svc = services_on_both
    svc.ingest.upsert(svc.ingest.build(conversation("back", EN_TURNS)).chunks)
    exported, _ = svc.ingest.export_events("back", 0, "")
    svc.deletion.delete("back", None, [])
    svc.deletion.purge_deleted("back")
    assert not findable(svc, "back", EN_TURNS[:1])
    refused = svc.ingest.append(exported, allow_gaps=True)
    assert refused.accepted == 0 and {e.reason for e in refused.errors} == {"deleted"}
    with pytest.raises(PermissionDenied):
        svc.ingest.append(exported, allow_gaps=True, access=Access(Role.WRITER), restore=True)
    restored = svc.ingest.append(exported, allow_gaps=True, restore=True)
    assert restored.accepted == len(EN_TURNS) and not restored.errors
    until_idle(svc, "back", timeout_s=120)
    assert svc.control.is_indexed("back", len(EN_TURNS) - 1)
    assert findable(svc, "back", EN_TURNS)
