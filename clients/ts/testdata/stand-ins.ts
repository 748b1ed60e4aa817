// Offline stand-ins for the integration tests and for the snippets of README.md and
// docs/surfaces/clients.md that use `client` and `model` (clients/snippets.test.js puts
// `const client = memsvcClient(); const model = ...` before them).
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Usage, type AgentInputItem, type Model, type ModelRequest, type ModelResponse } from "@openai/agents-core";
import { MockLanguageModelV3 } from "ai/test";
import { MemoryService } from "../gen/memsvc/v1/memory_pb.js";
import type { MemoryClient } from "../integrations/client.js";

/** A client of the memsvc at `target` (default: $MEMSVC_TARGET). */
export function memsvcClient(target = process.env.MEMSVC_TARGET): MemoryClient {
  return createClient(MemoryService, createGrpcTransport({ baseUrl: `http://${target}` }));
}

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 1, text: 1, reasoning: undefined },
};

type Found = { text: string };

// What the stand-in says after a tool call: the turns a search found (their lines, without
// the chunk's context line), the ids add_turns stored, or the tool's error.
function answerFrom(output: { type: string; value?: unknown }): string {
  const value = output.value as { hits?: Found[]; standing?: Found[]; turn_ids?: number[] } | string;
  if (output.type !== "json" || typeof value !== "object") return `error: ${String(value)}`;
  if (value.turn_ids) return `stored turns ${value.turn_ids.join(", ")}`;
  const found = [...(value.standing ?? []), ...(value.hits ?? [])];
  const lines = found.map((h) => h.text.split("\n").slice(1).join(" "));
  return `remembered: ${lines.join(" / ") || "(nothing yet)"}`;
}

/**
 * An AI SDK model that calls memsvc's tools: "remember: X" stores X (and its reply "Noted.")
 * with add_turns; anything else is searched with search_memory. Then it says what the tool
 * gave it.
 */
export function memoryToolsModel(): MockLanguageModelV3 {
  return new MockLanguageModelV3({
    doGenerate: async ({ prompt }) => {
      const last = prompt.at(-1)!;
      if (last.role === "tool") {
        const [part] = last.content;
        const text = part.type === "tool-result" ? answerFrom(part.output) : "";
        return { content: [{ type: "text", text }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
      }
      const said = last.role === "user" && last.content[0].type === "text" ? last.content[0].text : "";
      const remember = said.startsWith("remember: ") ? said.slice("remember: ".length) : undefined;
      const call =
        remember !== undefined
          ? {
              toolName: "add_turns",
              input: { turns: [{ speaker: "user", text: remember }, { speaker: "assistant", text: "Noted." }], wait: true },
            }
          : { toolName: "search_memory", input: { query: said, top_k: 3 } };
      return {
        content: [{ type: "tool-call", toolCallId: "call_1", toolName: call.toolName, input: JSON.stringify(call.input) }],
        finishReason: { unified: "tool-calls", raw: undefined },
        usage,
        warnings: [],
      };
    },
  });
}

const userItem = (text: string): AgentInputItem => ({ role: "user", content: [{ type: "input_text", text }] });

/**
 * An Agents SDK model that calls get_weather when asked about weather, and otherwise says
 * what it saw: how many items the run gave it, the first and the last.
 */
export class EchoModel implements Model {
  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    const input = typeof request.input === "string" ? [userItem(request.input)] : request.input;
    const said = (item: AgentInputItem | undefined) => {
      const fields = (item ?? {}) as Record<string, unknown>;
      return JSON.stringify(fields.content ?? fields.output);
    };
    const last = input.at(-1) as Record<string, unknown>;
    const output: ModelResponse["output"] =
      said(input.at(-1)).includes("weather") && last.type !== "function_call_result"
        ? [
            {
              type: "function_call",
              callId: `call_${input.length}`,
              name: "get_weather",
              arguments: '{"city":"Lisbon"}',
              status: "completed",
            },
          ]
        : [
            {
              type: "message",
              role: "assistant",
              status: "completed",
              content: [
                {
                  type: "output_text",
                  text: `saw ${input.length} items; first ${said(input[0])}; last ${said(input.at(-1))}`,
                },
              ],
            },
          ];
    return { usage: new Usage(), output };
  }

  getStreamedResponse(): AsyncIterable<never> {
    throw new Error("not streamed");
  }
}
