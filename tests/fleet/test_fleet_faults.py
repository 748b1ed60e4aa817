"""Fleet faults (issue 37): a frozen writer stalls nothing beyond its lease, a silent
partition from PostgreSQL is noticed within seconds, and a replica with another
collection or chunking is refused. Two replicas on one PostgreSQL and one Milvus server;
the second reaches PostgreSQL through a TCP proxy the tests partition. Real processes
throughout: the frozen lock holder is a process stopped with SIGSTOP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memsvc.transports.grpc.convert import event_to_pb
from memsvc.v1 import memory_pb2 as pb
from tests.conftest import EN_TURNS, conversation
from tests.support.fleet import MilvusServer, Replica, start_fleet, start_replica, until
from tests.support.postgres import PostgresCluster
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.fleet

LEASE_S = 3.0
WAIT_S = 5.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    pg = PostgresCluster().start()
    yield pg
    pg.destroy()


@pytest.fixture(scope="module")
def database(cluster: PostgresCluster) -> str:
    return cluster.create_database()


@pytest.fixture(scope="module")
def proxy(cluster: PostgresCluster) -> Iterator[TcpProxy]:
    p = TcpProxy("127.0.0.1", cluster.port)
    yield p
    p.close()


@pytest.fixture(scope="module")
def milvus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MilvusServer]:
    server = MilvusServer(tmp_path_factory.mktemp("milvus") / "faults.db")
    yield server
    server.stop()


ENV = {
    "MEMSVC_WRITER_LEASE_S": str(LEASE_S),
    "MEMSVC_WRITER_WAIT_S": str(WAIT_S),
    "MEMSVC_INDEX_LEASE_S": str(LEASE_S),
}


@pytest.fixture(scope="module")
def fleet(
    database: str,
    proxy: TcpProxy,
    milvus: MilvusServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[Replica]]:
    root = tmp_path_factory.mktemp("faults")
    direct = start_fleet(root, 1, database, milvus.uri, **ENV)
    through_proxy = start_fleet(
        root / "p",
        1,
        database.replace(f":{proxy.target[1]}/", f":{proxy.port}/"),
        milvus.uri,
        **ENV,
    )
    replicas = direct + through_proxy
    yield replicas
    for r in replicas:
        r.stop()


def appended(replica: Replica, conv: str, texts: list[str], timeout: float = 30) -> None:
    replica.stub.AppendEvents(
        pb.AppendEventsRequest(events=[event_to_pb(e) for e in conversation(conv, texts)]),
        timeout=timeout,
    )


def indexed(replica: Replica, conv: str, turn_id: int, timeout_s: float = 60) -> bool:
    reply = replica.stub.WaitForIndexed(
        pb.WaitForIndexedRequest(
            conversation_id=conv, turn_id=turn_id, timeout_ms=int(timeout_s * 1000)
        ),
        timeout=timeout_s + 5,
    )
    return bool(reply.indexed)


# A process that takes a conversation's writer lock exactly as a replica does, says so,
# and keeps it until it is stopped.
HOLDER = """
import sys, time
from memsvc.storage.postgres.locks import AdvisoryLocks
locks = AdvisoryLocks(sys.argv[1], 2, lease_s=float(sys.argv[3]))
with locks.hold(sys.argv[2]):
    print("held", flush=True)
    time.sleep(3600)
"""


def test_1_a_frozen_writer_holds_nothing_past_its_lease(
    fleet: list[Replica], database: str
) -> None:
    """Regression (issue 37, 1): a replica stopped (SIGSTOP) while holding a conversation's
    writer lock kept it for as long as its session lived: the other replica's worker
    blocked on it, an unrelated conversation stayed unindexed, writers queued up until
    the heavy-call slots were gone, and recovery came only when the process resumed."""
    r0, r1 = fleet
    appended(r0, "frozen", EN_TURNS[:2])
    assert indexed(r0, "frozen", 1)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, database, "frozen", str(LEASE_S)],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        os.kill(holder.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        # a write to the frozen conversation gives up within its deadline
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as busy:
            r1.stub.BuildIncrementalChunks(
                pb.BuildIncrementalChunksRequest(conversation_id="frozen"), timeout=1.5
            )
        assert busy.value.code() in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.DEADLINE_EXCEEDED,
        )
        assert time.monotonic() - started < 3
        # an unrelated conversation is written and indexed meanwhile, by either replica
        appended(r1, "unrelated", EN_TURNS)
        assert indexed(r0, "unrelated", len(EN_TURNS) - 1, timeout_s=30)
        assert r0.stub.BuildIncrementalChunks(
            pb.BuildIncrementalChunksRequest(conversation_id="unrelated"), timeout=10
        )
        # the frozen holder's lock ends with its lease: the conversation moves on while
        # the holder is still stopped
        appended(r0, "frozen", EN_TURNS[:4])
        assert indexed(r1, "frozen", 3, timeout_s=30)
        assert holder.poll() is None, "still frozen"
        assert time.monotonic() - frozen_at < LEASE_S + WAIT_S + 30
    finally:
        holder.kill()
        holder.wait(timeout=30)


def serving(replica: Replica) -> int:
    health = health_pb2_grpc.HealthStub(replica.channel)
    try:
        return int(health.Check(health_pb2.HealthCheckRequest(), timeout=5).status)
    except grpc.RpcError:
        return -1


def test_2_a_silent_partition_from_the_database_is_noticed(
    fleet: list[Replica], proxy: TcpProxy
) -> None:
    """Regression (issue 37, 2): when packets stopped but connections stayed open, health
    stayed SERVING for 30 s and an append hung to its deadline."""
    _r0, r1 = fleet
    appended(r1, "part", EN_TURNS[:2])
    with proxy.partitioned():
        cut = time.monotonic()
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as refused:
            appended(r1, "part", EN_TURNS[:4], timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 15
        until(
            lambda: serving(r1) == health_pb2.HealthCheckResponse.NOT_SERVING,
            15,
            "NOT_SERVING",
        )
        assert time.monotonic() - cut < 15
    until(lambda: serving(r1) == health_pb2.HealthCheckResponse.SERVING, 60, "SERVING again")
    appended(r1, "part", EN_TURNS[:4])
    assert indexed(r1, "part", 3)


def test_10_a_replica_with_another_collection_is_refused(
    fleet: list[Replica],
    database: str,
    milvus: MilvusServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Regression (issue 37, 10): a fleet with different MEMSVC_COLLECTIONs was accepted:
    WaitForIndexed true, then a miss on the same replica."""
    root = tmp_path_factory.mktemp("odd")
    for name, env in (
        ("collection", {"MEMSVC_COLLECTION": "another_collection"}),
        ("chunking", {"MEMSVC_CHUNK_MAX_TURNS": "6"}),
    ):
        odd = start_replica(root, name, database, milvus.uri, **{**ENV, **env})
        try:
            assert odd.proc.wait(timeout=300) != 0
        finally:
            odd.stop()
        said = (root / f"{name}.log").read_text()
        assert "fleet" in said and "another replica" in said, said[-2000:]
    # the fleet is unharmed
    appended(fleet[0], "after-odd", EN_TURNS[:2])
    assert indexed(fleet[1], "after-odd", 1)
