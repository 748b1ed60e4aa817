// The TypeScript integrations against the real frameworks and a real memsvc: the OpenAI
// Agents SDK session (the cases of the SDK's own MemorySession, runs of a real Agent with a
// tool call, side by side with MemorySession, and two processes writing one session), the
// AI SDK tools (generateText with the SDK's mock model calling them) and the examples.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import path from "node:path";
import { promisify } from "node:util";
import {
  Agent,
  MemorySession,
  run,
  setTracingDisabled,
  tool as agentTool,
  type AgentInputItem,
  type Session,
} from "@openai/agents";
import { generateText, stepCountIs, type ModelMessage } from "ai";
import { z } from "zod";
import { memsvcTools } from "./integrations/ai-sdk.js";
import type { MemoryClient } from "./integrations/client.js";
import { MemsvcSession } from "./integrations/openai-agents.js";
import { singleId } from "./integrations/ids.js";
import { joined, split } from "./integrations/parts.js";
import { create } from "@bufbuild/protobuf";
import { MemoryEventSchema } from "./gen/memsvc/v1/memory_pb.js";
import { EchoModel, memoryToolsModel, memsvcClient } from "./testdata/stand-ins.js";
import { ROOT, startMemsvc } from "../testing.js";

let server: { target: string; http: string; stop: () => Promise<void> } | undefined;
let client: MemoryClient;
// Child processes: the two-process writers and the examples.
const exec = promisify(execFile);

before(async () => {
  setTracingDisabled(true);
  server = await startMemsvc(async (target: string) => {
    client = memsvcClient(target);
    await client.embedChunk({ query: "ready?" }, { timeoutMs: 5_000 });
  });
});

after(() => server?.stop());

const user = (text: string): AgentInputItem => ({
  role: "user",
  content: [{ type: "input_text", text }],
});

// ---- OpenAI Agents SDK: the cases of the SDK's MemorySession tests ----------------------

test("agents: stores and returns items in order, with a limit", async () => {
  const session = new MemsvcSession(client, "agents-order");
  assert.equal(await session.getSessionId(), "agents-order");
  assert.deepEqual(await session.getItems(), []);
  const items = [user("hello"), user("how are you?"), user("bye")];
  await session.addItems(items.slice(0, 1));
  await session.addItems(items.slice(1));
  assert.deepEqual(await session.getItems(), items);
  assert.deepEqual(await session.getItems(2), items.slice(1));
  assert.deepEqual(await session.getItems(10), items);
  assert.deepEqual(await session.getItems(0), []);
});

test("agents: popItem takes the newest, then the next; empty gives undefined", async () => {
  const session = new MemsvcSession(client, "agents-pop");
  assert.equal(await session.popItem(), undefined);
  await session.addItems([user("one"), user("two")]);
  assert.deepEqual(await session.popItem(), user("two"));
  assert.deepEqual(await session.getItems(), [user("one")]);
  assert.deepEqual(await session.popItem(), user("one"));
  assert.equal(await session.popItem(), undefined);
  await session.addItems([user("three")]);
  assert.deepEqual(await session.getItems(), [user("three")]);
});

test("agents: turns holding no item are skipped by getItems and dropped by popItem", async () => {
  // as the Python session (and the SDK's SQLiteSession, whose tests insert corrupt rows)
  const session = new MemsvcSession(client, "agents-corrupt");
  await session.addItems([user("valid 0"), user("valid 1"), user("valid 2")]);
  const reply = await client.appendEvents({
    events: [{ conversationId: "agents-corrupt", speaker: "user", text: "x", payload: "{{{" }],
    assignTurnIds: true,
  });
  assert.equal(reply.errors.length, 0);
  assert.deepEqual(await session.getItems(2), [user("valid 1"), user("valid 2")]);
  assert.deepEqual(await session.popItem(), user("valid 2"));
  assert.deepEqual(await session.getItems(), [user("valid 0"), user("valid 1")]);
});

test("agents: clearSession empties it, and a session never written clears quietly", async () => {
  const session = new MemsvcSession(client, "agents-clear");
  await session.clearSession();
  await session.addItems([user("a"), user("b")]);
  await session.clearSession();
  assert.deepEqual(await session.getItems(), []);
  await session.addItems([user("c")]);
  assert.deepEqual(await session.getItems(), [user("c")]);
});

