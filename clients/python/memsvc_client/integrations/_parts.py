"""An item over memsvc's payload limit, kept in parts (issue 83, item 3).

A framework keeps an item of any size (an image or a file inlined as base64, a huge tool
output); memsvc keeps a turn's payload up to 3,000,000 characters. An adapter's item over
that is written as consecutive turns of one append: the first holds the item's text (what
memsvc searches) and the first part of its payload, each following turn (no text: nothing
to search) the next part. Each part's payload starts with a line
`memsvc-part <index>/<count> <digest> <item id as JSON>`; every read puts the parts back
together (`items`), checks the digest of the whole, and returns the item exactly as added.
A read that holds only some of an item's parts (a range that cuts it) leaves the item out,
never a fragment; other clients see a payload that is not their item and skip it.

An add too large for one request (16 MiB) is written in several, each a compare-and-append
on the last turn of the one before, so the parts stay adjacent and in order; if one is
refused, what the add wrote before it is deleted (nothing half-written) and, when another
writer came between, the add is written again (`appended`). The steps are yielded, so
the sync and the async client run the same plan (`run`, `arun`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memsvc_client.v1 import memory_pb2 as pb

if TYPE_CHECKING:
    from memsvc_client.aio import AsyncMemoryClient
    from memsvc_client.client import MemoryClient

MAX_PAYLOAD_CHARS = 3_000_000  # memsvc's limit on one turn's payload
# Characters of one part: at most 4 MB in UTF-8, so several parts fit one request.
PART_CHARS = 1_000_000
# Bytes of one append request, at most: below memsvc's 16 MiB default (MEMSVC_MAX_REQUEST_MB),
# with room for the message's framing.
REQUEST_BYTES = 12 * 1024 * 1024
MARK = "memsvc-part"
LAST_TURN_MOVED = "last_turn_moved"  # memsvc's reason for a compare-and-append refused
ATTEMPTS = 10  # an add several writers keep moving is written again, this often


@dataclass(frozen=True)
class Part:
    index: int  # 1-based
    count: int
    digest: str  # of the whole payload
    item_id: str  # the adapter's id of the item ("" for none)


@dataclass(frozen=True)
class Item:
    turn: pb.MemoryEvent  # the item's first turn, its payload whole
    turn_ids: tuple[int, ...]  # every turn holding it, in order


def _digest(payload: str) -> str:
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def split(event: pb.MemoryEvent, item_id: str = "") -> list[pb.MemoryEvent]:
    """The event as turns each within memsvc's payload limit: itself when it fits."""
    payload = event.payload
    if len(payload) <= MAX_PAYLOAD_CHARS:
        return [event]
    pieces = [payload[i : i + PART_CHARS] for i in range(0, len(payload), PART_CHARS)]
    digest = _digest(payload)
    turns = []
    for index, piece in enumerate(pieces, 1):
        turn = pb.MemoryEvent()
        turn.CopyFrom(event)
        if index > 1:
            turn.text = ""  # said once, by the first part
        named = item_id if index == 1 else ""  # the item is counted once, by its first part
        header = f"{MARK} {index}/{len(pieces)} {digest} {json.dumps(named)}\n"
        turn.payload = header + piece
        turns.append(turn)
    return turns


def part_of(turn: pb.MemoryEvent) -> Part | None:
    """The part a turn holds; None for a turn that is not a part of a split item."""
    if not turn.payload.startswith(MARK + " "):
        return None
    end = turn.payload.find("\n")  # the header alone, not a copy of the part's million
    header = turn.payload if end < 0 else turn.payload[:end]
    try:
        _, position, digest, item_id = header.split(" ", 3)
        index, _, count = position.partition("/")
        part = Part(int(index), int(count), digest, json.loads(item_id))
    except ValueError:
        return None
    return part if 1 <= part.index <= part.count and isinstance(part.item_id, str) else None


def item_id(turn: pb.MemoryEvent) -> str | None:
    """The adapter's id of the item whose first part the turn holds ("" for a later part);
    None for a turn that is not a part."""
    part = part_of(turn)
    if part is None:
        return None
    return part.item_id if part.index == 1 else ""


