/**
 * An item over memsvc's payload limit, kept in parts: the format of the Python adapters
 * (`memsvc_client/integrations/_parts.py`), so either reads what the other wrote. The item
 * is written as consecutive turns of one append: the first holds its text (what memsvc
 * searches) and the first million characters of its payload, each next one (no text) the
 * next million, each payload headed by `memsvc-part <index>/<count> <digest> <id as JSON>`.
 * `joined` puts the parts back together and checks the digest of the whole; a read that
 * holds only some of them leaves the item out, never a fragment. Characters are counted
 * as memsvc counts them: code points.
 */
import type { MemoryEvent } from "../gen/memsvc/v1/memory_pb.js";

export const MAX_PAYLOAD_CHARS = 3_000_000;
const PART_CHARS = 1_000_000;
const MARK = "memsvc-part";

export interface Part {
  index: number;
  count: number;
  digest: string;
  itemId: string;
}

/** The string cut into pieces of `size` code points (never inside a surrogate pair). */
function pieces(text: string, size: number): string[] {
  const out: string[] = [];
  let start = 0;
  let count = 0;
  for (let i = 0; i < text.length; ) {
    if (count === size) {
      out.push(text.slice(start, i));
      start = i;
      count = 0;
    }
    const unit = text.charCodeAt(i);
    i += unit >= 0xd800 && unit <= 0xdbff && i + 1 < text.length ? 2 : 1;
    count++;
  }
  out.push(text.slice(start));
  return out;
}

async function digestOf(payload: string): Promise<string> {
  const hash = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(payload));
  return Array.from(new Uint8Array(hash), (b) => b.toString(16).padStart(2, "0"))
    .join("")
    .slice(0, 32);
}

type Turn = Partial<MemoryEvent> & { payload: string; text: string };

/** The turn as turns each within the payload limit: itself when it fits. */
export async function split<T extends Turn>(turn: T, itemId = ""): Promise<T[]> {
  // a string of at most the limit in UTF-16 units holds at most as many code points
  if (turn.payload.length <= MAX_PAYLOAD_CHARS) return [turn];
  const parts = pieces(turn.payload, PART_CHARS);
  if (parts.length === 1) return [turn];
  const digest = await digestOf(turn.payload);
  return parts.map((piece, i) => ({
    ...turn,
    text: i === 0 ? turn.text : "", // said once, by the first part
    payload: `${MARK} ${i + 1}/${parts.length} ${digest} ${JSON.stringify(i === 0 ? itemId : "")}\n${piece}`,
  }));
}

/** The part a turn holds; undefined for a turn that is not one. */
export function partOf(turn: { payload: string }): Part | undefined {
  if (!turn.payload.startsWith(MARK + " ")) return undefined;
  const header = turn.payload.slice(0, turn.payload.indexOf("\n"));
  const [, position, digest, ...rest] = header.split(" ");
  const [index, count] = (position ?? "").split("/").map(Number);
  let itemId: unknown;
  try {
    itemId = JSON.parse(rest.join(" "));
  } catch {
    return undefined;
  }
  const ok = Number.isInteger(index) && Number.isInteger(count) && 1 <= index && index <= count;
  return ok && typeof itemId === "string" && digest ? { index, count, digest, itemId } : undefined;
}

/** The events (in order) with every item kept in parts put back together into its first
 * turn; an item whose parts are not all here, in order and matching their digest, left
 * out. Other events stand as they are. */
export async function joined(events: MemoryEvent[]): Promise<MemoryEvent[]> {
  const out: MemoryEvent[] = [];
  for (let i = 0; i < events.length; ) {
    const first = partOf(events[i]);
    if (first === undefined) {
      out.push(events[i++]);
      continue;
    }
    const group = events.slice(i, i + first.count);
    const whole =
      first.index === 1 &&
      group.length === first.count &&
      group.slice(1).every((t, k) => {
        const p = partOf(t);
        return p?.index === k + 2 && p.count === first.count && p.digest === first.digest;
      });
    if (whole) {
      const payload = group.map((t) => t.payload.slice(t.payload.indexOf("\n") + 1)).join("");
      if ((await digestOf(payload)) === first.digest) {
        out.push({ ...group[0], payload });
        i += first.count;
        continue;
      }
    }
    i++; // a part without its item's others: left out
  }
  return out;
}
