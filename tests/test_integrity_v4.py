"""Integrity v4 (issue 37), what one process shows: purges fence writes in flight, no model
call under a writer lock, erasure of every vector derived from a purged turn. Faults
across replicas are in tests/fleet."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from memsvc.app import Services, build_services
from memsvc.domain.access import Access, Role
from memsvc.domain.errors import PermissionDenied
from memsvc.domain.hashing import text_hash
from memsvc.domain.types import SearchFilters, SearchMode, SearchRequest, TurnRange
from memsvc.domain.vectors import gist
from memsvc.embedding.model import Embedder
from memsvc.services.turns import TurnsDeleted
from memsvc.storage.milvus.store import MilvusChunkStore
from tests.conftest import EN_TURNS, conversation, make_settings, turn
from tests.support.fleet import MilvusServer
from tests.support.waiting import until_idle

SECRET = (
    "My locker code is 4417-tango and the spare key is under the blue flowerpot by the door."
    " I am writing this down here so that I will not forget it again next week, because"
    " last time I had to call the building manager twice and wait for an hour in the rain"
    " before anyone came with the master key to open the locker room for me. The gym itself"
    " is on the third floor, next to the laundry, and the lockers are numbered from the"
    " window side; mine is the last one in the second row, with a dent in the door. If I"
    " lose the code again, the manager keeps a copy in the office safe behind reception,"
    " and the cleaning staff can let me in on weekday mornings before nine o'clock."
)


def cached(services: Services, texts: list[str]) -> set[str]:
    key = services.embedder.identity.cache_key
    return set(services.cache.get_many(key, [text_hash(t) for t in texts]))


def turn_texts(embedder: Embedder, text: str) -> list[str]:
    """The texts a single turn's vector is made of (memsvc.domain.vectors)."""
    return [text, gist(text, 64, embedder.count_tokens)]


def test_a_purge_forgets_the_vectors_of_a_turns_head_and_gist(
    services_on_both: Services, embedder: Embedder
) -> None:
    svc = services_on_both
    built = svc.ingest.build(conversation("pg", ["Hi there.", SECRET]))
    assert any(c.metadata.turn_range == TurnRange(1, 1) for c in built.chunks)  # a turn unit
    svc.ingest.upsert(built.chunks)
    texts = turn_texts(embedder, SECRET)
    assert cached(svc, texts) == {text_hash(t) for t in texts}
    svc.deletion.delete("pg", TurnRange(1, 1), [])
    svc.deletion.purge_deleted("pg")
    assert cached(svc, texts) == set()