test("agents: tool calls, their results and provider data round-trip exactly", async () => {
  const items: AgentInputItem[] = [
    user("weather in Lisbon?"),
    {
      type: "function_call",
      callId: "call_1",
      name: "get_weather",
      arguments: '{"city":"Lisbon"}',
      status: "completed",
      providerData: { nested: { n: 1, list: [true, null, "é"] } },
    },
    {
      type: "function_call_result",
      callId: "call_1",
      name: "get_weather",
      status: "completed",
      output: { type: "text", text: "sunny, 21 °C" },
    },
    {
      type: "message",
      role: "assistant",
      status: "completed",
      content: [{ type: "output_text", text: "Sunny 🌞, 21 °C." }],
    },
  ];
  const session = new MemsvcSession(client, "agents-roundtrip");
  await session.addItems(items);
  assert.deepEqual(await new MemsvcSession(client, "agents-roundtrip").getItems(), items);
  // memsvc searches what the items say, not their JSON; speakers follow the items
  const exported = await client.exportEvents({ conversationId: "agents-roundtrip" });
  assert.deepEqual(
    exported.events.map((e) => [e.speaker, e.text]),
    [
      ["user", "weather in Lisbon?"],
      ["assistant", 'get_weather\n{"city":"Lisbon"}'],
      ["system", "get_weather\nsunny, 21 °C"],
      ["assistant", "Sunny 🌞, 21 °C."],
    ],
  );
});

test("agents: a huge tool output is searchable by its head and comes back whole", async () => {
  const output = "log line ".repeat(20_000) + "🌞";
  const item: AgentInputItem = {
    type: "function_call_result",
    callId: "call_big",
    name: "tail_log",
    status: "completed",
    output,
  };
  const session = new MemsvcSession(client, "agents-huge", { maxTextChars: 1_000 });
  await session.addItems([item]);
  assert.deepEqual(await session.getItems(), [item]);
  const [event] = (await client.exportEvents({ conversationId: "agents-huge" })).events;
  assert.equal([...event.text].length, 1_000);
});

async function allTurns(conversationId: string) {
  const turns = [];
  let pageToken = "";
  do {
    const page = await client.exportEvents({ conversationId, pageToken });
    turns.push(...page.events);
    pageToken = page.nextPageToken;
  } while (pageToken);
  return turns;
}

test("agents: session ids memsvc would fold keep apart, mapped as the Python adapters map them", async () => {
  // issue 83, item 2: ids went through raw, and the server folds them (NFC, runs of spaces)
  assert.deepEqual(
    ["x  !'()*", "a/b  c", "café ", "tab\there", "100%", "acme/u 1"].map(singleId),
    ["x%20%20%21%27%28%29%2A", "a/b%20%20c", "caf%C3%A9%20", "tab%09here", "100%25", "acme/u 1"],
  );
  const pairs = [
    ["x  y", "x y"],
    ["id ", "id"],
    ["cafe\u0301", "caf\u00e9"],
  ];
  for (const [one, other] of pairs) {
    await new MemsvcSession(client, one).addItems([user(`said in ${JSON.stringify(one)}`)]);
    await new MemsvcSession(client, other).addItems([user(`said in ${JSON.stringify(other)}`)]);
    for (const id of [one, other]) {
      assert.deepEqual(await new MemsvcSession(client, id).getItems(), [
        user(`said in ${JSON.stringify(id)}`),
      ]);
    }
  }
});

test("agents: an image over the payload limit is kept in parts, whole, counted and popped once", async () => {
  // issue 83, item 3: a 3.2M-character data URL was refused and the call kept no item
  const image = "data:image/png;base64," + "iVBORw0K".repeat(400_000);
  const photo: AgentInputItem = {
    role: "user",
    content: [
      { type: "input_text", text: "my new passport's photo page" },
      { type: "input_image", image },
    ],
  };
  const items = [user("I renewed my passport."), photo, user("Keep it for the visa form.")];
  const session = new MemsvcSession(client, "agents-image");
  await session.addItems(items);
  assert.deepEqual(await session.getItems(), items);
  assert.deepEqual(await session.getItems(2), items.slice(1));
  const turns = await allTurns("agents-image"); // pages are cut by bytes
  assert.equal(turns.length, 6); // the image in four parts of a million characters
  assert.equal(turns[1].payload.split("\n")[0].split(" ")[1], "1/4"); // the Python format
  assert.deepEqual(await session.popItem(), items[2]);
  assert.deepEqual(await session.popItem(), photo);
  assert.deepEqual(await session.getItems(), items.slice(0, 1));
  assert.equal((await allTurns("agents-image")).length, 1); // no part left behind
});

