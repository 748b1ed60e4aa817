"""What must hold when several processes share one event log (issue 25), checked where it
lives: leases fenced by token, writer locks that notice a lost connection, a cache that a
purge through any process erases, pause and reindex state read from the log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from memsvc.app import build_services
from memsvc.domain.errors import LogUnavailable
from memsvc.domain.hashing import text_hash
from memsvc.domain.types import TurnRange
from memsvc.embedding.model import Embedder
from memsvc.storage.postgres.locks import lock_key
from tests.conftest import EN_TURNS, conversation, make_settings
from tests.support.fleet import MilvusServer
from tests.support.postgres import PostgresCluster
from tests.support.waiting import until_idle


def test_a_lapsed_lease_cannot_be_completed_by_its_old_holder(
    tmp_path: Path, embedder: Embedder, backend: dict[str, object]
) -> None:
    svc = build_services(make_settings(tmp_path, **backend, index_workers=0), embedder=embedder)
    try:
        svc.ingest.append(conversation("fence", EN_TURNS))
        first = svc.queue.lease(100.0, 10.0, 8, owner="replica-a")
        assert [i.conversation_id for i in first] == ["fence"]
        assert svc.queue.lease(105.0, 10.0, 8, owner="replica-b") == []  # still held
        second = svc.queue.lease(111.0, 10.0, 8, owner="replica-b")  # lapsed: taken over
        assert second[0].lease_token == first[0].lease_token + 1
        assert svc.queue.complete(first[0]) is None  # a holder that came back: refused
        svc.queue.fail(first[0], "stale", 5, 1.0)
        assert svc.queue.status(["fence"])[0].state == "indexing"  # b's lease untouched
        assert svc.queue.complete(second[0]) == "pending"  # work remains: nothing stored
        assert svc.queue.status(["fence"])[0].attempts == 0
    finally:
        svc.close()


def test_no_lease_begins_after_a_pause_whatever_a_worker_last_read(
    tmp_path: Path, embedder: Embedder, backend: dict[str, object]
) -> None:
    """Regression (the fleet test saw it): a replica whose worker had read the pause flag
    just before another replica paused leased and indexed a conversation appended right
    after the pause. The lease now reads the flag in its own transaction."""
    svc = build_services(make_settings(tmp_path, **backend, index_workers=0), embedder=embedder)
    try:
        svc.ingest.append(conversation("held", EN_TURNS))
        assert not svc.worker.paused  # this process's worker has just read "running"
        svc.queue.set_paused(True)  # as another replica does: only the log changes
        assert svc.queue.lease(None, 10.0, 8, owner="stale-reader") == []
        assert svc.queue.status(["held"])[0].state == "pending"
        svc.queue.set_paused(False)
        assert [i.conversation_id for i in svc.queue.lease(None, 10.0, 8)] == ["held"]
    finally:
        svc.close()


def test_a_writer_whose_lock_connection_died_stops_before_writing(
    tmp_path: Path, embedder: Embedder, postgres: PostgresCluster
) -> None:
    url = postgres.create_database()
    svc = build_services(make_settings(tmp_path, database_url=url), embedder=embedder)
    try:
        with svc.locks.hold("lost"):
            svc.locks.ensure("lost")  # held: fine
            with psycopg.connect(url, autocommit=True) as admin:
                killed = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks"
                    " WHERE locktype = 'advisory' AND objid IS NOT NULL AND granted"
                    " AND ((classid::bigint << 32) | objid::bigint) = %s",
                    (lock_key("lost") & 0xFFFFFFFFFFFFFFFF,),
                ).fetchall()
            assert killed == [(True,)]
            with pytest.raises(LogUnavailable, match="lost"):
                svc.locks.ensure("lost")
        # the lock is free again (the database released it with the session)
        with svc.locks.hold("lost"):
            svc.locks.ensure("lost")
    finally:
        svc.close()


def test_writer_locks_recover_from_a_database_restart(postgres: PostgresCluster) -> None:
    """Regression (a fleet run): after the database dropped every connection, the lock
    pool handed out dead connections and lost a slot on each failure, until every writer
    waited out the pool's time-out and appends hit their deadline."""
    from memsvc.storage.postgres.locks import AdvisoryLocks

    url = postgres.create_database()
    locks = AdvisoryLocks(url, holders=2, connect_timeout_s=1.0)
    try:
        for name in ("a", "b"):  # two idle connections in the pool
            with locks.hold(name):
                locks.ensure(name)
        with psycopg.connect(url, autocommit=True) as admin:  # what a restart does to them
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        for i in range(6):  # more takes than the pool has slots: none is lost
            with locks.hold(f"after-{i}"):
                locks.ensure(f"after-{i}")
    finally:
        locks.close()


@pytest.fixture()
def milvus(tmp_path: Path) -> Iterator[MilvusServer]:
    server = MilvusServer(tmp_path / "shared-milvus.db")
    yield server
    server.stop()


def test_a_purge_through_one_process_erases_the_shared_cache(
    tmp_path: Path, embedder: Embedder, postgres: PostgresCluster, milvus: MilvusServer
) -> None:
    shared = {"database_url": postgres.create_database(), "milvus_uri": milvus.uri}
    a = build_services(make_settings(tmp_path / "a", **shared), embedder=embedder)
    b = build_services(make_settings(tmp_path / "b", **shared), embedder=embedder)
    try:
        built = a.ingest.build(conversation("shared", EN_TURNS))
        a.ingest.upsert(built.chunks)
        hashes = [text_hash(c.text) for c in built.chunks]
        assert len(b.cache.get_many(embedder.name, hashes)) == len(set(hashes))
        b.deletion.delete("shared", TurnRange(0, 5), [])
        b.deletion.purge_deleted("shared")
        assert a.cache.get_many(embedder.name, hashes) == {}
        assert a.ingest.list_chunks("shared", True, 100, "").chunks == []
    finally:
        a.close()
        b.close()


def test_pause_and_rebuilds_are_the_logs_not_a_processs(
    tmp_path: Path, embedder: Embedder, postgres: PostgresCluster, milvus: MilvusServer
) -> None:
    shared = {"database_url": postgres.create_database(), "milvus_uri": milvus.uri}
    a = build_services(make_settings(tmp_path / "a", **shared), embedder=embedder)
    b = build_services(make_settings(tmp_path / "b", **shared), embedder=embedder)
    try:
        a.control.set_paused(True)
        assert b.control.paused and b.control.totals().paused
        b.ingest.append(conversation("shared-rx", EN_TURNS))
        assert b.queue.status(["shared-rx"])[0].state == "pending"
        b.control.set_paused(False)
        assert not a.control.paused
        until_idle(a, "shared-rx")
        a.control.set_paused(True)
        assert a.control.reindex(["shared-rx"], 2) == 1
        assert b.queue.status(["shared-rx"])[0].reindex
        assert b.control.cancel_reindex(["shared-rx"]) == 1
        item = a.queue.status(["shared-rx"])[0]
        assert (item.reindex, item.active_version) == (False, 1)
        a.control.set_paused(False)
    finally:
        a.close()
        b.close()
