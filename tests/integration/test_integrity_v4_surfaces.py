"""Integrity v4 (issue 37) on the gRPC surface: bulkheads keep a slow embedder from taking
the threads other calls need; a request message is bounded before its token is checked."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memsvc.app import Services
from memsvc.embedding.model import Embedder
from memsvc.transports.grpc.auth import TokenTable
from memsvc.transports.grpc.server import RunningServer, start_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.integration.test_integrity_v3_surfaces import fill, reason, small_disk
from tests.integration.test_security import TOKENS, write_tokens
from tests.support.launch import free_port, start_child, wait_serving

WORKERS = 8
__all__ = ["small_disk"]  # the fixture, shared with integrity v3's full-disk test


@pytest.fixture()
def small_server(services: Services) -> Iterator[RunningServer]:
    """Eight threads: one for waits, one for heavy calls, two for embedding calls."""
    running = start_server(
        "127.0.0.1:0",
        workers=WORKERS,
        max_waiting_calls=1,
        max_heavy_calls=1,
        max_embedding_calls=2,
    )
    running.mark_ready(services)
    yield running
    running.stop(0)


def event(conv: str, turn: int, text: str) -> pb.MemoryEvent:
    return pb.MemoryEvent(
        conversation_id=conv,
        turn_id=turn,
        speaker="user",
        text=text,
        timestamp="2026-02-02T10:00:00Z",
    )


def test_7_a_slow_embedder_cannot_take_every_thread(
    small_server: RunningServer, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (issue 37, 7): 24 concurrent searches waiting on a slow embedding server
    took every handler thread; append, health and keyword-only search all timed out."""
    real = embedder.encode_queries

    def slow(texts: list[str]) -> object:
        time.sleep(4)
        return real(texts)

    monkeypatch.setattr(embedder, "encode_queries", slow)
    channel = grpc.insecure_channel(f"127.0.0.1:{small_server.port}")
    stub = pb_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]
    codes: list[grpc.StatusCode] = []

    def search(i: int) -> None:
        try:
            stub.EmbedDb(pb.EmbedDbRequest(query_text=f"puppy {i}"), timeout=20)
            codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            codes.append(exc.code())

    searches = [threading.Thread(target=search, args=(i,)) for i in range(WORKERS + 4)]
    for t in searches:
        t.start()
    time.sleep(1)  # the searches hold what they may
    try:
        stub.AppendEvents(pb.AppendEventsRequest(events=[event("bh", 0, "hello")]), timeout=3)
        keyword = stub.EmbedDb(
            pb.EmbedDbRequest(query_text="hello", mode=pb.SEARCH_MODE_KEYWORD), timeout=3
        )
        assert keyword.mode == pb.SEARCH_MODE_KEYWORD
        health = health_pb2_grpc.HealthStub(channel)
        status = health.Check(health_pb2.HealthCheckRequest(), timeout=3).status
        assert status == health_pb2.HealthCheckResponse.SERVING
    finally:
        for t in searches:
            t.join(60)
        channel.close()
    assert codes.count(grpc.StatusCode.OK) <= 2 + 2  # the two slots, reused once at most
    assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes


def test_13_a_message_over_the_limit_is_refused_before_its_token_is_read(
    services: Services, tmp_path: object
) -> None:
    """Leftover (issue 37): 61 MB bodies sent without a token were refused, but the server
    held each whole first (64 MiB limit): the limit is now 16 MiB (MEMSVC_MAX_REQUEST_MB)."""
    table = TokenTable(write_tokens(tmp_path / "t", TOKENS))  # type: ignore[operator]
    running = start_server("127.0.0.1:0", tokens=table)
    running.mark_ready(services)
    try:
        with grpc.insecure_channel(
            f"127.0.0.1:{running.port}",
            options=[("grpc.max_send_message_length", 64 * 1024 * 1024)],
        ) as channel:
            stub = pb_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]
            big = "x" * (17 * 1024 * 1024)
            with pytest.raises(grpc.RpcError) as refused:
                stub.AppendEvents(pb.AppendEventsRequest(events=[event("big", 0, big)]), timeout=60)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            small = "y" * (15 * 1024 * 1024)
            with pytest.raises(grpc.RpcError) as unauthenticated:
                stub.AppendEvents(
                    pb.AppendEventsRequest(events=[event("big", 0, small)]), timeout=60
                )
            assert unauthenticated.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        running.stop(0)


def test_14_an_append_the_disk_cannot_hold_is_disk_full(small_disk: Path) -> None:
    """Leftover (issue 37): a full disk made AppendEvents INTERNAL when it struck inside
    an append's transaction (SQLite rolls the transaction back, and the savepoint's own
    rollback then failed with another error): it is RESOURCE_EXHAUSTED DISK_FULL."""
    data = small_disk / "data"
    port = free_port()
    proc = start_child(data, port)
    try:
        with grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]
        ) as channel:
            wait_serving(channel, proc)
            stub = pb_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]
            stub.AppendEvents(pb.AppendEventsRequest(events=[event("small", 0, "hello")]))
            filler = fill(small_disk)
            text = "The harbor ferry schedule changed again this week. " * 1900  # ~100 KB
            # several conversations of many turns: the transaction spills pages mid-way
            big = [event(f"big{c}", i, text) for c in range(3) for i in range(25)]
            with pytest.raises(grpc.RpcError) as err:
                stub.AppendEvents(pb.AppendEventsRequest(events=big), timeout=120)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
            assert reason(err.value) == "DISK_FULL"
            filler.unlink()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_15_milvus_lite_keeps_its_cache_beside_its_file(tmp_path: Path) -> None:
    """Start race (issue 37): two Milvus Lite processes of one user shared
    $HOME/.cache/milvus, which each makes at start and removes at exit: started together
    they raced ("create dir failed", "Mmap manager has not been init"), and one stopping
    pulled it from under the other. Each now has a home of its own beside its file."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home)}
    servers = []
    for name in ("a", "b"):
        port = free_port()
        servers.append((port, start_child(tmp_path / name, port, env=env)))
    try:
        channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for port, _ in servers]
        for channel, (_, proc) in zip(channels, servers, strict=True):
            wait_serving(channel, proc)
        assert not (home / ".cache" / "milvus").exists()
        assert (tmp_path / "a" / ".milvus-lite" / ".cache" / "milvus").is_dir()
        servers[0][1].terminate()
        servers[0][1].wait(timeout=60)
        stub = pb_grpc.MemoryServiceStub(channels[1])  # type: ignore[no-untyped-call]
        built = stub.BuildIncrementalChunks(
            pb.BuildIncrementalChunksRequest(events=[event("race", 0, "the harbour ferry")])
        )
        assert not stub.UpsertVectorRecords(
            pb.UpsertVectorRecordsRequest(records=built.chunks)
        ).errors
        assert stub.EmbedDb(pb.EmbedDbRequest(query_text="ferry")).hits
        for channel in channels:
            channel.close()
    finally:
        for _, proc in servers:
            proc.terminate()
            proc.wait(timeout=60)
