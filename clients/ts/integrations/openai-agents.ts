/**
 * memsvc as an OpenAI Agents SDK (JS) session: `run(agent, input, { session })`.
 *
 * `MemsvcSession` implements the SDK's `Session` interface (`getSessionId`, `getItems`,
 * `addItems`, `popItem`, `clearSession`) on a Connect client of memsvc (gRPC or HTTP
 * transport, with whatever interceptors carry the caller's token). Unlike the SDK's
 * `MemorySession`, any number of processes may share one session: memsvc numbers the
 * items and holds the conversation while it writes.
 *
 * How the SDK's items map onto memsvc (the same as the Python adapter's):
 * - The session id is the conversation id (with a token limited to a tenant's prefixes,
 *   give an id within them, e.g. "acme/" + the user's id): as it is when in memsvc's
 *   normal form and without `%`, else percent-encoded (`singleId`): no two sessions share
 *   a conversation, as in the Python adapters.
 * - Each `AgentInputItem` (a message, a function call, its result, a reasoning item, ...) is
 *   one turn. Its JSON, exactly as added, is the turn's `payload`, and `getItems` returns it
 *   unchanged: tool calls, `providerData` and structured content round-trip.
 * - The turn's `text`, which memsvc chunks and searches, is what the item says: a message's
 *   content (or the text parts of its content list), a call's name and arguments, a call's
 *   output, reasoning text; `[<type>]` when it says nothing. At most `maxTextChars` of it
 *   (the server's MEMSVC_MAX_TURN_CHARS, 100,000 by default): a huge tool output is
 *   searchable by its head and still comes back whole. An item whose JSON is over memsvc's
 *   payload limit (3,000,000 characters: an image or a file inlined as base64) is kept in
 *   parts, consecutive turns every read puts back together (`parts.ts`, the Python
 *   adapters' format): it comes back whole, and a limit or a pop counts it once. A call
 *   too large for one request goes in several, each a compare-and-append on the one
 *   before; one refused undoes what the call wrote before it.
 * - Speaker: role user -> "user"; role assistant, and calls the model makes -> "assistant";
 *   role system, and the results of calls (`*_result`, `*_output`) -> "system".
 * - Turn ids and timestamps are the server's (`assignTurnIds`): writers in several processes
 *   never collide, and each call's items stay together and in order.
 * - `popItem` deletes the newest live turn and returns its item, in one call (PopEvents:
 *   processes popping at once get different items); `clearSession` deletes every turn.
 *   Both return once the log holds the deletion (milliseconds, whatever the indexing
 *   backlog); the store follows in the background. Deleted turns never come back (not in
 *   `getItems`, not in search); their text stays in the log until `purge()` erases it (an
 *   admin token). A turn holding no item (another client's payload) is skipped.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import type { AgentInputItem, Session } from "@openai/agents-core";
import type { MemoryEvent } from "../gen/memsvc/v1/memory_pb.js";
import type { MemoryClient } from "./client.js";
import { singleId } from "./ids.js";
import { joined, partOf, split } from "./parts.js";

export type { MemoryClient } from "./client.js";

const ROLES: Record<string, string> = {
  user: "user",
  assistant: "assistant",
  system: "system",
  developer: "system",
};

export function speakerOf(item: AgentInputItem): string {
  const { role, type } = item as { role?: unknown; type?: unknown };
  if (typeof role === "string" && role in ROLES) return ROLES[role];
  const kind = String(type ?? "");
  return kind.endsWith("_result") || kind.endsWith("_output") ? "system" : "assistant";
}

function saidBy(value: unknown): string[] {
  if (typeof value === "string") return [value];
  if (Array.isArray(value)) return value.flatMap(saidBy);
  if (value && typeof value === "object") {
    const { text, refusal } = value as { text?: unknown; refusal?: unknown };
    if (typeof text === "string") return [text];
    if (typeof refusal === "string") return [refusal];
  }
  return [];
}

/** What the item says, for search. */
export function textOf(item: AgentInputItem): string {
  const fields = item as Record<string, unknown>;
  const parts = [
    ...saidBy(fields.content),
    ...["name", "arguments"].flatMap((key) =>
      typeof fields[key] === "string" ? [fields[key] as string] : [],
    ),
    ...saidBy(fields.output),
    ...saidBy(fields.rawContent),
  ];
  const text = parts.filter((p) => p.trim()).join("\n");
  return text || `[${String(fields.type ?? fields.role ?? "item")}]`;
}

