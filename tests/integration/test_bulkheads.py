"""Bulkheads: a slow embedder cannot take the threads other calls need (issue 37)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memsvc.app import Services
from memsvc.embedding.model import Embedder
from memsvc.transports.channel import client_channel
from memsvc.transports.grpc.server import RunningServer, start_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.support.surfaces import event

WORKERS = 8


@pytest.fixture()
def small_server(services: Services) -> Iterator[RunningServer]:
    """Eight threads: one for waits, one for heavy calls, two for embedding calls, two for
    appends."""
    running = start_server(
        "127.0.0.1:0",
        workers=WORKERS,
        max_waiting_calls=1,
        max_heavy_calls=1,
        max_embedding_calls=2,
        max_write_calls=2,
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


def test_a_slow_event_log_cannot_take_every_thread(
    small_server: RunningServer, services: Services, tmp_path: Path
) -> None:
    """Issue 62 (writes get a bulkhead, as searches have): another process holds the SQLite
    log's write lock, so every append waits on it. Only `max_write_calls` of them hold a
    thread; the others are refused at once with UNAVAILABLE (nothing done, a retry hint),
    and health checks and keyword searches keep answering. Once the lock is let go, the
    appends that waited are written, and a client with gRPC's retry policy gets through."""
    running = small_server
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    stub = pb_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]
    assert (
        stub.AppendEvents(
            pb.AppendEventsRequest(events=[event("slow-log", 0, "hello there")]), timeout=30
        ).accepted
        == 1
    )
    holder = sqlite3.connect(tmp_path / "events.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the log's write lock, held by someone else
    outcomes: list[grpc.StatusCode] = []
    refusals: list[str] = []
    written: set[str] = set()

    def append(i: int) -> None:
        request = pb.AppendEventsRequest(events=[event(f"slow-log-{i}", 0, f"note {i}")])
        try:
            stub.AppendEvents(request, timeout=60)
            outcomes.append(grpc.StatusCode.OK)
            written.add(f"slow-log-{i}")
        except grpc.RpcError as exc:
            outcomes.append(exc.code())
            refusals.append(exc.details() or "")

    appends = [threading.Thread(target=append, args=(i,)) for i in range(WORKERS + 4)]
    try:
        for t in appends:
            t.start()
        time.sleep(1)  # the appends hold what they may
        health = health_pb2_grpc.HealthStub(channel)
        status = health.Check(health_pb2.HealthCheckRequest(), timeout=3).status
        assert status == health_pb2.HealthCheckResponse.SERVING
        keyword = stub.EmbedDb(
            pb.EmbedDbRequest(query_text="hello", mode=pb.SEARCH_MODE_KEYWORD), timeout=3
        )
        assert keyword.mode == pb.SEARCH_MODE_KEYWORD
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        for t in appends:
            t.join(60)
    assert outcomes.count(grpc.StatusCode.OK) == 2  # the two slots' appends, once let go
    assert outcomes.count(grpc.StatusCode.UNAVAILABLE) == WORKERS + 2
    assert all("nothing was done" in r for r in refusals), refusals
    # a client that retries UNAVAILABLE (memsvc's own channel: the CLI, the MCP gateway)
    with client_channel(f"127.0.0.1:{running.port}", None) as retrying:
        again = pb_grpc.MemoryServiceStub(retrying)  # type: ignore[no-untyped-call]
        request = pb.AppendEventsRequest(events=[event("slow-log-late", 0, "late note")])
        assert again.AppendEvents(request, timeout=30).accepted == 1
    # what was refused left nothing behind; what was answered OK is in the log
    stored = services.control.status([f"slow-log-{i}" for i in range(WORKERS + 4)])
    assert {c.conversation_id for c in stored if c.last_appended_turn == 0} == written
    channel.close()
