"""Three replicas on one PostgreSQL event log and one Milvus server (issue 25): any replica
answers any call, writers on different replicas converge to the one-writer layout, a delete
through one is never undone by indexing on another, pause is fleet-wide, a killed replica's
work is taken over, and a database restart is survived with nothing acknowledged lost.

The fleet is shared by the tests of this module, which run in order (`make test-fleet`)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memsvc.domain.types import MemoryEvent
from memsvc.transports.grpc.convert import event_to_pb
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import EN_TURNS, conversation, turn
from tests.support.conversations import generate
from tests.support.fleet import MilvusServer, Replica, start_fleet, until
from tests.support.launch import list_all_chunks
from tests.support.postgres import PostgresCluster

pytestmark = pytest.mark.fleet

SECRET = "The vault combination is 31-07-1999."
LEASE_S = "4"


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    pg = PostgresCluster(durable=True).start()  # its own: a test crashes it
    yield pg
    pg.destroy()


@pytest.fixture(scope="module")
def milvus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MilvusServer]:
    server = MilvusServer(tmp_path_factory.mktemp("milvus") / "shared.db")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fleet(
    cluster: PostgresCluster, milvus: MilvusServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Replica]]:
    replicas = start_fleet(
        tmp_path_factory.mktemp("fleet"),
        3,
        cluster.create_database(),
        milvus.uri,
        metrics=True,
        MEMSVC_INDEX_LEASE_S=LEASE_S,
        MEMSVC_BUILD_GRACE_S="2",
    )
    yield replicas
    for r in replicas:
        r.stop()


def append(replica: Replica, events: list[MemoryEvent], **kw: object) -> pb.AppendEventsResponse:
    return replica.stub.AppendEvents(  # type: ignore[no-any-return]
        pb.AppendEventsRequest(events=[event_to_pb(e) for e in events], **kw), timeout=60
    )


def wait(replica: Replica, conv: str, turn_id: int) -> pb.WaitForIndexedResponse:
    return replica.stub.WaitForIndexed(  # type: ignore[no-any-return]
        pb.WaitForIndexedRequest(conversation_id=conv, turn_id=turn_id, timeout_ms=120_000),
        timeout=130,
    )


def texts(replica: Replica, conv: str) -> list[str]:
    return sorted(c.text for c in list_all_chunks(replica.stub, conv))


def search(replica: Replica, conv: str, query: str) -> list[str]:
    hits = replica.stub.EmbedDb(
        pb.EmbedDbRequest(
            query_text=query, top_k=50, filters=pb.SearchFilters(conversation_ids=[conv])
        ),
        timeout=60,
    ).hits
    return [h.text for h in hits]


def reference(replica: Replica, conv: str, events: list[MemoryEvent]) -> list[str]:
    """What one replica alone builds from the same turns (under another id)."""
    ref = f"{conv}-ref"
    built = replica.stub.BuildIncrementalChunks(
        pb.BuildIncrementalChunksRequest(
            events=[event_to_pb(dataclasses.replace(e, conversation_id=ref)) for e in events]
        ),
        timeout=120,
    )
    replica.stub.UpsertVectorRecords(pb.UpsertVectorRecordsRequest(records=built.chunks))
    return [t.replace(ref, conv) for t in texts(replica, ref)]


def no_duplicate_rows(milvus: MilvusServer, conv: str) -> None:
    """Upsert is delete + insert in Milvus: two writers of one id at once leave two rows."""
    from pymilvus import MilvusClient

    client = MilvusClient(uri=milvus.uri)
    try:
        rows = client.query(
            "memsvc_chunks", filter=f'conversation_id == "{conv}"', output_fields=["chunk_id"]
        )
        ids = [r["chunk_id"] for r in rows]
        counted = client.query(
            "memsvc_chunks", filter=f'conversation_id == "{conv}"', output_fields=["count(*)"]
        )[0]["count(*)"]
    finally:
        client.close()
    assert len(ids) == len(set(ids)) == counted


def test_round_robin_appends_are_one_conversation(fleet: list[Replica]) -> None:
    events = generate("rr", 3, sessions=2, turns_per_session=(9, 9))
    for i, e in enumerate(events):  # one turn at a time, each through the next replica
        reply = append(fleet[i % 3], [e])
        assert reply.accepted == 1 and not reply.errors, reply.errors
    waited = wait(fleet[1], "rr", events[-1].turn_id)
    assert waited.indexed, waited.status
    assert texts(fleet[2], "rr") == reference(fleet[0], "rr", events)
    assert search(fleet[2], "rr", events[3].text[:40])


def test_writers_on_different_replicas_converge(fleet: list[Replica], milvus: MilvusServer) -> None:
    events = [turn("cw", i, f"Turn {i}: the tide table for harbor number {i}.") for i in range(24)]
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        replica = fleet[n % 3]
        try:
            for start in range(n % 3, 24, 3):
                built = replica.stub.BuildIncrementalChunks(
                    pb.BuildIncrementalChunksRequest(
                        events=[event_to_pb(e) for e in events[max(0, start - 2) : start + 1]],
                        allow_gaps=True,
                    ),
                    timeout=120,
                )
                replica.stub.UpsertVectorRecords(
                    pb.UpsertVectorRecordsRequest(records=built.chunks), timeout=120
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    built = fleet[0].stub.BuildIncrementalChunks(
        pb.BuildIncrementalChunksRequest(conversation_id="cw"), timeout=120
    )
    fleet[0].stub.UpsertVectorRecords(pb.UpsertVectorRecordsRequest(records=built.chunks))
    assert texts(fleet[1], "cw") == reference(fleet[2], "cw", events)
    no_duplicate_rows(milvus, "cw")


def test_a_delete_through_one_replica_is_not_undone_by_another(fleet: list[Replica]) -> None:
    for n, delay in enumerate((0.05, 0.2, 0.5)):
        conv = f"del-{n}"
        events = generate(conv, 40 + n, sessions=3, turns_per_session=(10, 10))
        events[0] = dataclasses.replace(events[0], text=SECRET)
        append(fleet[n % 3], events)
        time.sleep(delay)
        fleet[(n + 1) % 3].stub.LogicalDeleteBySource(
            pb.LogicalDeleteBySourceRequest(conversation_id=conv), timeout=120
        )
        assert wait(fleet[(n + 2) % 3], conv, events[-1].turn_id).indexed
        for r in fleet:
            assert list_all_chunks(r.stub, conv) == []
            assert not any("31-07" in t for t in search(r, conv, "vault combination"))


def test_pause_is_fleet_wide(fleet: list[Replica]) -> None:
    fleet[0].stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=True), timeout=120)
    try:
        for r in fleet:
            assert r.stub.GetIndexStatus(pb.GetIndexStatusRequest(conversation_ids=["x"])).paused
        append(fleet[2], conversation("paused", EN_TURNS))
        time.sleep(3)  # long enough for any worker of any replica to have leased it
        status = fleet[1].stub.GetIndexStatus(pb.GetIndexStatusRequest(conversation_ids=["paused"]))
        assert status.conversations[0].state == "pending", status
    finally:
        fleet[1].stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=False), timeout=120)
    assert wait(fleet[0], "paused", len(EN_TURNS) - 1).indexed


def test_a_backfill_indexed_by_the_fleet_is_observed_as_index_lag(fleet: list[Replica]) -> None:
    """Regression (issue 40): a conversation settled by a worker inside its lease was never
    observed in memsvc_index_lag_seconds. A backfill through one replica, indexed by
    whichever workers lease it: every conversation's wait is observed once, by the replica
    that settled it, and the fleet's sum shows each of them."""

    def observed() -> float:
        return sum(r.metric("memsvc_index_lag_seconds_count") for r in fleet)

    before = observed()
    convs = [f"lag-{i}" for i in range(4)]
    everything = {
        c: generate(c, 90 + i, sessions=2, turns_per_session=(8, 10)) for i, c in enumerate(convs)
    }
    for events in everything.values():
        append(fleet[2], events)  # no wait: the workers index it
    for c, events in everything.items():
        assert wait(fleet[0], c, events[-1].turn_id).indexed
    until(lambda: observed() - before >= len(convs), 30, "lag observed", observed)
    total = sum(r.metric("memsvc_index_lag_seconds_sum") for r in fleet)
    assert total > 0