test("agents: parts have the Python adapters' header, and a cut item is left out", async () => {
  const turn = { text: "t", payload: "é".repeat(3_000_001) };
  const parts = await split(turn);
  assert.deepEqual(
    parts.map((p) => p.payload.slice(0, p.payload.indexOf("\n"))),
    [1, 2, 3, 4].map((i) => `memsvc-part ${i}/4 b015ed342c4707f4f2991127b3907c22 ""`),
  );
  const events = parts.map((p, i) =>
    create(MemoryEventSchema, { ...p, conversationId: "c", turnId: BigInt(i) }),
  );
  assert.equal((await joined(events))[0].payload, turn.payload);
  assert.deepEqual(await joined(events.slice(1)), []);
  assert.deepEqual(await joined(events.slice(0, 3)), []);
});

test("agents: a popped item stays deleted, also in search", async () => {
  const session = new MemsvcSession(client, "agents-deleted");
  await session.addItems([user("My locker code is 4417."), user("The parrot is called Kiwi.")]);
  await session.popItem();
  await client.waitForIndexed({ conversationId: "agents-deleted", turnId: 1n, timeoutMs: 60_000 });
  const found = await client.embedDb({
    queryText: "parrot Kiwi",
    filters: { conversationIds: ["agents-deleted"] },
  });
  assert.ok(found.hits.length > 0, "the kept turn is still found");
  assert.ok(found.hits.every((h) => !h.text.includes("Kiwi")), "the popped turn is gone");
  assert.deepEqual(await session.getItems(), [user("My locker code is 4417.")]);
});

const weatherAgent = new Agent({
  name: "assistant",
  instructions: "Answer briefly.",
  model: new EchoModel(),
  tools: [
    agentTool({
      name: "get_weather",
      description: "The weather in a city.",
      parameters: z.object({ city: z.string() }),
      execute: async ({ city }) => `sunny in ${city}`,
    }),
  ],
});

test("agents: runs of a real Agent keep the same history in memsvc as in MemorySession", async () => {
  const reference = new MemorySession();
  const sessions = (): Session[] => [reference, new MemsvcSession(client, "agents-run")];
  const turns = ["I'm Ana.", "What's the weather?", "Thanks!"];
  for (const input of turns) {
    const outputs = [];
    for (const session of sessions()) {
      outputs.push((await run(weatherAgent, input, { session })).finalOutput);
    }
    assert.equal(outputs[0], outputs[1]); // the model saw the same history
  }
  const kept = await new MemsvcSession(client, "agents-run").getItems();
  assert.deepEqual(kept, await reference.getItems());
  assert.ok(
    kept.some((i) => (i as { type?: string }).type === "function_call_result"),
    "the tool call's result is kept",
  );
  const last = await run(weatherAgent, "What did I say first?", {
    session: new MemsvcSession(client, "agents-run"),
  });
  assert.match(String(last.finalOutput), new RegExp(`saw ${kept.length + 1} items`));
});

test("agents: two processes writing one session lose nothing and keep each call together", async () => {
  const writer = path.join(ROOT, "clients", "ts", "testdata", "session-writer.ts");
  const count = 15;
  await Promise.all(
    ["a", "b"].map((name) =>
      exec(process.execPath, ["--import", "tsx", writer, server!.target, "agents-two", name, String(count)], {
        cwd: path.join(ROOT, "clients"),
      }),
    ),
  );
  const items = await new MemsvcSession(client, "agents-two").getItems();
  assert.equal(items.length, 2 * 2 * count);
  const texts = items.map((i) => JSON.stringify(i));
  for (const name of ["a", "b"]) {
    const at = Array.from({ length: count }, (_, i) =>
      texts.findIndex((t) => t.includes(`"${name} asks ${i}"`)),
    );
    assert.ok(at.every((n, i) => n >= 0 && (i === 0 || n > at[i - 1])), `${name}'s calls in order`);
    at.forEach((n, i) => assert.ok(texts[n + 1].includes(`${name} answer ${i}`), "a call together"));
  }
});

