"""Bulkheads: a slow embedder cannot take the threads other calls need (issue 37)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memsvc.app import Services
from memsvc.embedding.model import Embedder
from memsvc.transports.grpc.server import RunningServer, start_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.support.surfaces import event

WORKERS = 8


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