def test_a_killed_replicas_work_is_taken_over(fleet: list[Replica]) -> None:
    victim, others = fleet[0], fleet[1:]
    convs = [f"take-{i}" for i in range(6)]
    everything = {
        c: generate(c, 70 + i, sessions=4, turns_per_session=(12, 16)) for i, c in enumerate(convs)
    }
    for events in everything.values():
        append(victim, events)
    until(
        lambda: any(
            s.state == "indexing"
            for s in others[0]
            .stub.GetIndexStatus(pb.GetIndexStatusRequest(conversation_ids=convs))
            .conversations
        ),
        60,
        "some conversation leased",
    )
    victim.kill()  # mid-indexing: its leases are neither completed nor handed back
    for c, events in everything.items():
        waited = wait(others[len(c) % 2], c, events[-1].turn_id)
        assert waited.indexed, waited.status
        assert texts(others[0], c) == reference(others[1], c, events)


def test_a_database_restart_loses_nothing_acknowledged(
    fleet: list[Replica], cluster: PostgresCluster
) -> None:
    alive = [r for r in fleet if r.proc.poll() is None]
    acknowledged: list[MemoryEvent] = []
    refused = 0
    stop = threading.Event()
    wrong: list[grpc.RpcError] = []  # anything but UNAVAILABLE (a hang ends in DEADLINE_...)

    def load() -> None:
        nonlocal refused
        i = 0
        while not stop.is_set():
            e = turn("dbr", i, f"Message {i} while the database restarts.")
            try:
                reply = append(alive[i % len(alive)], [e])
                # a retry of a call whose reply was lost finds it written: a duplicate
                if reply.accepted == 1 or reply.duplicates == 1:
                    acknowledged.append(e)
                    i += 1
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    wrong.append(err)
                    return
                refused += 1
                time.sleep(0.1)

    def appending(count: int) -> bool:
        assert not wrong, wrong[0]
        return len(acknowledged) >= count

    loader = threading.Thread(target=load)
    loader.start()
    try:
        until(lambda: appending(5), 60, "appends before the restart")
        cluster.stop("immediate")  # the database goes away, as in a crash
        health = health_pb2_grpc.HealthStub(alive[0].channel)
        until(
            lambda: (
                health.Check(health_pb2.HealthCheckRequest()).status
                == health_pb2.HealthCheckResponse.NOT_SERVING
            ),
            30,
            "NOT_SERVING without the database",
        )
        # longer than a call waits for a connection (the pool's 10 s); a call is refused
        # with UNAVAILABLE or waits and succeeds, both right: what matters is that nothing
        # else is answered and nothing acknowledged is lost
        time.sleep(12)
        cluster.start()
        until(
            lambda: (
                health.Check(health_pb2.HealthCheckRequest()).status
                == health_pb2.HealthCheckResponse.SERVING
            ),
            60,
            "SERVING again by itself",
        )
        restarted = len(acknowledged)
        until(
            lambda: appending(restarted + 10),
            60,
            "appends after the restart",
            lambda: f"{len(acknowledged)} acknowledged, {refused} refused",
        )
    finally:
        stop.set()
        loader.join()
    assert not wrong, wrong[0]
    last = acknowledged[-1].turn_id
    assert [e.turn_id for e in acknowledged] == list(range(last + 1))
    assert wait(alive[-1], "dbr", last).indexed
    stored = "\n".join(texts(alive[0], "dbr"))
    assert all(f"Message {e.turn_id} while" in stored for e in acknowledged)
