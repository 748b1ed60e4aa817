"""MEMSVC_EMBED_PROVIDER=openai against a real OpenAI-compatible server (Infinity serving
the bundled model, started here), and a proxy in front of it for faults: parity with the
local model, the server killed mid-ingest, slow, throttling, answering the wrong
dimension."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from memsvc.app import Services, build_services
from memsvc.domain.errors import EmbedderUnavailable
from memsvc.domain.types import SearchFilters, SearchRequest
from memsvc.embedding.model import Embedder
from memsvc.embedding.providers import load_embedder
from memsvc.observability import metrics
from memsvc.transports.grpc.convert import event_to_pb
from memsvc.transports.grpc.server import RunningServer, start_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.conftest import EN_TURNS, ZH_TURNS, conversation, make_settings, remote_settings
from tests.integration.test_operations import scrape
from tests.support.embedding_server import (
    FaultProxy,
    InfinityServer,
    quick_failing_remote_env,
)
from tests.support.fleet import until
from tests.support.launch import free_port, start_child, wait_serving
from tests.support.waiting import until_idle

pytestmark = pytest.mark.embedders

QUERIES = ["where is my passport", "what breed is the puppy", "酒店在哪里", "favourite trail"]


@pytest.fixture()
def proxy(infinity: InfinityServer) -> Iterator[FaultProxy]:
    p = FaultProxy(infinity.url)
    yield p
    p.close()


def requests_counted(outcome: str) -> float:
    return metrics.EMBED_REQUESTS.labels("openai", outcome)._value.get()


def test_the_same_model_through_a_server_writes_the_same_vectors_and_finds_the_same(
    tmp_path: Path, embedder: Embedder, infinity: InfinityServer
) -> None:
    remote = load_embedder(remote_settings(tmp_path / "model", infinity.url))
    assert remote.info.provider == "openai" and remote.dim == embedder.dim
    texts = EN_TURNS + ZH_TURNS
    for local_vectors, remote_vectors in (
        (embedder.encode_passages(texts), remote.encode_passages(texts)),
        (embedder.encode_queries(QUERIES), remote.encode_queries(QUERIES)),
    ):
        cosines = np.sum(local_vectors * remote_vectors, axis=1)
        assert cosines.min() >= 0.999, cosines
        assert np.allclose(np.linalg.norm(remote_vectors, axis=1), 1.0, atol=1e-5)
    found: dict[str, list[list[str]]] = {}
    for name, model in (("local", embedder), ("openai", remote)):
        services = build_services(make_settings(tmp_path / name), embedder=model)  # type: ignore[arg-type]
        try:
            services.ingest.append(conversation("c", EN_TURNS + ZH_TURNS))
            until_idle(services, "c")
            found[name] = [
                [h.chunk_id for h in services.search.search(SearchRequest(q, 3)).hits]
                for q in QUERIES
            ]
        finally:
            services.close()
    assert found["local"] == found["openai"]
    assert all(found["openai"])


def test_a_server_killed_mid_ingest_loses_nothing_and_fails_no_attempt(
    tmp_path: Path, infinity: InfinityServer
) -> None:
    """kill -9 of the embedding server while conversations are indexed: steps are handed
    back (no attempt counted, nothing written half), searches answer UNAVAILABLE with a
    retry delay; after a restart on the same port every turn is found."""
    remote = load_embedder(
        remote_settings(tmp_path / "model", infinity.url, embed_max_retries=1, embed_timeout_s=5)
    )
    services = build_services(make_settings(tmp_path / "data"), embedder=remote)  # type: ignore[arg-type]
    try:
        services.control.set_paused(True)
        convs = [f"k{i}" for i in range(6)]
        for conv in convs:
            services.ingest.append(conversation(conv, EN_TURNS + ZH_TURNS))
        infinity.kill()
        services.control.set_paused(False)
        until(
            lambda: not remote.available(),
            60,
            "the client notices the server is gone",
        )
        with pytest.raises(EmbedderUnavailable) as down:
            services.search.search(SearchRequest("passport", 3))
        assert down.value.retry_after_s > 0
        assert services.gauges().embedder_up is False
        status = services.queue.status(convs)
        assert all(s.state != "failed" and s.attempts == 0 for s in status), status
        stored_while_down = services.store.count(deleted=False)
        infinity.start()
        for conv in convs:
            item = until_idle(services, conv, timeout_s=180)
            assert item.state == "idle", item
        # Everything planned is stored, once: the store equals what the log lays out.
        with services.log.snapshot() as r:
            layout = sum(len(r.conversation_layout(c)) for c in convs)
        assert services.store.count(deleted=False) == layout >= stored_while_down
        hits = services.search.search(SearchRequest("what breed", 3, SearchFilters(("k5",)))).hits
        assert hits and "golden retriever" in hits[0].text
    finally:
        services.close()
        if infinity.proc is None or infinity.proc.poll() is not None:
            infinity.start()


@pytest.fixture()
def served(tmp_path: Path, proxy: FaultProxy) -> Iterator[tuple[Services, RunningServer]]:
    settings = remote_settings(
        tmp_path, proxy.url, embed_timeout_s=0.5, embed_max_retries=2, build_grace_s=0
    )
    services = build_services(settings)
    running = start_server("127.0.0.1:0")
    running.mark_ready(services)
    yield services, running
    running.stop(0)
    services.close()


def _stub(running: RunningServer) -> pb_grpc.MemoryServiceStub:
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    return pb_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]


def _search(text: str, conv: str = "") -> pb.EmbedDbRequest:
    request = pb.EmbedDbRequest(query_text=text, top_k=3)
    if conv:
        request.filters.conversation_ids.append(conv)
    return request


def test_a_slow_server_is_unavailable_before_the_callers_deadline(
    served: tuple[Services, RunningServer], proxy: FaultProxy
) -> None:
    """A server slower than the time-out: searches answer UNAVAILABLE with RetryInfo,
    not DEADLINE_EXCEEDED, and a caller's shorter deadline is honoured too."""
    _, running = served
    stub = _stub(running)
    proxy.faults.delay_s = 3.0
    with pytest.raises(grpc.RpcError) as slow:
        stub.EmbedDb(_search("passport"), timeout=10)
    assert slow.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "did not answer usefully" in (slow.value.details() or "")
    assert dict(slow.value.trailing_metadata() or ()).get("grpc-retry-pushback-ms")
    # The circuit is open now: the next search is refused at once, saying when to retry.
    with pytest.raises(grpc.RpcError) as refused:
        stub.EmbedDb(_search("hotel"), timeout=1.5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    proxy.faults.delay_s = 0.0


def test_a_search_within_a_short_deadline_hears_why(tmp_path: Path, proxy: FaultProxy) -> None:
    settings = remote_settings(tmp_path, proxy.url, embed_timeout_s=30, embed_max_retries=0)
    services = build_services(settings)
    running = start_server("127.0.0.1:0")
    running.mark_ready(services)
    try:
        proxy.faults.delay_s = 4.0
        timeouts = requests_counted("timeout")
        with pytest.raises(grpc.RpcError) as short:
            _stub(running).EmbedDb(_search("passport"), timeout=1.0)
        assert short.value.code() == grpc.StatusCode.UNAVAILABLE, short.value
        assert "deadline" in (short.value.details() or "")
        # The request behind it gave up at the caller's deadline too; a caller's short
        # deadline is not the server's failure: the circuit stays closed for the others.
        until(lambda: requests_counted("timeout") > timeouts, 30, "the request gave up")
        assert services.embedder.available()
    finally:
        proxy.faults.delay_s = 0.0
        running.stop(0)
        services.close()


def test_429_with_retry_after_is_honoured(
    served: tuple[Services, RunningServer], proxy: FaultProxy
) -> None:
    services, running = served
    stub = _stub(running)
    before = requests_counted("throttled")
    proxy.faults.throttle, proxy.faults.retry_after_s = 2, 0.2
    reply = stub.EmbedChunk(pb.EmbedChunkRequest(query="where is my passport"), timeout=10)
    assert len(reply.vector) == services.embedder.dim
    assert proxy.faults.seen[-3:] == [429, 429, 200]
    assert requests_counted("throttled") - before == 2
    # Retry-After longer than the caller can wait: UNAVAILABLE at once, carrying the delay.
    proxy.faults.throttle, proxy.faults.retry_after_s = 1, 30
    with pytest.raises(grpc.RpcError) as throttled:
        stub.EmbedChunk(pb.EmbedChunkRequest(query="hotel"), timeout=5)
    assert throttled.value.code() == grpc.StatusCode.UNAVAILABLE
    pushback = dict(throttled.value.trailing_metadata() or ())["grpc-retry-pushback-ms"]
    assert int(pushback) >= 29_000


def test_vectors_of_the_wrong_dimension_are_never_stored(
    served: tuple[Services, RunningServer], proxy: FaultProxy, tmp_path: Path
) -> None:
    services, running = served
    stub = _stub(running)
    proxy.faults.cut_to_dim = 100
    stub.AppendEvents(
        pb.AppendEventsRequest(
            events=[
                pb.MemoryEvent(
                    conversation_id="dim",
                    turn_id=i,
                    speaker="user",
                    text=text,
                    timestamp="2026-02-02T10:00:00Z",
                )
                for i, text in enumerate(EN_TURNS)
            ]
        )
    )
    with pytest.raises(grpc.RpcError) as wrong:
        stub.EmbedDb(_search("puppy", "dim"), timeout=10)
    assert wrong.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "100-dimensional vectors" in (wrong.value.details() or "")
    services.worker.notify()
    until(lambda: requests_counted("bad_response") > 1, 30, "the worker tried")
    assert services.store.count(deleted=False) == 0
    (status,) = services.queue.status(["dim"])
    assert status.state != "failed" and status.attempts == 0
    proxy.faults.cut_to_dim = 0
    until(lambda: remote_ok(services), 60, "the circuit closes again")
    assert until_idle(services, "dim", timeout_s=120).state == "idle"
    assert stub.EmbedDb(_search("puppy", "dim"), timeout=10).hits

    # At start, a configured dimension the server does not write is a start-up error.
    proxy.faults.cut_to_dim = 100
    with pytest.raises(EmbedderUnavailable, match="100-dimensional vectors, but"):
        load_embedder(remote_settings(tmp_path / "m", proxy.url, embed_dimensions=384))


def remote_ok(services: Services) -> bool:
    services.worker.notify()
    return services.embedder.available()


def test_the_key_is_sent_as_a_bearer_token_and_never_logged(
    tmp_path: Path, proxy: FaultProxy
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("sk-test-0123456789\n")
    with capture_logs() as logs:
        remote = load_embedder(
            remote_settings(tmp_path / "m", proxy.url, embed_api_key_file=key_file)
        )
        remote.encode_passages(["hello"])
    assert proxy.faults.authorization[-1] == "Bearer sk-test-0123456789"
    assert "sk-test" not in repr(logs) and "sk-test" not in repr(remote.config)  # type: ignore[attr-defined]


def test_a_dead_embedding_server_is_not_ready_for_as_long_as_it_is_dead(
    tmp_path: Path, infinity: InfinityServer
) -> None:
    """kill -9 of the embedding server with no traffic: /readyz 503, health NOT_SERVING and
    `memsvc health` exit 1 within a few checks, memsvc_embedder_up 0 for the whole outage
    (not only in the circuit's cool-off windows, so the alert's `for` can elapse); appends
    are still accepted (writes health SERVING); after a restart, ready again (issue 40)."""
    port, metrics_port = free_port(), free_port()
    proc = start_child(
        tmp_path,
        port,
        env=quick_failing_remote_env(infinity.url, metrics_port),
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    health = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]

    def status(service: str = "") -> int:
        request = health_pb2.HealthCheckRequest(service=service)
        return int(health.Check(request, timeout=5).status)

    def ready() -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=5):
                return 200
        except urllib.error.HTTPError as exc:
            return exc.code

    def embedder_up() -> float:
        families = scrape(metrics_port)
        return families["memsvc_embedder_up"][()]

    def memsvc_health() -> int:
        argv = [sys.executable, "-m", "memsvc", "health", "--target", f"127.0.0.1:{port}"]
        return subprocess.run(argv, capture_output=True, timeout=60).returncode

    serving = health_pb2.HealthCheckResponse.SERVING
    try:
        wait_serving(channel, proc)
        assert ready() == 200 and embedder_up() == 1 and memsvc_health() == 0
        infinity.kill()
        until(lambda: status() != serving, 30, "health follows the embedder")
        assert ready() == 503 and memsvc_health() == 1
        stub = pb_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]
        writes = f"{pb.DESCRIPTOR.services_by_name['MemoryService'].full_name}.Writes"
        assert status(writes) == serving  # appends need no model
        appended = stub.AppendEvents(
            pb.AppendEventsRequest(events=[event_to_pb(e) for e in conversation("d1", EN_TURNS)])
        )
        assert appended.accepted == len(EN_TURNS)
        # the gauge stays down for the whole outage: sampled over several cool-off windows
        samples = []
        for _ in range(8):
            samples.append(embedder_up())
            time.sleep(0.5)
        assert samples == [0] * 8
        infinity.start()
        until(lambda: status() == serving, 60, "health follows the embedder back")
        assert ready() == 200 and embedder_up() == 1 and memsvc_health() == 0
    finally:
        proc.terminate()
        proc.wait(30)
        if infinity.proc is None or infinity.proc.poll() is not None:
            infinity.start()