function itemOf(event: MemoryEvent): AgentInputItem | undefined {
  // a turn written by another client: a message with what it says
  if (!event.payload) return { role: event.speaker, content: event.text } as AgentInputItem;
  try {
    const item: unknown = JSON.parse(event.payload);
    // not an item's JSON (another client's payload): skipped, as the SDK's stores skip rows
    // they cannot parse
    return item !== null && typeof item === "object" && !Array.isArray(item)
      ? (item as AgentInputItem)
      : undefined;
  } catch {
    return undefined;
  }
}

async function itemsOf(events: MemoryEvent[]): Promise<AgentInputItem[]> {
  return (await joined(events)).map(itemOf).filter((i): i is AgentInputItem => i !== undefined);
}

// Bytes of one append request, at most: below memsvc's 16 MiB default request.
const REQUEST_BYTES = 12 * 1024 * 1024;
const LAST_TURN_MOVED = "last_turn_moved";
// What a pop's reply may hold, as the Python client: a Connect transport receives up to
// 4 GiB by default, so any turn the server accepted (or a run of an item's parts) pops.
const POP_REPLY_BYTES = 64 * 1024 * 1024;

type NewTurn = { conversationId: string; speaker: string; text: string; payload: string };

function requests(turns: NewTurn[]): NewTurn[][] {
  const out: NewTurn[][] = [[]];
  let size = 0;
  const encoder = new TextEncoder();
  for (const turn of turns) {
    const cost = encoder.encode(turn.payload).length + encoder.encode(turn.text).length + 256;
    if (out.at(-1)!.length > 0 && size + cost > REQUEST_BYTES) {
      out.push([]);
      size = 0;
    }
    out.at(-1)!.push(turn);
    size += cost;
  }
  return out;
}

// Cut by characters (code points), as the server counts them, never inside a surrogate pair.
function head(text: string, chars: number): string {
  return text.length <= chars ? text : Array.from(text).slice(0, chars).join("");
}

export class MemsvcSession implements Session {
  /** The memsvc conversation of this session (`singleId` of the session id). */
  readonly conversationId: string;

  constructor(
    private readonly client: MemoryClient,
    private readonly sessionId: string,
    private readonly options: { maxTextChars?: number } = {},
  ) {
    this.conversationId = singleId(sessionId);
  }

  async getSessionId(): Promise<string> {
    return this.sessionId;
  }

  /** The newest `last` live events (0: all); the server reads only those. */
  private async events(last = 0): Promise<MemoryEvent[]> {
    const events: MemoryEvent[] = [];
    let pageToken = "";
    do {
      const page = await this.client.exportEvents({
        conversationId: this.conversationId,
        pageToken,
        last,
      });
      events.push(...page.events);
      pageToken = page.nextPageToken;
    } while (pageToken);
    return events;
  }

  async getItems(limit?: number): Promise<AgentInputItem[]> {
    if (limit !== undefined && limit <= 0) return [];
    if (limit === undefined) return await itemsOf(await this.events());
    // a limit counts items: past turns that hold none, read further back
    for (let wanted = limit; ; ) {
      // the slice keeps a 0.1 server (which ignores `last`) exact
      const events = (await this.events(wanted)).slice(-wanted);
      // an item in parts whose first turns are older than these is read next round
      const items = await itemsOf(events);
      if (items.length >= limit || events.length < wanted) return items.slice(-limit);
      wanted += limit - items.length;
    }
  }