// ---- Vercel AI SDK: memory as tools of generateText --------------------------------------

async function ask(prompt: string, conversationId: string) {
  return generateText({
    model: memoryToolsModel(),
    tools: memsvcTools(client, { conversationId }),
    stopWhen: stepCountIs(2),
    prompt,
  });
}

test("ai-sdk: what a generateText call stores, a later call finds", async () => {
  const stored = await ask("remember: The spare key is under the blue flowerpot.", "ai-key");
  const [added] = stored.steps[0].toolResults;
  assert.equal(added.toolName, "add_turns");
  assert.deepEqual(added.output, { accepted: 2, duplicates: 0, turn_ids: [0, 1], indexed: true });
  await ask("remember: Always tell me which room, when I ask where something is kept.", "ai-key");
  await ask("remember: The spare key is under the blue flowerpot.", "ai-other");

  const found = await ask("recall: where is the spare key?", "ai-key");
  const [searched] = found.steps[0].toolResults;
  assert.equal(searched.toolName, "search_memory");
  const { hits, standing } = searched.output as {
    hits: { conversation_id: string; text: string; turn_start: number }[];
    standing: { conversation_id: string; text: string }[];
  };
  // The fact is a hit; the rule, a chunk of its own, comes in `standing` (it applies).
  assert.ok(hits.some((h) => h.text.includes("blue flowerpot")), "the fact among the hits");
  assert.ok(standing.some((h) => h.text.includes("which room")), "the rule in standing");
  assert.ok(
    [...standing, ...hits].every((h) => h.conversation_id === "ai-key"),
    "never another conversation",
  );
  assert.ok(found.text.includes("blue flowerpot"), "the model's answer used the tool's output");
});

test("ai-sdk: a refused add_turns reaches the model as a tool error naming the field", async () => {
  const messages: ModelMessage[] = [{ role: "user", content: "remember: " + "x".repeat(100_001) }];
  const result = await generateText({
    model: memoryToolsModel(),
    tools: memsvcTools(client, { conversationId: "ai-refused" }),
    stopWhen: stepCountIs(2),
    messages,
  });
  const errors = result.steps[0].content.filter((p) => p.type === "tool-error");
  assert.equal(errors.length, 1);
  assert.match(String((errors[0] as { error: unknown }).error), /nothing was written.*text/);
  const status = await client.getIndexStatus({ conversationIds: ["ai-refused"] });
  assert.ok(
    status.conversations.every((s) => s.lastAppendedTurn === -1n),
    "nothing was appended",
  );
});

// ---- examples: each run twice, as a user would; the second run remembers the first ------

async function example(name: string, message: string, session: string): Promise<string> {
  const { stdout } = await exec(
    process.execPath,
    ["--import", "tsx", path.join("examples", name), message, "--target", server!.target, "--session", session],
    { cwd: path.join(ROOT, "clients", "ts"), env: { ...process.env, OPENAI_AGENTS_DISABLE_TRACING: "1" } },
  );
  return stdout.trim();
}

test("examples: the AI SDK agent finds what the first run said", async () => {
  const said = "My sister Lena looks after the dog on Fridays.";
  assert.equal(await example("ai-sdk-memory.ts", said, "ex-ai"), "remembered: (nothing yet)");
  const second = await example("ai-sdk-memory.ts", "Who looks after the dog?", "ex-ai");
  assert.match(second, /^remembered: .*Lena looks after the dog on Fridays/);
});

test("examples: the Agents SDK agent is given the first run's items", async () => {
  const first = await example("agents-memory.ts", "I live in Lyon.", "ex-agents");
  assert.match(first, /^saw 1 items; first "I live in Lyon."/);
  const second = await example("agents-memory.ts", "Where do I live?", "ex-agents");
  assert.match(second, /^saw 3 items; first "I live in Lyon."; last "Where do I live\?"/);
});
