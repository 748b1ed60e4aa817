// An OpenAI Agents SDK (JS) agent whose session is kept in memsvc: run it twice and the
// second run's model is given the first run's items. Offline: a stand-in model
// (../testdata/stand-ins.ts) says how many items it was given and the first one; swap in any
// model.
//
//   .venv/bin/memsvc serve &                    # or make run
//   (cd clients && npm install && npm run generate)
//   cd clients/ts && npx tsx examples/agents-memory.ts "I live in Lyon."
//   npx tsx examples/agents-memory.ts "Where do I live?"   -> saw 3 items; first "I live in Lyon." ...
//
// Flags: --target HOST:PORT, --session ID.
import { parseArgs } from "node:util";
import { Agent, run } from "@openai/agents";
import { MemsvcSession } from "../integrations/openai-agents.js";
import { EchoModel, memsvcClient } from "../testdata/stand-ins.js";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { target: { type: "string", default: "127.0.0.1:50051" }, session: { type: "string", default: "example-agents" } },
});
const session = new MemsvcSession(memsvcClient(values.target), values.session!);
const agent = new Agent({ name: "assistant", instructions: "Answer briefly.", model: new EchoModel() });
const result = await run(agent, positionals[0], { session });
console.log(result.finalOutput);