def test_12_a_write_embedding_during_a_purge_does_not_put_its_vector_back(
    services_on_both: Services, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (issue 37, 12): a step that was embedding while a purge ran put the
    purged text's vector back in the embedding cache, where it survived a clean stop."""
    svc = services_on_both
    built = svc.ingest.build(conversation("race", ["Hi there.", SECRET]))
    embedding, release = threading.Event(), threading.Event()
    real = embedder.encode_passages
    secret_texts: list[str] = []

    def slow(texts: list[str]) -> object:
        out = real(texts)
        if any("4417-tango" in t for t in texts):
            secret_texts.extend(t for t in texts if "4417-tango" in t)
            embedding.set()
            assert release.wait(60)
        return out

    monkeypatch.setattr(embedder, "encode_passages", slow)
    outcome: list[object] = []
    writer = threading.Thread(target=lambda: outcome.append(svc.ingest.upsert(built.chunks)))
    writer.start()
    assert embedding.wait(60)
    svc.deletion.delete("race", None, [])
    svc.deletion.purge_deleted("race")
    release.set()
    writer.join(60)
    assert outcome, "the write finished"
    assert secret_texts and cached(svc, secret_texts) == set()
    assert not any("4417-tango" in c.record.text for c in svc.store.chunks_of("race", deleted=None))


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


def _free(svc: Services, conv: str) -> bool:
    """Whether the conversation's writer lock can be had within a second."""
    got = threading.Event()

    def take() -> None:
        with svc.locks.hold(conv):
            got.set()

    t = threading.Thread(target=take, daemon=True)
    t.start()
    return got.wait(1.0)


# -- 3, 4. the store checked against the log --------------------------------------------------
def deadline_loop(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def findable(svc: Services, conv: str, texts: list[str]) -> bool:
    """Every text found by a keyword search for itself in `conv`."""
    for text in texts:
        hits = svc.search.search(
            SearchRequest(text, 10, SearchFilters((conv,)), SearchMode.KEYWORD)
        ).hits
        if not any(text in h.text for h in hits):
            return False
    return True


def test_3_a_store_back_without_its_data_is_rebuilt(
    tmp_path: Path, embedder: Embedder, backend: dict[str, object]
) -> None:
    """Regression (issue 37, 3): the Milvus server came back at the same URI without its
    data; memsvc re-created the collection but compared identities only at start, so
    WaitForIndexed said true while only turns indexed after the return were findable."""
    server = MilvusServer(tmp_path / "first.db")
    settings = make_settings(tmp_path / "data", milvus_uri=server.uri, store_check_s=0.2, **backend)
    svc = build_services(settings, embedder=embedder)
    try:
        svc.ingest.upsert(svc.ingest.build(conversation("lost", EN_TURNS)).chunks)
        last = len(EN_TURNS) - 1
        assert svc.control.is_indexed("lost", last) and findable(svc, "lost", EN_TURNS[:2])
        server = server.emptied(tmp_path / "second.db")
        # the watch reconnects; the new collection is another store: rebuilt from the log
        deadline_loop(
            lambda: svc.store.up and svc.control.is_indexed("lost", last),
            120,
            "rebuilt",
        )
        assert findable(svc, "lost", EN_TURNS)
    finally:
        svc.close()
        server.stop()


def test_3_indexed_is_no_until_the_returned_store_is_followed(
    tmp_path: Path, embedder: Embedder, backend: dict[str, object]
) -> None:
    """Regression (a lone-clone run of stop 48): between the reconnection to a store that
    came back empty and the audit that follows its new identity, the log still counted the
    old store's chunks, so WaitForIndexed said true while nothing was findable. The watch
    and the audit are held off here (long intervals) to stand in that window."""
    server = MilvusServer(tmp_path / "first.db")
    settings = make_settings(
        tmp_path / "data", milvus_uri=server.uri, store_check_s=60, store_audit_s=3600, **backend
    )
    svc = build_services(settings, embedder=embedder)
    try:
        svc.ingest.upsert(svc.ingest.build(conversation("gap", EN_TURNS)).chunks)
        last = len(EN_TURNS) - 1
        assert svc.control.is_indexed("gap", last)
        server = server.emptied(tmp_path / "second.db")
        assert svc.store.reconnect()  # what the watch does when its ping fails
        assert not findable(svc, "gap", EN_TURNS[:1])
        assert not svc.control.is_indexed("gap", last)
        svc.store_audit.run()  # what the reconnection sets off
        deadline_loop(lambda: svc.control.is_indexed("gap", last), 120, "rebuilt")
        assert findable(svc, "gap", EN_TURNS)
    finally:
        svc.close()
        server.stop()


def test_3_a_replica_that_missed_the_stores_loss_sees_another_store(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Regression (noticed at stop 49): a replica frozen while the Milvus server lost its
    data, resumed after another replica re-created the collection, pinged fine (the
    collection exists) and never reconnected: it kept the old collection's identity, and
    its audit would follow that one back. Its ping now says down: the watch reconnects."""
    server = MilvusServer(tmp_path / "first.db")
    first = MilvusChunkStore(server.uri, "chunks", embedder.identity)
    frozen = MilvusChunkStore(server.uri, "chunks", embedder.identity)
    try:
        assert frozen.identity == first.identity and frozen.ping()
        server = server.emptied(tmp_path / "second.db")
        assert first.reconnect() and first.identity != frozen.identity  # made anew
        assert not frozen.ping()
        assert frozen.reconnect() and frozen.identity == first.identity and frozen.ping()
    finally:
        first.close()
        frozen.close()
        server.stop()


def test_4_a_log_restored_beside_a_newer_store_is_repaired(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Regression (issue 37, 4): a log backup restored beside a newer store left every
    live turn unfindable, with WaitForIndexed true, and nothing repaired it."""
    data = tmp_path / "data"
    svc = build_services(make_settings(data), embedder=embedder)
    svc.ingest.upsert(svc.ingest.build(conversation("rs", EN_TURNS[:3])).chunks)
    svc.close()
    backup = tmp_path / "backup.sqlite"
    with sqlite3.connect(data / "events.sqlite") as source, sqlite3.connect(backup) as copy:
        source.backup(copy)
    svc = build_services(make_settings(data), embedder=embedder)
    later = [f"{t} (told again, later)" for t in EN_TURNS]
    svc.ingest.upsert(svc.ingest.build(conversation("rs", later)).chunks)  # edits all
    svc.close()
    for leftover in data.glob("events.sqlite*"):
        leftover.unlink()
    with sqlite3.connect(backup) as source, sqlite3.connect(data / "events.sqlite") as copy:
        source.backup(copy)
    svc = build_services(make_settings(data), embedder=embedder)
    try:
        until_idle(svc, "rs", timeout_s=120)
        assert svc.control.is_indexed("rs", 2)
        assert findable(svc, "rs", EN_TURNS[:3])  # the log's turns, as the log has them
        stored = {c.record.text for c in svc.store.chunks_of("rs")}
        assert not any("told again, later" in t for t in stored)
    finally:
        svc.close()


# -- 8. re-used deleted ids ------------------------------------------------------------------
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
