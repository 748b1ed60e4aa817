"""Traces (issue 67): `memsvc serve` and `memsvc mcp` in child processes, traces on through
the standard OTEL_* variables, exporting over OTLP/HTTP to a receiver that decodes the
protobuf a collector would get. Each call continues the caller's `traceparent` (gRPC
metadata, HTTP header, MCP `_meta`), in one trace across the gateway and the server, with
a span per stage, and no text of a turn or a query in any name or attribute."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from memsvc.v1 import memory_pb2 as pb
from tests.integration.test_mcp import wait_listening
from tests.support.launch import free_port, running_server
from tests.support.otlp import OtlpReceiver, ReceivedSpan

# Every text and query carries a canary: it must appear in no span name or attribute.
CANARY = "quokka-7731"
TEXTS = [
    f"My {CANARY} passport is in the left drawer of the desk.",
    f"Noted: the {CANARY} passport is in the desk's left drawer.",
]
QUERY = f"where is the {CANARY} passport"
SERVER = 2  # opentelemetry.proto.trace.v1.Span.SPAN_KIND_SERVER


def traceparent() -> tuple[str, str, str]:
    """A caller's span: (trace id, span id, the W3C header naming it, sampled)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def otel_env(receiver: OtlpReceiver, service: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: export soon after each span ends
    }


@pytest.fixture()
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.close()


EMBED_DB = "memsvc.v1.MemoryService/EmbedDb"
APPEND = "memsvc.v1.MemoryService/AppendEvents"


def descendants(spans: list[ReceivedSpan], root: ReceivedSpan) -> list[ReceivedSpan]:
    out, frontier = [], [root.span_id]
    while frontier:
        children = [s for s in spans if s.parent_span_id in frontier]
        out += children
        frontier = [s.span_id for s in children]
    return out


def one_server_span(spans: list[ReceivedSpan], trace_id: str, name: str) -> ReceivedSpan:
    named = [s for s in spans if s.trace_id == trace_id and s.name == name]
    assert len(named) == 1, [(s.service, s.name) for s in spans if s.trace_id == trace_id]
    assert named[0].kind == SERVER
    return named[0]


def search_memory_over_mcp(url: str, trace_header: str) -> None:
    async def call() -> None:
        async with Client(streamable_http_client(url)) as client:
            result = await client.call_tool(
                "search_memory",
                {"query": QUERY, "conversation_ids": ["traced/c"], "top_k": 3},
                meta={"traceparent": trace_header},  # type: ignore[typeddict-unknown-key]
            )
            assert not result.is_error, result

    asyncio.run(call())