  async addItems(items: AgentInputItem[]): Promise<void> {
    if (items.length === 0) return;
    const maxTextChars = this.options.maxTextChars ?? 100_000;
    const turns: NewTurn[] = [];
    for (const item of items) {
      const turn = {
        conversationId: this.conversationId,
        speaker: speakerOf(item),
        text: head(textOf(item), maxTextChars),
        payload: JSON.stringify(item),
      };
      turns.push(...(await split(turn))); // an item over the payload limit: in parts
    }
    const batches = requests(turns);
    for (let attempt = 0; attempt < 10; attempt++) {
      const key = crypto.randomUUID(); // a retry of a call (its answer lost) is written once
      const written: bigint[] = [];
      let moved = false;
      for (const [k, events] of batches.entries()) {
        const last = written.at(-1);
        const reply = await this.client.appendEvents({
          events,
          assignTurnIds: true,
          idempotencyKey: `${key}/${k}`,
          // the parts of one call stay adjacent: each request onto the one before
          expectedLastTurn: last === undefined ? {} : { [this.conversationId]: last },
        });
        if (reply.errors.length > 0) {
          if (written.length > 0) {
            // nothing half-written: what this call wrote before is deleted
            await this.client.logicalDeleteBySource({
              conversationId: this.conversationId,
              turnRange: { start: written[0], end: written.at(-1)! },
              deferStore: true,
            });
          }
          moved = k > 0 && reply.errors.some((e) => e.reason === LAST_TURN_MOVED);
          if (moved) break; // another writer came between two of ours: write it again
          // the conversation was not written: say why, never drop silently
          throw new Error(`memsvc refused the items: ${reply.errors[0].message}`);
        }
        written.push(...reply.turnIds);
      }
      if (!moved) return;
    }
    throw new Error(`${this.conversationId} kept changing while an item was added in parts`);
  }

  async popItem(): Promise<AgentInputItem | undefined> {
    for (;;) {
      let popped: MemoryEvent[];
      try {
        // one call: the newest turn deleted and returned; poppers at once get different ones
        popped = (
          await this.client.popEvents({
            conversationId: this.conversationId,
            maxReplyBytes: POP_REPLY_BYTES,
          })
        ).events;
      } catch (err) {
        if (ConnectError.from(err).code !== Code.Unimplemented) throw err;
        return this.popByDelete(); // a server from before PopEvents
      }
      const newest = popped.at(-1);
      if (newest === undefined) return undefined;
      const part = partOf(newest);
      if (part !== undefined && part.index === part.count && part.count > 1) {
        // the last part of an item kept in parts: its others are the turns before it
        const rest = await this.client.popEvents({
          conversationId: this.conversationId,
          count: part.count - 1,
          maxReplyBytes: POP_REPLY_BYTES,
        });
        popped = [...rest.events, ...popped].sort((a, b) => Number(a.turnId - b.turnId));
      }
      const whole = (await joined(popped)).at(-1);
      const item = whole === undefined ? undefined : itemOf(whole);
      if (item !== undefined) return item;
      // a turn holding no item is dropped: the next newest is ours to take
    }
  }

  /** popItem in two calls, for servers without PopEvents. */
  private async popByDelete(): Promise<AgentInputItem | undefined> {
    for (;;) {
      const events = await this.events(1);
      const newest = events.at(-1);
      if (newest === undefined) return undefined;
      const turns = { start: newest.turnId, end: newest.turnId };
      const deleted = await this.client.logicalDeleteBySource({
        conversationId: this.conversationId,
        turnRange: turns,
        deferStore: true, // the log's deletion only: milliseconds, whatever the backlog
      });
      const item = itemOf(newest);
      if (deleted.eventsDeleted > 0 && item !== undefined) return item;
      // a turn holding no item is dropped, and one another process popped first is
      // theirs: the next newest is ours to take
    }
  }

  async clearSession(): Promise<void> {
    try {
      await this.client.logicalDeleteBySource({
        conversationId: this.conversationId,
        deferStore: true,
      });
    } catch (err) {
      // nothing ever added: nothing to clear
      if (ConnectError.from(err).code !== Code.NotFound) throw err;
    }
  }

  /** Erase the text of this session's deleted turns for good (needs an admin token). */
  async purge(): Promise<{ eventsPurged: number; chunksPurged: number }> {
    const reply = await this.client.purgeDeleted({ conversationId: this.conversationId });
    return { eventsPurged: reply.eventsPurged, chunksPurged: reply.chunksPurged };
  }
}
