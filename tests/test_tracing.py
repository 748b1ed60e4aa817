"""Traces in one process, with the SDK's in-memory exporter: which OTEL_* settings turn
them on, the status a failed call reports, the tenant-only conversation attribute, and the
trace id a latency sample carries as its exemplar. (Every surface, across processes and
over OTLP: tests/integration/test_traces.py.)"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from memsvc.app import Services, build_services
from memsvc.embedding.model import Embedder
from memsvc.observability import metrics, tracing
from memsvc.transports.grpc.server import start_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.conftest import EN_TURNS, conversation, make_settings
from tests.support.fleet import MilvusServer
from tests.support.postgres import PostgresCluster
from tests.support.waiting import until_idle

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),  # off by default
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_the_standard_variables_turn_traces_on(environ: dict[str, str], on: bool) -> None:
    assert tracing.wanted(environ) is on


def test_an_unknown_exporter_or_protocol_stops_the_start_naming_it() -> None:
    with pytest.raises(SystemExit, match="OTEL_TRACES_EXPORTER='zipkin'"):
        tracing.configure(environ={"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(SystemExit, match="OTEL_EXPORTER_OTLP_PROTOCOL='http/json'"):
        tracing.configure(
            environ={"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}
        )
    assert not tracing.on()


@pytest.fixture()
def traced(services: Services) -> Iterator[tuple[pb_grpc.MemoryServiceStub, InMemorySpanExporter]]:
    """An in-process server whose spans go to memory, conversations shown by tenant only."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.start(provider, conversations="tenant")
    running = start_server("127.0.0.1:0")
    running.mark_ready(services)
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        yield pb_grpc.MemoryServiceStub(channel), exporter  # type: ignore[no-untyped-call]
    finally:
        channel.close()
        running.stop(0)
        tracing.shutdown()
        tracing.configure()  # back to this process's environment: off in the tests


def server_spans(exporter: InMemorySpanExporter, method: str) -> list[ReadableSpan]:
    name = f"memsvc.v1.MemoryService/{method}"
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_a_callers_error_is_not_the_servers_and_tenants_hide_the_rest_of_the_id(
    traced: tuple[pb_grpc.MemoryServiceStub, InMemorySpanExporter],
) -> None:
    stub, exporter = traced
    meta = [("traceparent", CALLER)]
    with pytest.raises(grpc.RpcError) as refused:
        stub.EmbedDb(pb.EmbedDbRequest(query_text="q", mode=99), metadata=meta)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    stub.EmbedDb(
        pb.EmbedDbRequest(
            query_text="where", filters=pb.SearchFilters(conversation_ids=["acme/alice/7"])
        ),
        metadata=meta,
    )
    bad, good = server_spans(exporter, "EmbedDb")
    assert bad.attributes is not None and good.attributes is not None
    assert bad.attributes["rpc.grpc.status_code"] == 3
    assert bad.status.status_code is StatusCode.UNSET  # the caller's mistake
    assert good.attributes["rpc.grpc.status_code"] == 0
    assert good.attributes["memsvc.conversation"] == "acme/"
    assert format(good.context.trace_id, "032x") == CALLER.split("-")[1]


def test_a_failure_of_the_server_is_an_error_span(
    traced: tuple[pb_grpc.MemoryServiceStub, InMemorySpanExporter],
) -> None:
    _, exporter = traced
    starting = start_server("127.0.0.1:0")  # not ready: every call is UNAVAILABLE
    try:
        with grpc.insecure_channel(f"127.0.0.1:{starting.port}") as channel:
            stub = pb_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as failed:
                stub.GetIndexStatus(pb.GetIndexStatusRequest())
    finally:
        starting.stop(0)
    assert failed.value.code() is grpc.StatusCode.UNAVAILABLE
    (span,) = server_spans(exporter, "GetIndexStatus")
    assert span.attributes is not None
    assert span.attributes["rpc.grpc.status_code"] == 14
    assert span.status.status_code is StatusCode.ERROR


def test_a_latency_sample_carries_its_trace_id_as_an_exemplar(
    traced: tuple[pb_grpc.MemoryServiceStub, InMemorySpanExporter],
) -> None:
    stub, exporter = traced
    stub.EmbedDb(pb.EmbedDbRequest(query_text="where", top_k=1), metadata=[("traceparent", CALLER)])
    port = metrics.serve_metrics("127.0.0.1:0")
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        text = reply.read().decode()
    trace_id = CALLER.split("-")[1]
    rpc = [line for line in text.splitlines() if line.startswith("memsvc_rpc_duration_seconds")]
    stage = [line for line in text.splitlines() if line.startswith("memsvc_stage_duration")]
    assert any(f'trace_id="{trace_id}"' in line for line in rpc)
    assert any(f'trace_id="{trace_id}"' in line for line in stage)
    assert {s.name for s in exporter.get_finished_spans()} >= {"search embed", "search dense"}


def test_stage_spans_name_the_database_or_the_model_they_wait_on(
    traced: tuple[pb_grpc.MemoryServiceStub, InMemorySpanExporter], services: Services
) -> None:
    """OpenTelemetry's database conventions on the stages that wait on the log or the
    store; the model and its runtime on those that wait on the model."""
    stub, exporter = traced
    stub.EmbedDb(pb.EmbedDbRequest(query_text="where", top_k=3))
    spans = {s.name: dict(s.attributes or {}) for s in exporter.get_finished_spans()}
    assert spans["search dense"] == {
        "db.system.name": "milvus",
        "db.collection.name": services.store.collection,
        "db.operation.name": "search",
    }
    assert spans["search keyword"]["db.operation.name"] == "search"
    logged = [a for name, a in spans.items() if tracing.STAGE_TARGETS.get(name, ("",))[0] == "log"]
    assert logged and all(a == {"db.system.name": "sqlite"} for a in logged)
    assert spans["search embed"] == {
        "memsvc.model": services.embedder.name,
        "memsvc.runtime": services.describe().embed_backend,
    }