def test_one_trace_per_call_on_grpc_http_and_mcp_with_no_text(
    tmp_path: Path, receiver: OtlpReceiver
) -> None:
    port, http_port, mcp_port = free_port(), free_port(), free_port()
    env = otel_env(receiver, "memsvc") | {"MEMSVC_HTTP_LISTEN": f"127.0.0.1:{http_port}"}
    with running_server(tmp_path / "data", env=env, port=port) as (stub, _pid):
        # HTTP: an append, its caller's trace in the `traceparent` header
        http_trace, http_parent, header = traceparent()
        events = [
            {"conversationId": "traced/c", "turnId": i, "speaker": who, "text": text,
             "timestamp": "2026-02-02T10:00:00Z"}
            for i, (who, text) in enumerate(zip(("user", "assistant"), TEXTS, strict=True))
        ]  # fmt: skip
        reply = httpx2.post(
            f"http://127.0.0.1:{http_port}/memsvc.v1.MemoryService/AppendEvents",
            json={"events": events},
            headers={"traceparent": header},
            timeout=60,
        )
        assert reply.status_code == 200 and reply.json()["accepted"] == 2, reply.text
        stub.WaitForIndexed(
            pb.WaitForIndexedRequest(conversation_id="traced/c", turn_id=1, timeout_ms=120_000)
        )
        # gRPC: a hybrid search, the caller's trace in the metadata
        grpc_trace, grpc_parent, header = traceparent()
        found = stub.EmbedDb(
            pb.EmbedDbRequest(
                query_text=QUERY,
                top_k=3,
                mode=pb.SEARCH_MODE_HYBRID,
                filters=pb.SearchFilters(conversation_ids=["traced/c"]),
            ),
            metadata=[("traceparent", header)],
        )
        assert found.hits
        # MCP: the gateway in its own process, the caller's trace in the request's `_meta`
        mcp_trace, mcp_parent, header = traceparent()
        gateway = subprocess.Popen(
            [sys.executable, "-m", "memsvc", "mcp", "--target", f"127.0.0.1:{port}"],
            env={
                **os.environ,
                **otel_env(receiver, "memsvc-mcp"),
                "MEMSVC_MCP_LISTEN": f"127.0.0.1:{mcp_port}",
                "MEMSVC_TOKEN": "",
            },
        )
        url = f"http://127.0.0.1:{mcp_port}/mcp"
        try:
            wait_listening(url, gateway)
            search_memory_over_mcp(url, header)
            # every server span asserted below: a span that ended early (a stage in a thread
            # of its own) can arrive in an export before its call's server span
            servers = {(grpc_trace, EMBED_DB), (mcp_trace, EMBED_DB), (http_trace, APPEND)}
            spans = receiver.wait(
                lambda got: (
                    servers <= {(s.trace_id, s.name) for s in got}
                    and any(s.trace_id == mcp_trace and s.service == "memsvc-mcp" for s in got)
                    and any(s.name == "index step" for s in got)
                )
            )
        finally:
            gateway.terminate()
            gateway.wait(timeout=30)

    # gRPC: one server span, the caller's child, with the search's stages under it
    search = one_server_span(spans, grpc_trace, EMBED_DB)
    assert search.parent_span_id == grpc_parent and search.service == "memsvc"
    assert search.attributes["rpc.system"] == "grpc"
    assert search.attributes["rpc.grpc.status_code"] == 0
    assert search.attributes["memsvc.transport"] == "grpc"
    assert search.attributes["memsvc.mode"] == "hybrid"
    assert search.attributes["memsvc.conversation"] == "traced/c"
    assert search.attributes["memsvc.hits"] == len(found.hits)
    stages = {s.name for s in descendants(spans, search)}
    assert {"search embed", "search dense", "search keyword", "search fuse"} <= stages, stages
    assert len(receiver.trace(grpc_trace)) == 1 + len(descendants(spans, search))

    # HTTP: the bridge carries the header into the same server span
    append = one_server_span(spans, http_trace, APPEND)
    assert append.parent_span_id == http_parent
    assert append.attributes["memsvc.transport"] == "http"
    assert append.attributes["memsvc.accepted"] == 2 and append.attributes["memsvc.events"] == 2

    # MCP: the gateway's span of the tool call, the caller's child; memsvc's span under it
    in_mcp_trace = [(s.service, s.name) for s in spans if s.trace_id == mcp_trace]
    (tool,) = [s for s in spans if s.trace_id == mcp_trace and s.service == "memsvc-mcp"]
    assert tool.kind == SERVER and tool.parent_span_id == mcp_parent, in_mcp_trace
    assert tool.attributes["gen_ai.tool.name"] == "search_memory"
    inner = one_server_span(spans, mcp_trace, EMBED_DB)
    assert inner.service == "memsvc" and inner in descendants(spans, tool)

    # the index step: its own trace, linked to the append, the write path's stages under it
    steps = [s for s in spans if s.name == "index step" and s.attributes["memsvc.chunks"]]
    assert steps, [s.attributes for s in spans if s.name == "index step"]
    step = steps[0]
    assert {"write embed", "write store"} <= {s.name for s in descendants(spans, step)}
    assert (append.trace_id, append.span_id) in step.links  # the append that queued it

    # no text anywhere
    for span in spans:
        assert CANARY not in span.name
        for key, value in span.attributes.items():
            assert CANARY not in str(value), (span.name, key)
