"""AppendEvents and the index worker over gRPC, including a kill -9 mid-indexing."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc
import pytest

from memsvc.app import Services
from memsvc.domain.types import MemoryEvent
from memsvc.transports.grpc.convert import event_to_pb
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.support.conversations import generate
from tests.support.launch import free_port, list_all_chunks, start_child, wait_serving


def list_all(stub: pb_grpc.MemoryServiceStub, conv: str) -> dict[str, str]:
    return {c.chunk_id: c.text for c in list_all_chunks(stub, conv)}


def kill_9_mid_indexing(
    tmp_path: Path,
    services: Services,
    conv_events: list[MemoryEvent],
    sig: signal.Signals = signal.SIGKILL,
) -> None:
    """Append a conversation, kill -9 (or SIGTERM) the server while it indexes, restart:
    the recovered chunks equal a clean build of the same events."""
    conversation_id = conv_events[0].conversation_id
    events = [event_to_pb(e) for e in conv_events]

    port = free_port()
    proc = start_child(tmp_path / "data", port)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        wait_serving(channel, proc)
        stub = pb_grpc.MemoryServiceStub(channel)
        # Paused while appending, so the worker cannot keep pace with small appends: the
        # whole backlog is then indexed in several bounded steps, and the kill lands
        # between two of them.
        stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=True))
        for i in range(0, len(events), 3):
            res = stub.AppendEvents(pb.AppendEventsRequest(events=events[i : i + 3]))
            assert res.accepted == len(events[i : i + 3]) and not res.errors
        stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=False))
        deadline = time.monotonic() + 120
        while True:  # let the worker store some chunks, then kill it mid-way
            status = stub.GetIndexStatus(pb.GetIndexStatusRequest()).conversations[0]
            if status.last_indexed_turn >= 0 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert status.last_appended_turn == len(events) - 1
    finally:
        channel.close()
        proc.send_signal(sig)  # SIGKILL: no clean shutdown; SIGTERM: a drained one
        code = proc.wait(timeout=120)
    assert code == (0 if sig is signal.SIGTERM else -signal.SIGKILL)
    assert status.last_indexed_turn < len(events) - 1, "indexing finished before the kill"

    port = free_port()
    proc = start_child(tmp_path / "data", port)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        wait_serving(channel, proc)
        stub = pb_grpc.MemoryServiceStub(channel)
        waited = stub.WaitForIndexed(
            pb.WaitForIndexedRequest(
                conversation_id=conversation_id, turn_id=len(events) - 1, timeout_ms=300_000
            )
        )
        assert waited.indexed, waited.status
        assert waited.status.backlog == 0 and waited.status.state == "idle"
        recovered = list_all(stub, conversation_id)
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=30)

    # a clean build of the same events in a fresh log: every chunk of its layout
    clean = services.ingest.build(conv_events)
    assert recovered == {c.chunk_id: c.text for c in clean.chunks}


def test_kill_9_mid_indexing_loses_nothing(tmp_path: Path, services: Services) -> None:
    kill_9_mid_indexing(tmp_path, services, generate("gen-kill", 11, sessions=24))


def test_sigterm_mid_indexing_stops_cleanly_and_resumes(tmp_path: Path, services: Services) -> None:
    kill_9_mid_indexing(
        tmp_path, services, generate("gen-term", 12, sessions=24), sig=signal.SIGTERM
    )


@pytest.fixture()
def stub(services: Services) -> pb_grpc.MemoryServiceStub:
    from memsvc.transports.grpc.server import start_server

    running = start_server("127.0.0.1:0")
    running.mark_ready(services)
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    yield pb_grpc.MemoryServiceStub(channel)  # type: ignore[misc]
    channel.close()
    running.stop(0)


def test_async_rpcs(stub: pb_grpc.MemoryServiceStub) -> None:
    ev = [
        pb.MemoryEvent(
            conversation_id="g-async",
            turn_id=i,
            speaker="user" if i % 2 == 0 else "assistant",
            text=f"message {i} about my trip to Kyoto",
            timestamp=f"2026-02-02T10:{i:02d}:00+08:00",
        )
        for i in range(4)
    ]
    paused = stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=True))
    assert paused.paused
    res = stub.AppendEvents(pb.AppendEventsRequest(events=ev))
    assert res.accepted == 4
    status = stub.GetIndexStatus(pb.GetIndexStatusRequest(conversation_ids=["g-async"]))
    assert status.paused and status.conversations[0].state == "pending"
    assert status.conversations[0].backlog == 4 and status.total_backlog >= 4
    early = stub.WaitForIndexed(
        pb.WaitForIndexedRequest(conversation_id="g-async", turn_id=3, timeout_ms=200)
    )
    assert not early.indexed
    # timeout_ms beyond the caller's deadline: the reply comes before the deadline, not a
    # DEADLINE_EXCEEDED (the smaller of the two bounds the wait)
    bounded = stub.WaitForIndexed(
        pb.WaitForIndexedRequest(conversation_id="g-async", turn_id=3, timeout_ms=120_000),
        timeout=2.0,
    )
    assert not bounded.indexed and bounded.status.state == "pending"
    stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=False))
    done = stub.WaitForIndexed(
        pb.WaitForIndexedRequest(conversation_id="g-async", turn_id=3, timeout_ms=60_000)
    )
    assert done.indexed and done.status.last_indexed_turn == 3
    hits = stub.EmbedDb(
        pb.EmbedDbRequest(
            query_text="Kyoto trip", filters=pb.SearchFilters(conversation_ids=["g-async"])
        )
    ).hits
    assert hits
    queued = stub.Reindex(pb.ReindexRequest(all=True))
    assert queued.queued >= 1
    with pytest.raises(grpc.RpcError) as err:
        stub.Reindex(pb.ReindexRequest())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        stub.WaitForIndexed(
            pb.WaitForIndexedRequest(conversation_id="nope", turn_id=0, timeout_ms=10)
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
