// A Vercel AI SDK agent whose memory is memsvc: run it twice and the second run finds what
// the first one said. The app stores each exchange (addTurns); the model searches with the
// search_memory tool. Offline: a stand-in model (../testdata/stand-ins.ts) calls the tool
// and answers with what it returned; swap in any model.
//
//   .venv/bin/memsvc serve &                    # or make run
//   (cd clients && npm install && npm run generate)
//   cd clients/ts && npx tsx examples/ai-sdk-memory.ts "My sister Lena looks after the dog on Fridays."
//   npx tsx examples/ai-sdk-memory.ts "Who looks after the dog?"   -> ... Lena looks after the dog ...
//
// Flags: --target HOST:PORT, --session ID.
import { parseArgs } from "node:util";
import { generateText, stepCountIs } from "ai";
import { addTurns, memsvcTools } from "../integrations/ai-sdk.js";
import { memoryToolsModel, memsvcClient } from "../testdata/stand-ins.js";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { target: { type: "string", default: "127.0.0.1:50051" }, session: { type: "string", default: "example-ai" } },
});
const client = memsvcClient(values.target);
const conversationId = values.session!;
const { text } = await generateText({
  model: memoryToolsModel(),
  tools: memsvcTools(client, { conversationId }),
  stopWhen: stepCountIs(3),
  prompt: positionals[0],
  onFinish: async ({ text: answer }) => {
    // the exchange, stored by the app; searchable before the next run
    const turns = [{ speaker: "user" as const, text: positionals[0] }, { speaker: "assistant" as const, text: answer }];
    await addTurns(client, conversationId, turns, { wait: true });
  },
});
console.log(text);
