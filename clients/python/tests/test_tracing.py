"""The caller's OpenTelemetry trace continues in memsvc: the client sends the current
context (W3C `traceparent`) with every call, sync and async. The application here has the
OpenTelemetry SDK (this venv has it through google-adk); memsvc, in a child process with
traces on, prints its spans (OTEL_TRACES_EXPORTER=console), read back at its stop."""

from __future__ import annotations

import asyncio
import json
import tempfile
import unittest
from pathlib import Path
from typing import Any

from memsvc_client import AsyncMemoryClient, MemoryClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.test_client import READER, Server


def printed_spans(text: str) -> list[dict[str, Any]]:
    """The JSON objects ConsoleSpanExporter printed, one after another."""
    decoder, spans, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) >= 0:
        span, at = decoder.raw_decode(text, at)
        spans.append(span)
    return spans


class TraceContextTest(unittest.TestCase):
    def test_the_callers_trace_continues_in_memsvc_sync_and_async(self) -> None:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("agent")
        with tempfile.TemporaryDirectory() as tmp:
            printed = Path(tmp) / "spans.json"
            with printed.open("w") as out:
                server = Server(env={"OTEL_TRACES_EXPORTER": "console"}, stdout=out)
                try:
                    with MemoryClient(server.target, token=READER) as client:
                        client.search("untraced", conversation_ids=["c"])
                        with tracer.start_as_current_span("agent turn"):
                            client.search("traced", conversation_ids=["c"])

                    async def search() -> None:
                        async with AsyncMemoryClient(server.target, token=READER) as aio:
                            with tracer.start_as_current_span("agent turn, async"):
                                await aio.search("traced", conversation_ids=["c"])

                    asyncio.run(search())
                finally:
                    server.stop()  # a clean stop exports what is still buffered
            spans = printed_spans(printed.read_text())

        callers = {f"0x{s.context.span_id:016x}": s.name for s in exporter.get_finished_spans()}
        searches = [s for s in spans if s["name"] == "memsvc.v1.MemoryService/EmbedDb"]
        parents = sorted(callers.get(s["parent_id"] or "", "no parent") for s in searches)
        self.assertEqual(parents, ["agent turn", "agent turn, async", "no parent"])
        for caller in exporter.get_finished_spans():
            trace_id = f"0x{caller.context.trace_id:032x}"
            self.assertIn(trace_id, {s["context"]["trace_id"] for s in searches})


if __name__ == "__main__":
    unittest.main()
