/**
 * memsvc as tools of the Vercel AI SDK: `generateText({ model, tools: memsvcTools(...) })`.
 *
 * `memsvcTools(client, { conversationId })` gives the two tools an agent needs, named and
 * shaped like memsvc's MCP tools so a model sees the same memory on either road:
 * - `search_memory({ query, top_k?, order?, turn_budget? })` searches the conversations the
 *   app chose (`searchConversationIds`, by default the one conversation) in the server's
 *   default mode and returns `{ standing, hits }`: the user's standing instructions that
 *   apply, then passages of consecutive turns, each with its conversation, turn range, time,
 *   speakers and score.
 * - `add_turns({ turns: [{ speaker, text }], wait? })` appends turns to `conversationId`.
 *   The server numbers and stamps them (`assignTurnIds`), so any number of processes may
 *   write one conversation; with `wait` it returns once they are searchable.
 * The model never chooses a conversation: the app does, so a tool call cannot reach
 * another user's memory (the token's tenant limits it further on the server).
 *
 * How the SDK's types map: a tool's `inputSchema` is a zod schema of the arguments above; a
 * refused call (bad input, a conversation refused whole) throws, which the SDK reports to
 * the model as a `tool-error` with memsvc's message naming the field. `abortSignal` cancels
 * the call. An app that stores every exchange itself, not through the model, calls
 * `addTurns` (in `onFinish`, say).
 */
import { tool } from "ai";
import { z } from "zod";
import { SearchOrder, type Hit } from "../gen/memsvc/v1/memory_pb.js";
import type { MemoryClient } from "./client.js";

export type { MemoryClient } from "./client.js";

export type Turn = { speaker: "user" | "assistant" | "system"; text: string };

const ORDERS = {
  relevance: SearchOrder.RELEVANCE,
  time: SearchOrder.TIME,
  newest: SearchOrder.NEWEST,
} as const;

/** A hit as the MCP tools give it (JSON-safe: turn ids as numbers). */
export function hitOf(hit: Hit) {
  const m = hit.metadata;
  return {
    conversation_id: m?.conversationId ?? "",
    turn_start: Number(m?.turnRange?.start ?? 0n),
    turn_end: Number(m?.turnRange?.end ?? 0n),
    // under a turn budget, a late hit may hold fewer turns than its range: these
    turns: hit.turns,
    time_start: m?.timestampRange?.start ?? "",
    time_end: m?.timestampRange?.end ?? "",
    speakers: m?.speakers ?? [],
    score: Math.round(hit.score * 10_000) / 10_000,
    text: hit.text,
  };
}

/** Append turns to one conversation, numbered by the server; with `wait`, until searchable. */
export async function addTurns(
  client: MemoryClient,
  conversationId: string,
  turns: Turn[],
  options: { wait?: boolean; signal?: AbortSignal } = {},
) {
  const { signal } = options;
  const reply = await client.appendEvents(
    {
      events: turns.map((t) => ({ conversationId, ...t })),
      assignTurnIds: true,
      // a retry of this call (its answer lost) is written once
      idempotencyKey: crypto.randomUUID(),
    },
    { signal },
  );
  if (reply.errors.length > 0) {
    // a conversation with a bad turn is refused whole: nothing was written
    const why = reply.errors.map((e) => e.message).join("; ");
    throw new Error(`INVALID_ARGUMENT: nothing was written. ${why}`);
  }
  const turnIds = reply.turnIds.map(Number);
  let indexed: boolean | undefined;
  if (options.wait) {
    const last = reply.turnIds.reduce((a, b) => (a > b ? a : b));
    const waited = await client.waitForIndexed(
      { conversationId, turnId: last, timeoutMs: 60_000 },
      { signal, timeoutMs: 70_000 },
    );
    indexed = waited.indexed;
  }
  return { accepted: reply.accepted, duplicates: reply.duplicates, turn_ids: turnIds, indexed };
}

export function memsvcTools(
  client: MemoryClient,
  options: { conversationId: string; searchConversationIds?: string[] },
) {
  const searchIn = options.searchConversationIds ?? [options.conversationId];
  return {
    search_memory: tool({
      description:
        "Find stored conversation passages relevant to a query (by meaning and keywords), " +
        "and the user's standing instructions that apply. Each hit is a passage of " +
        "consecutive turns with its turn range and time.",
      inputSchema: z.object({
        query: z.string().min(1).describe("What to look for, in natural language."),
        top_k: z.number().int().min(1).max(100).optional().describe("Hits (default 6)."),
        order: z
          .enum(["relevance", "time", "newest"])
          .optional()
          .describe("relevance (default), time (how a topic unfolded) or newest (current value)."),
        turn_budget: z
          .number()
          .int()
          .min(1)
          .max(1000)
          .optional()
          .describe("At most this many turns in all; fills it."),
      }),
      execute: async ({ query, top_k, order, turn_budget }, { abortSignal }) => {
        const reply = await client.embedDb(
          {
            queryText: query,
            topK: top_k ?? 0,
            order: order ? ORDERS[order] : SearchOrder.UNSPECIFIED,
            turnBudget: turn_budget ?? 0,
            filters: { conversationIds: searchIn },
          },
          { signal: abortSignal },
        );
        return { standing: reply.standing.map(hitOf), hits: reply.hits.map(hitOf) };
      },
    }),
    add_turns: tool({
      description:
        "Store turns of this conversation in long-term memory. Durable when this returns; " +
        "searchable within seconds (wait=true returns once they are).",
      inputSchema: z.object({
        turns: z
          .array(
            z.object({
              speaker: z.enum(["user", "assistant", "system"]),
              text: z.string().min(1),
            }),
          )
          .min(1)
          .describe("The turns, in order."),
        wait: z.boolean().optional().describe("Return once the last turn is searchable."),
      }),
      execute: async ({ turns, wait }, { abortSignal }) =>
        addTurns(client, options.conversationId, turns, { wait, signal: abortSignal }),
    }),
  };
}
