// One of several processes writing one Agents SDK session through memsvc (the two-process
// test of integrations.test.ts): `node --import tsx session-writer.ts TARGET SESSION NAME N`
// adds N exchanges (a user item and the assistant's reply, in one call each).
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { MemoryService } from "../gen/memsvc/v1/memory_pb.js";
import { MemsvcSession } from "../integrations/openai-agents.js";

const [target, sessionId, name, count] = process.argv.slice(2);
const client = createClient(MemoryService, createGrpcTransport({ baseUrl: `http://${target}` }));
const session = new MemsvcSession(client, sessionId);
for (let i = 0; i < Number(count); i++) {
  await session.addItems([
    { role: "user", content: `${name} asks ${i}` },
    {
      type: "message",
      role: "assistant",
      status: "completed",
      content: [{ type: "output_text", text: `${name} answer ${i}` }],
    },
  ]);
}
