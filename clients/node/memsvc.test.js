// Starts memsvc on a free loopback port and drives it through the Node client:
// Build -> Upsert -> EmbedDb -> AppendEvents -> WaitForIndexed -> a bad request whose field
// violation is read from the status details. Run: make test-clients.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { connect, errorDetails } from "./memsvc.js";
import { startMemsvc } from "../testing.js";

let server;
let client;

before(async () => {
  server = await startMemsvc(async (target) => {
    client?.close();
    client = connect(target);
    await client.EmbedChunk({ query: "ready?" }, { deadlineMs: 5_000 });
  });
});

after(async () => {
  client?.close();
  await server?.stop();
});

const event = (conversation_id, turn_id, text) => ({
  conversation_id,
  turn_id: String(turn_id), // int64 travels as a decimal string with longs: String
  speaker: turn_id % 2 === 0 ? "user" : "assistant",
  text,
  timestamp: `2026-02-02T10:0${turn_id}:00+08:00`,
});

test("build, upsert, search", async () => {
  const built = await client.BuildIncrementalChunks({
    events: [
      event("node-1", 0, "Hi! I just adopted a puppy named Biscuit."),
      event("node-1", 1, "Congratulations! What breed is Biscuit?"),
    ],
  });
  assert.equal(built.conversation_id, "node-1");
  assert.equal(built.turn_range.end, "1"); // a string, not a Long: "1" + 1 would be "11"
  assert.ok(built.chunks.length >= 1);
  const upserted = await client.UpsertVectorRecords({ records: built.chunks });
  assert.equal(upserted.errors.length, 0);
  assert.equal(upserted.upserted, built.chunks.length);
  const found = await client.EmbedDb({
    query_text: "what is the dog called?",
    mode: "SEARCH_MODE_HYBRID",
    filters: { conversation_ids: ["node-1"] },
  });
  assert.equal(found.mode, "SEARCH_MODE_HYBRID");
  assert.ok(found.hits.some((h) => h.text.includes("Biscuit")));
  await assert.rejects(() => client.EmbedDb({ query_text: "x", mode: "SEARCH_MODE_FAST" }), TypeError);
});

test("append and wait until indexed", async () => {
  const appended = await client.AppendEvents({
    events: [event("node-2", 0, "I live in Lisbon."), event("node-2", 1, "Lisbon is lovely.")],
  });
  assert.equal(appended.accepted, 2);
  const waited = await client.WaitForIndexed(
    { conversation_id: "node-2", turn_id: "1", timeout_ms: 120_000 },
    { deadlineMs: 130_000 },
  );
  assert.equal(waited.indexed, true);
  assert.equal(waited.status.last_indexed_turn, "1");
});

test("a bad request names its field in the status details", async () => {
  const err = await client.EmbedDb({ query_text: "x", top_k: 1000 }).then(
    () => assert.fail("expected INVALID_ARGUMENT"),
    (e) => e,
  );
  assert.equal(err.code, 3); // INVALID_ARGUMENT
  const details = errorDetails(err);
  assert.deepEqual(details.fieldViolations, [{ field: "top_k", description: "must be 0 (= 6) to 100" }]);
  const missing = await client.WaitForIndexed({ conversation_id: "nope", timeout_ms: 10 }).catch((e) => e);
  assert.equal(missing.code, 5); // NOT_FOUND
  assert.equal(errorDetails(missing).errorInfo.reason, "NOT_FOUND");
});
