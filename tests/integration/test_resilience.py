"""Faults, overload and shutdown (issue 11), with real processes: abandoned calls, a killed
milvus-lite server, SIGTERM with work in flight, a very large turn beside small ones.
Behaviour only; latency figures live in benchmarks/."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memsvc.app import Services, build_services
from memsvc.embedding.model import Embedder
from memsvc.transports.grpc.convert import event_to_pb
from memsvc.transports.grpc.server import RunningServer, start_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.conftest import make_settings, turn
from tests.support.conversations import generate
from tests.support.launch import free_port, list_all_chunks, start_child, wait_serving

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture()
def server(services: Services) -> Iterator[tuple[RunningServer, grpc.Channel]]:
    running = start_server("127.0.0.1:0")
    running.mark_ready(services)
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield running, channel
    running.stop(0)


def code_of(call: object, *args: object, **kw: object) -> grpc.StatusCode:
    try:
        call(*args, **kw)  # type: ignore[operator]
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


# -- 1. abandoned calls --------------------------------------------------------------------
def test_abandoned_waits_leave_the_server_answering(
    server: tuple[RunningServer, grpc.Channel], services: Services
) -> None:
    running, channel = server
    stub = pb_grpc.MemoryServiceStub(channel)
    services.control.set_paused(True)
    events = [event_to_pb(turn("aband", i, f"message {i}")) for i in range(2)]
    stub.AppendEvents(pb.AppendEventsRequest(events=events))
    wait = pb.WaitForIndexedRequest(conversation_id="aband", turn_id=1, timeout_ms=300_000)

    def abandoned(_: int) -> grpc.StatusCode:
        # No deadline: only the client's cancellation after 200 ms ends the wait early.
        call = stub.WaitForIndexed.future(wait)
        time.sleep(0.2)
        call.cancel()
        try:
            call.result()
        except grpc.FutureCancelledError:
            return grpc.StatusCode.CANCELLED
        except grpc.RpcError as err:
            return err.code()  # type: ignore[no-any-return]
        return grpc.StatusCode.OK

    with ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(abandoned, range(20)))
    # each either waited until its client left or was refused at once
    assert set(codes) <= {grpc.StatusCode.CANCELLED, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes  # the limit (4) is what held them off
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == SERVING
    more = [event_to_pb(turn("other", 0, "still taking appends"))]
    assert stub.AppendEvents(pb.AppendEventsRequest(events=more), timeout=5).accepted == 1
    # the abandoned waits end with their callers: the server's handlers all return, and
    # free their slots (a wait sent before the last handler noticed its caller had gone
    # could still be refused: that is the limit working, so wait for the slots first)
    assert running.servicer.in_flight.wait_idle(10.0)
    # a caller with a deadline is answered (indexed=false) before it, never left to time out
    assert code_of(stub.WaitForIndexed, wait, timeout=0.5) == grpc.StatusCode.OK
    services.control.set_paused(False)
    done = stub.WaitForIndexed(wait, timeout=120)
    assert done.indexed


def test_abandoned_embed_batch_stops_at_a_slice_boundary(
    server: tuple[RunningServer, grpc.Channel],
) -> None:
    running, channel = server
    stub = pb_grpc.MemoryServiceStub(channel)
    texts = [f"{i} " + "lunch " * 450 for i in range(256)]  # 256 texts of ~450 tokens
    code = code_of(stub.EmbedBatch, pb.EmbedBatchRequest(texts=texts, is_query=False), timeout=1)
    assert code is grpc.StatusCode.DEADLINE_EXCEEDED
    # All 256 take far longer than this bound; one slice of 16 does not.
    assert running.servicer.in_flight.wait_idle(20.0)
    assert len(stub.EmbedChunk(pb.EmbedChunkRequest(query="hello"), timeout=30).vector) > 0


def test_over_long_queries_are_refused_naming_the_field(
    server: tuple[RunningServer, grpc.Channel],
) -> None:
    _, channel = server
    stub = pb_grpc.MemoryServiceStub(channel)
    long_query = " ".join(f"w{i}" for i in range(600))  # ~1800 tokens in 2,889 characters
    for call, request, field in [
        (stub.EmbedChunk, pb.EmbedChunkRequest(query=long_query), "query"),
        (stub.EmbedBatch, pb.EmbedBatchRequest(texts=["ok", long_query]), "texts[1]"),
        (stub.EmbedDb, pb.EmbedDbRequest(query_text=long_query), "query_text"),
    ]:
        with pytest.raises(grpc.RpcError) as err:
            call(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith(field + ":"), err.value.details()
        assert "at most" in (err.value.details() or "")


# -- 2. one large turn ----------------------------------------------------------------------
def test_a_huge_turn_does_not_hold_up_other_conversations(
    tmp_path: Path, embedder: Embedder
) -> None:
    # 200,000 characters, about 160 chunks: three steps of the worker's 64 chunks of one
    # conversation, so that the small conversation's step comes between two of them (with
    # two, one cycle may take the last step and the small one together). A larger turn only
    # adds steps of the same kind, and minutes of the model's time.
    size = 200_000
    svc = build_services(make_settings(tmp_path, max_turn_chars=size), embedder=embedder)
    try:
        huge = ("the ferry to the island leaves at noon and we bring lunch. " * size)[:size]
        assert svc.ingest.append([turn("huge", 0, huge)]).accepted == 1
        svc.worker.notify()
        deadline = time.monotonic() + 120
        while svc.queue.status(["huge"])[0].state != "indexing":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Writers of other conversations are never blocked by it...
        for i in range(10):
            assert svc.ingest.append([turn("small", i, f"small talk {i}")]).accepted == 1
        svc.worker.notify()
        # ...and the worker takes turns: the small conversation is done before the huge one.
        small = svc.control.wait_for_indexed("small", 9, 300)
        assert small is not None and svc.control.is_indexed("small", 9)
        huge_now = svc.queue.status(["huge"])[0]
        assert not svc.control.is_indexed("huge", 0), huge_now
        done = svc.control.wait_for_indexed("huge", 0, 600)
        assert done is not None and svc.control.is_indexed("huge", 0) and done.attempts == 0
        stored = svc.ingest.list_chunks("huge", False, 1000, "").chunks
        assert len(stored) > 2 * svc.worker.settings.max_chunks_per_cycle  # three steps
    finally:
        svc.close()


def test_turn_size_limit_is_a_setting_checked_on_arrival(services: Services) -> None:
    from memsvc.domain.errors import InvalidArgument

    limit = services.settings.max_turn_chars
    refused = services.ingest.append([turn("big", 0, "x" * (limit + 1))])
    assert refused.accepted == 0 and len(refused.errors) == 1
    assert refused.errors[0].message.startswith("events[0].text: longer than")
    with pytest.raises(InvalidArgument) as err:
        services.ingest.build([turn("big", 0, "x" * (limit + 1))])
    assert err.value.field == "events[0].text"
    assert services.ingest.append([turn("big", 0, "x" * limit)]).accepted == 1


# -- 3. the store dies --------------------------------------------------------------------------
def milvus_child(server_pid: int) -> psutil.Process:
    kids = [p for p in psutil.Process(server_pid).children() if "milvus" in p.name()]
    assert len(kids) == 1, kids
    return kids[0]


def test_killed_store_is_restarted_and_nothing_is_lost(tmp_path: Path) -> None:
    port = free_port()
    proc = start_child(tmp_path / "data", port)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    seen: list[int] = []
    try:
        wait_serving(channel, proc)
        stub = pb_grpc.MemoryServiceStub(channel)
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        watcher = threading.Thread(target=lambda: seen.extend(r.status for r in watch))
        watcher.start()
        first = [event_to_pb(e) for e in generate("before", 3, sessions=2)]
        stub.AppendEvents(pb.AppendEventsRequest(events=first))
        stub.WaitForIndexed(
            pb.WaitForIndexedRequest(
                conversation_id="before", turn_id=len(first) - 1, timeout_ms=120_000
            )
        )
        old = milvus_child(proc.pid)
        old.kill()
        old.wait(10)
        # During the outage: appends are still durable, store calls are UNAVAILABLE (never
        # INTERNAL), and the worker defers instead of failing the conversation.
        during = [event_to_pb(e) for e in generate("during", 4, sessions=2)]
        assert stub.AppendEvents(pb.AppendEventsRequest(events=during)).accepted == len(during)
        search = pb.EmbedDbRequest(
            query_text="trip", filters=pb.SearchFilters(conversation_ids=["before"])
        )
        codes = set()
        deadline = time.monotonic() + 120
        while True:
            code = code_of(stub.EmbedDb, search, timeout=10)
            codes.add(code)
            if code is grpc.StatusCode.OK:
                break
            assert time.monotonic() < deadline, codes
            time.sleep(0.1)
        assert codes <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}, codes
        waited = stub.WaitForIndexed(
            pb.WaitForIndexedRequest(
                conversation_id="during", turn_id=len(during) - 1, timeout_ms=120_000
            )
        )
        assert waited.indexed and waited.status.attempts == 0, waited.status
        assert milvus_child(proc.pid).pid != old.pid  # restarted
        assert len(list_all_chunks(stub, "before")) > 0
        assert stub.EmbedDb(search).hits
        watch.cancel()
        watcher.join(10)
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=60)
    assert NOT_SERVING in seen and seen[-1] == SERVING, seen


# -- 4. SIGTERM drains -----------------------------------------------------------------------
def test_sigterm_lets_an_upsert_in_flight_finish(tmp_path: Path) -> None:
    conv_events = [event_to_pb(e) for e in generate("drain", 5, sessions=14)]
    port = free_port()
    proc = start_child(tmp_path / "data", port)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        wait_serving(channel, proc)
        stub = pb_grpc.MemoryServiceStub(channel)
        stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=True))
        built = stub.BuildIncrementalChunks(pb.BuildIncrementalChunksRequest(events=conv_events))
        assert len(built.chunks) >= 100
        with ThreadPoolExecutor(1) as pool:
            upsert = pool.submit(
                stub.UpsertVectorRecords,
                pb.UpsertVectorRecordsRequest(records=built.chunks),
                timeout=300,
            )
            time.sleep(1.0)  # the upsert is embedding
            assert not upsert.done()
            proc.send_signal(signal.SIGTERM)
            result = upsert.result()
        assert result.upserted == len(built.chunks) and not result.errors
        assert proc.wait(timeout=120) == 0
    finally:
        channel.close()
        if proc.poll() is None:
            proc.kill()
    port = free_port()
    proc = start_child(tmp_path / "data", port)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        wait_serving(channel, proc)
        stub = pb_grpc.MemoryServiceStub(channel)
        stored = list_all_chunks(stub, "drain")
        assert sorted(c.chunk_id for c in stored) == sorted(c.chunk_id for c in built.chunks)
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=60)
