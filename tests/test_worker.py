"""The asynchronous write path: AppendEvents, the index worker, status, faults, reindex."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from memsvc.app import Services, build_services
from memsvc.domain.records import StoredChunk
from memsvc.domain.types import SearchFilters, SearchRequest
from memsvc.embedding.model import Embedder
from memsvc.observability import metrics
from tests.conftest import EN_TURNS, ZH_TURNS, conversation, make_settings, turn
from tests.support.faults import failing_model
from tests.support.fleet import until
from tests.support.waiting import until_idle, worker_held


@pytest.fixture()
def services(services_on_both: Services) -> Services:
    """Every test here runs on both event-log backends (SQLite, PostgreSQL)."""
    return services_on_both


def live(svc: Services, conv: str) -> dict[str, str]:
    return {c.chunk_id: c.text for c in svc.ingest.list_chunks(conv, False, 1000, "").chunks}


def test_append_then_indexed_equals_sync_build(services: Services) -> None:
    events = conversation("a1", EN_TURNS)
    result = services.ingest.append(events[:3])
    assert (result.accepted, result.duplicates, result.errors) == (3, 0, [])
    services.ingest.append(events[3:])
    services.worker.notify()
    item = services.control.wait_for_indexed("a1", 5, 60)
    assert item is not None and item.state == "idle" and item.last_indexed_turn == 5
    assert item.dirty == 0
    sync = services.ingest.build(
        [dataclasses.replace(e, conversation_id="a1-sync") for e in events]
    )
    assert sorted(live(services, "a1").values()) == sorted(c.text for c in sync.chunks)
    again = services.ingest.append(events)
    assert again.accepted == 0 and again.duplicates == len(events)


def test_append_rejects_bad_conversation_whole_and_keeps_others(services: Services) -> None:
    good = conversation("a2", ZH_TURNS[:2])
    bad = [turn("a3", 0, "ok"), turn("a3", 1, "bad", ts="not a time")]
    gap = [turn("a4", 0, "x"), turn("a4", 5, "y")]
    result = services.ingest.append([*good, *bad, *gap])
    assert result.accepted == 2
    refs = sorted(e.chunk_id for e in result.errors)
    assert refs == ["a3#0", "a3#1", "a4#0", "a4#5"]
    assert any("events[3].timestamp" in e.message for e in result.errors)
    assert [i.conversation_id for i in services.queue.status()] == ["a2"]


def test_model_failure_is_visible_and_recovers(services: Services) -> None:
    with worker_held(services):
        services.ingest.append(conversation("a5", EN_TURNS))
        status = services.queue.status(["a5"])[0]
        assert status.state == "pending" and status.dirty == len(EN_TURNS)
        with failing_model(services.embedder, "injected model failure"):
            items = services.queue.lease(0.0, 60, 8)
            services.worker.process(items)
            failed = services.queue.status(["a5"])[0]
            assert failed.state == "pending" and failed.attempts == 1
            assert "injected model failure" in failed.last_error
            for _ in range(services.worker.settings.max_attempts):
                services.worker.process(services.queue.lease(1e12, 60, 8))
            assert services.queue.status(["a5"])[0].state == "failed"
        assert live(services, "a5") == {}
        # new events (or a Reindex) re-queue a failed conversation; without the fault it indexes
        services.ingest.append([turn("a5", len(EN_TURNS), "One more thing about Biscuit.")])
    item = services.control.wait_for_indexed("a5", len(EN_TURNS), 60)
    assert item is not None and item.state == "idle" and item.last_error == ""
    assert live(services, "a5")


def test_crash_between_build_and_upsert_is_repaired(services: Services) -> None:
    """Layout written, store never updated (the process died): the next pass rebuilds it."""
    with worker_held(services):
        services.ingest.append(conversation("a6", EN_TURNS))
        item = services.queue.lease(0.0, 60, 8)[0]
        services.projector.plan(item.conversation_id)  # then "crash": the lease comes back
        services.queue.release(item)
    assert services.control.wait_for_indexed("a6", len(EN_TURNS) - 1, 60) is not None
    assert len(live(services, "a6")) == 2


def test_concurrent_appends_lose_nothing(services: Services) -> None:
    errors: list[object] = []

    def client(n: int) -> None:
        conv = f"cc{n % 4}"
        for i in range(6):
            # threads n, n+4, n+8 share a conversation, each with its own turn range
            t = turn(conv, (n // 4) * 6 + i, f"thread {n} message {i} about topic {n}")
            r = services.ingest.append([t], allow_gaps=True)
            errors.extend(r.errors)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for c in range(4):
        conv = f"cc{c}"
        item = services.control.wait_for_indexed(conv, 17, 120)
        assert item is not None and item.state == "idle", item
        with services.log.snapshot() as log:
            stored = log.live_turns(conv)
        assert [t.turn_id for t in stored] == list(range(18))
        covered = sorted(
            {
                t
                for ch in services.ingest.list_chunks(conv, False, 1000, "").chunks
                for t in range(ch.metadata.turn_range.start, ch.metadata.turn_range.end + 1)
            }
        )
        assert covered == list(range(18))


def test_reindex_keeps_old_version_until_complete(services: Services) -> None:
    services.ingest.append(conversation("a7", EN_TURNS))
    assert services.control.wait_for_indexed("a7", 5, 60) is not None
    req = SearchRequest("puppy", 10, SearchFilters(("a7",)))
    with worker_held(services):
        assert services.control.reindex(["a7", "unknown"], 2) == 1
        status = services.queue.status(["a7"])[0]
        assert status.reindex and status.chunk_version == 2
        # build + upsert half-way through, as a worker interrupted mid-reindex would leave it
        item = services.queue.lease(0.0, 60, 8)[0]
        planned = services.projector.plan("a7")
        partial = [c for c in planned if c.metadata.chunk_version == 2][:1]
        assert partial
        services.ingest.upsert(partial)
        hits = services.search.search(req).hits
        assert hits and {h.metadata.chunk_version for h in hits} == {1}
        services.queue.release_stale_leases()
        del item
    done = until_idle(services, "a7")
    assert not done.reindex
    hits = services.search.search(req).hits
    assert hits and {h.metadata.chunk_version for h in hits} == {2}


def test_new_store_is_rebuilt_from_the_event_log(tmp_path, embedder, backend) -> None:  # type: ignore[no-untyped-def]
    from memsvc.app import build_services
    from tests.conftest import make_settings

    first = build_services(make_settings(tmp_path, **backend), embedder=embedder)
    try:
        first.ingest.append(conversation("s1", EN_TURNS))
        assert first.control.wait_for_indexed("s1", 5, 60) is not None
        expected = live(first, "s1")
    finally:
        first.close()
    second = build_services(
        make_settings(tmp_path, collection="other_chunks", **backend), embedder=embedder
    )
    try:
        item = second.control.wait_for_indexed("s1", 5, 60)
        assert item is not None and item.state == "idle"
        assert live(second, "s1") == expected
    finally:
        second.close()


def test_index_lag_is_observed_for_every_conversation_the_worker_settles(
    services: Services,
) -> None:
    # A backfill indexed by the worker settles each conversation inside its lease
    # (indexing -> idle in the queue's complete): its wait used to go unobserved (issue 40).
    def observed() -> float:
        return metrics.REGISTRY.get_sample_value("memsvc_index_lag_seconds_count") or 0.0

    before = observed()
    convs = [f"lag{i}" for i in range(3)]
    for conv in convs:
        services.ingest.append(conversation(conv, EN_TURNS))
    for conv in convs:
        assert until_idle(services, conv).state == "idle"
    # the worker observes a lag just after its commit made the conversation idle: a read
    # right after the last idle raced it (once under load, 2 of 3)
    until(lambda: observed() - before >= len(convs), 30, "lag observed", observed)
    assert observed() - before >= len(convs)


def test_a_wake_up_sent_while_the_worker_is_busy_is_not_lost(services: Services) -> None:
    """Regression: the notifier was a bare condition variable, so a notification sent while
    its waiter was busy (an append during a step, a stop during a lease) was lost, and the
    worker slept its idle poll (0.5 s: every close of a service took that long). A waiter
    now passes the count it read before looking for work: this wait returns at once (it
    would have slept the hour)."""
    notifier = services.worker.notifier
    seen = notifier.generation
    notifier.notify()  # nobody waiting yet
    notifier.wait(3600, seen)
    assert notifier.generation > seen  # (PostgreSQL's LISTEN may count it twice)


def test_a_step_writes_its_conversations_together_and_a_held_one_after_its_writer(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conversations of one step are stored in one call; one another writer holds at
    that moment is not waited for while the others' locks are held: it is written alone
    once its writer lets go, and nothing is lost."""
    convs = ["g1", "g2", "g3"]
    written: list[list[str]] = []
    upsert = services.store.upsert

    def recording_upsert(chunks):  # type: ignore[no-untyped-def]
        written.append(sorted({c.record.metadata.conversation_id for c in chunks}))
        upsert(chunks)

    monkeypatch.setattr(services.store, "upsert", recording_upsert)
    holding, release = threading.Event(), threading.Event()

    def other_writer() -> None:
        with services.locks.hold("g2"):
            holding.set()
            release.wait(60)

    with worker_held(services):
        for conv in convs:
            services.ingest.append(conversation(conv, EN_TURNS))
        planned = []
        for conv in convs:
            with services.locks.hold(conv):
                planned += services.projector.plan(conv)
        writer = threading.Thread(target=other_writer)
        writer.start()
        assert holding.wait(30)
        outcome: list[object] = []
        step = threading.Thread(
            target=lambda: outcome.append(services.projector.store_records(planned, [], True))
        )
        step.start()
        deadline = time.monotonic() + 30
        while not written and time.monotonic() < deadline:
            time.sleep(0.01)
        assert written == [["g1", "g3"]]  # g2 waits for its writer (10 s at most)
        release.set()
        step.join(60)
        writer.join(60)
    assert written == [["g1", "g3"], ["g2"]]
    result = outcome[0]
    assert result.errors == [] and result.upserted == len(planned)  # type: ignore[attr-defined]
    for conv in convs:
        assert sorted(live(services, conv)) == sorted(
            c.chunk_id for c in planned if c.metadata.conversation_id == conv
        )


