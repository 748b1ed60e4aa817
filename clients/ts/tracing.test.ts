// traceContext(): the caller's OpenTelemetry context reaches memsvc on both transports.
// The application side is what an app with the SDK has: the AsyncLocalStorage context
// manager and the W3C propagator registered. memsvc (a child, traces on) prints its spans
// (OTEL_TRACES_EXPORTER=console), read back once it has stopped.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { createClient, type Client } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { context, propagation, trace, TraceFlags } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { MemoryService } from "./gen/memsvc/v1/memory_pb.js";
import { traceContext } from "./integrations/tracing.js";
import { startMemsvc } from "../testing.js";

function printedSpans(text: string): Array<Record<string, any>> {
  const spans = [];
  let at = 0;
  while ((at = text.indexOf("{\n", at)) >= 0) {
    let depth = 0;
    let end = at;
    for (; end < text.length; end++) {
      if (text[end] === "{") depth++;
      if (text[end] === "}" && --depth === 0) break;
    }
    spans.push(JSON.parse(text.slice(at, end + 1)));
    at = end + 1;
  }
  return spans;
}

test("the caller's trace continues in memsvc over gRPC and Connect", async () => {
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  const printed = path.join(mkdtempSync(path.join(os.tmpdir(), "memsvc-trace-")), "spans.json");
  const clients: Record<string, Client<typeof MemoryService>> = {};
  const server = await startMemsvc(
    async (target: string, http: string) => {
      const interceptors = [traceContext()];
      clients.grpc = createClient(
        MemoryService,
        createGrpcTransport({ baseUrl: `http://${target}`, interceptors }),
      );
      clients.connect = createClient(
        MemoryService,
        createConnectTransport({ baseUrl: http, httpVersion: "1.1", interceptors }),
      );
      await clients.grpc.embedChunk({ query: "ready?" }, { timeoutMs: 5_000 });
    },
    { env: { OTEL_TRACES_EXPORTER: "console" }, stdout: printed },
  );
  const callers: Record<string, string> = {};
  try {
    for (const [name, client] of Object.entries(clients)) {
      const spanId = name === "grpc" ? "00f067aa0ba902b7" : "00f067aa0ba902b8";
      const caller = trace.setSpanContext(context.active(), {
        traceId: "4bf92f3577b34da6a3ce929d0e0e4736",
        spanId,
        traceFlags: TraceFlags.SAMPLED,
      });
      await context.with(caller, () => client.embedDb({ queryText: "traced", topK: 1 }));
      callers[`0x${spanId}`] = name;
    }
  } finally {
    await server.stop(); // a clean stop exports what is still buffered
  }
  const searches = printedSpans(readFileSync(printed, "utf8")).filter(
    (s) => s.name === "memsvc.v1.MemoryService/EmbedDb",
  );
  const continued = searches
    .filter((s) => s.context.trace_id === "0x4bf92f3577b34da6a3ce929d0e0e4736")
    .map((s) => `${callers[s.parent_id]} over ${s.attributes["memsvc.transport"]}`)
    .sort();
  assert.deepEqual(continued, ["connect over http", "grpc over grpc"]);
});