def items(turns: Sequence[pb.MemoryEvent]) -> list[Item]:
    """The turns (in order) as items: a split item's parts put back together into its first
    turn; an item whose parts are not all here, in order and matching their digest, left
    out. Other turns stand as they are."""
    out: list[Item] = []
    i = 0
    while i < len(turns):
        first = part_of(turns[i])
        if first is None:
            out.append(Item(turns[i], (turns[i].turn_id,)))
            i += 1
            continue
        group = list(turns[i : i + first.count])
        later = [Part(k, first.count, first.digest, "") for k in range(2, first.count + 1)]
        if first.index == 1 and [part_of(t) for t in group[1:]] == later:
            payload = "".join(t.payload.partition("\n")[2] for t in group)
            if _digest(payload) == first.digest:
                whole = pb.MemoryEvent()
                whole.CopyFrom(group[0])
                whole.payload = payload
                out.append(Item(whole, tuple(t.turn_id for t in group)))
                i += first.count
                continue
        i += 1  # a part without its item's others: left out
    return out


def joined(turns: Sequence[pb.MemoryEvent]) -> list[pb.MemoryEvent]:
    """The turns with every split item put back together (`items`)."""
    return [item.turn for item in items(turns)]


def requests(turns: Sequence[pb.MemoryEvent]) -> list[list[pb.MemoryEvent]]:
    """The turns in requests of at most REQUEST_BYTES each, in order."""
    out: list[list[pb.MemoryEvent]] = [[]]
    size = 0
    for turn in turns:
        cost = turn.ByteSize() + 16
        if out[-1] and size + cost > REQUEST_BYTES:
            out.append([])
            size = 0
        out[-1].append(turn)
        size += cost
    return out


@dataclass(frozen=True)
class Append:
    """Send these turns (the server numbering them) with this compare-and-append and key."""

    turns: list[pb.MemoryEvent]
    expected_last_turn: dict[str, int] | None
    idempotency_key: str
    wait: bool

    def options(self) -> dict[str, Any]:
        """The append's keyword arguments (MemoryClient's and AsyncMemoryClient's)."""
        return {
            "assign_turn_ids": True,
            "wait": self.wait,
            "idempotency_key": self.idempotency_key,
            "expected_last_turn": self.expected_last_turn,
        }


@dataclass(frozen=True)
class Delete:
    """Delete these turns of the conversation (an add refused part-way)."""

    conversation_id: str
    turns: tuple[int, int]


Step = Append | Delete
Plan = Generator[Step, "pb.AppendEventsResponse | None", pb.AppendEventsResponse]


def appended(
    conversation: str,
    turns: Sequence[pb.MemoryEvent],
    key: str,
    *,
    wait: bool = False,
    expected_last_turn: int | None = None,
) -> Plan:
    """The steps of adding `turns` (one conversation's, split items included) in as many
    requests as they need; returns the reply as one append's (every turn id, or the errors
    of the request refused). With `expected_last_turn`, the caller's compare-and-append: a
    refusal for it comes back to the caller to read again."""
    batches = requests(turns)
    if len(batches) == 1:
        expected = None if expected_last_turn is None else {conversation: expected_last_turn}
        reply = yield Append(list(turns), expected, key, wait)
        assert reply is not None
        return reply
    for attempt in range(ATTEMPTS):
        last = expected_last_turn
        ids: list[int] = []
        for k, batch in enumerate(batches):
            expected = None if last is None else {conversation: last}
            final = k == len(batches) - 1
            reply = yield Append(batch, expected, f"{key}/{attempt}/{k}", wait and final)
            assert reply is not None
            if reply.errors:
                if ids:  # nothing half-written
                    yield Delete(conversation, (ids[0], ids[-1]))
                moved = any(e.reason == LAST_TURN_MOVED for e in reply.errors)
                if moved and k > 0 and expected_last_turn is None:
                    break  # another writer came between two of ours: write it again
                return reply
            ids += reply.turn_ids
            last = ids[-1]
        else:
            return pb.AppendEventsResponse(accepted=len(ids), turn_ids=ids)
    raise RuntimeError(f"{conversation!r} kept changing while an item was added in parts")


def run(client: MemoryClient, plan: Plan) -> pb.AppendEventsResponse:
    """Carry out the plan with a sync client."""
    reply: pb.AppendEventsResponse | None = None
    try:
        while True:
            step = plan.send(reply)
            if isinstance(step, Append):
                reply = client.append(step.turns, **step.options())
            else:
                client.delete(step.conversation_id, step.turns, defer_store=True)
                reply = None
    except StopIteration as done:
        result: pb.AppendEventsResponse = done.value
        return result


async def arun(client: AsyncMemoryClient, plan: Plan) -> pb.AppendEventsResponse:
    """Carry out the plan with an async client."""
    reply: pb.AppendEventsResponse | None = None
    try:
        while True:
            step = plan.send(reply)
            if isinstance(step, Append):
                reply = await client.append(step.turns, **step.options())
            else:
                await client.delete(step.conversation_id, step.turns, defer_store=True)
                reply = None
    except StopIteration as done:
        result: pb.AppendEventsResponse = done.value
        return result