def test_index_workers_take_their_steps_side_by_side(
    tmp_path: Path, embedder: Embedder, backend: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: each worker thread held one lock from its lease to the end of its step
    (what a pause waits on), so MEMSVC_INDEX_WORKERS=2 took one step at a time. Here one
    worker's step waits in its store write while the other indexes another conversation;
    the pause still waits for both."""
    settings = make_settings(tmp_path, **backend, index_workers=2, index_batch_conversations=1)
    svc = build_services(settings, embedder=embedder)
    try:
        upsert = svc.store.upsert
        writing, release = threading.Event(), threading.Event()

        def held_upsert(chunks: Sequence[StoredChunk]) -> None:
            if any(c.record.metadata.conversation_id == "w1" for c in chunks):
                writing.set()
                release.wait(120)
            upsert(chunks)

        monkeypatch.setattr(svc.store, "upsert", held_upsert)
        svc.ingest.append(conversation("w1", EN_TURNS))
        svc.worker.notify()
        assert writing.wait(60)
        svc.ingest.append(conversation("w2", EN_TURNS))
        svc.worker.notify()
        other = svc.control.wait_for_indexed("w2", len(EN_TURNS) - 1, 60)
        assert other is not None and other.last_indexed_turn == len(EN_TURNS) - 1
        assert live(svc, "w2") and not live(svc, "w1")
        pausing = threading.Thread(target=svc.control.set_paused, args=(True,))
        pausing.start()
        pausing.join(0.5)
        assert pausing.is_alive()  # the held step is still in flight
        release.set()
        pausing.join(60)
        assert not pausing.is_alive() and svc.queue.status(["w1"])[0].state == "idle"
        assert live(svc, "w1")
    finally:
        release.set()
        svc.close()


def test_a_thread_that_syncs_lazily_commits_without_waiting_for_the_disk(
    services: Services,
) -> None:
    """The index worker's commits (work done again if lost) return before an fsync; every
    other thread's (a call's: an append, a delete) wait for the disk, and take the lazy
    ones before them along (the log is written in order). On PostgreSQL a call's commit is
    as the server is set (the test server's own default is asynchronous)."""
    database = services.log.database  # type: ignore[attr-defined]
    sqlite = database.dialect.name == "sqlite"
    query = "PRAGMA synchronous" if sqlite else "SHOW synchronous_commit"

    def setting() -> str:
        with database.transaction() as sql:
            return str(sql.one(query)[0])

    seen: dict[str, str] = {}

    def worker() -> None:
        services.log.sync_lazily()
        seen["worker"] = setting()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(60)
    seen["call"] = setting()
    if sqlite:
        assert seen == {"worker": "1", "call": "2"}  # NORMAL, FULL
    else:
        with database.transaction() as sql:
            default = sql.one("SELECT reset_val FROM pg_settings WHERE name = 'synchronous_commit'")
        assert seen == {"worker": "off", "call": str(default[0])}