@pytest.mark.parametrize("log", ["sqlite", "postgresql"])
def test_a_lease_handed_back_keeps_the_links_for_the_step_that_does_the_work(
    tmp_path: Path, embedder: Embedder, log: str, request: pytest.FixtureRequest
) -> None:
    """Regression: a released or failed lease dropped the links it took, so the step that
    later indexed the conversation linked none of the calls that queued it."""
    shared = {}
    if log == "postgresql":
        cluster: PostgresCluster = request.getfixturevalue("postgres")
        shared["database_url"] = cluster.create_database()
    tracing.start(TracerProvider())
    svc = build_services(make_settings(tmp_path, index_workers=0, **shared), embedder=embedder)
    try:
        with tracing.span("append"):
            svc.ingest.append(conversation("handed-back", EN_TURNS)[:3])
            recorded = tracing.traceparent()
        (first,) = svc.queue.lease(None, 60.0, 10, "a worker")
        svc.queue.release(first)
        (second,) = svc.queue.lease(None, 60.0, 10, "a worker")
        svc.queue.fail(second, "a store error", max_attempts=5, backoff_s=0.0)
        (third,) = svc.queue.lease(None, 60.0, 10, "a worker")
    finally:
        svc.close()
        tracing.shutdown()
        tracing.configure()
    assert recorded.startswith("00-")
    assert first.trace_links == second.trace_links == third.trace_links == (recorded,)


def test_an_index_step_on_another_replica_links_to_the_append_that_queued_it(
    tmp_path: Path, embedder: Embedder, postgres: PostgresCluster
) -> None:
    """Replica A appends (no index worker of its own); replica B, sharing A's PostgreSQL
    log and Milvus server, indexes: B's step is a span of its own trace, linked to A's
    appends, the second one too whether B leased it or found it done by the step that had
    leased the first (regression: that step did its work without linking it)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.start(provider)
    milvus = MilvusServer(tmp_path / "shared-milvus.db")
    shared = {"database_url": postgres.create_database(), "milvus_uri": milvus.uri}
    a = build_services(make_settings(tmp_path / "a", **shared, index_workers=0), embedder=embedder)
    b = build_services(make_settings(tmp_path / "b", **shared), embedder=embedder)
    try:
        appends = []
        for first in (0, 3):  # two appends before B's worker leases the conversation
            with tracing.span("append on A") as appending:
                a.ingest.append(conversation("linked", EN_TURNS)[first : first + 3])
            appends.append(appending.get_span_context())
        b.worker.notify()
        until_idle(b, "linked")
    finally:
        a.close()
        b.close()
        milvus.stop()
        tracing.shutdown()
        tracing.configure()
    steps = [s for s in exporter.get_finished_spans() if s.name == "index step" and s.links]
    linked = {(k.context.trace_id, k.context.span_id) for s in steps for k in s.links}
    assert {(c.trace_id, c.span_id) for c in appends} <= linked
    for step in steps:  # a trace of its own, linked: never a child of the append
        assert step.parent is None and step.context.trace_id not in {c.trace_id for c in appends}
    assert any(s.attributes and s.attributes["memsvc.chunks"] for s in steps)


def test_a_step_that_finds_later_work_done_links_that_call_too(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Regression: a step leases a conversation, a second append lands, and the step's plan
    (read from the log as it is then) does both: its span links both appends."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.start(provider)
    svc = build_services(make_settings(tmp_path, index_workers=0), embedder=embedder)
    try:
        with tracing.span("first append") as first:
            svc.ingest.append(conversation("later", EN_TURNS)[:3])
        leased = svc.queue.lease(None, 60.0, 10, "this test")
        with tracing.span("second append") as second:
            svc.ingest.append(conversation("later", EN_TURNS)[3:])
        svc.worker.process(leased)
        assert svc.queue.status(["later"])[0].state == "idle"
    finally:
        svc.close()
        tracing.shutdown()
        tracing.configure()
    (step,) = [s for s in exporter.get_finished_spans() if s.name == "index step"]
    linked = {(k.context.trace_id, k.context.span_id) for k in step.links}
    expected = {
        (s.get_span_context().trace_id, s.get_span_context().span_id) for s in (first, second)
    }
    assert linked == expected


def test_every_stage_in_the_code_is_named_where_operators_read_it() -> None:
    """The stage spans are the stages of memsvc_stage_duration_seconds: every one the code
    times is in the metric's help (the metrics reference, and the tracing page's pointer)."""
    package = Path(metrics.__file__).parents[1]
    timed = {
        match
        for source in package.rglob("*.py")
        for match in re.findall(r'stage\("(\w+)", "(\w+)"\)', source.read_text())
    }
    help_text = metrics.STAGE_DURATION._documentation
    named = {
        (operation, name)
        for operation, names in re.findall(r"(search|write): ([\w |]+)", help_text)
        for name in re.findall(r"\w+", names)
    }
    assert timed and timed <= named, timed - named
    assert {f"{operation} {name}" for operation, name in timed} == set(tracing.STAGE_TARGETS)
    page = (package.parent / "docs/operations/tracing.md").read_text()
    for stage_name, (_, operation) in tracing.STAGE_TARGETS.items():
        row = next(line for line in page.splitlines() if line.startswith(f"| `{stage_name[:6]}"))
        assert f"`{stage_name.split()[1]}`" in row and (not operation or f"`{operation}`" in row)
