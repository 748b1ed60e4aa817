"""memsvc as an OpenAI Agents SDK session (`pip install 'memsvc-client[openai-agents]'`).

`MemsvcSession` implements the SDK's `Session` protocol (`get_items`, `add_items`,
`pop_item`, `clear_session`): pass it as `Runner.run(agent, input, session=...)`. Unlike
the SDK's file and SQLite sessions, any number of processes may share one session: memsvc
numbers the items and holds the conversation while it writes.

How the SDK's items map onto memsvc:
- `session_id` is the conversation id (with a token limited to a tenant's prefixes, give
  an id within them, e.g. "acme/" + the user's id): as it is when in memsvc's normal form
  and without `%`, else percent-encoded (`_ids.single_id`): no two sessions share one.
- Each item (`TResponseInputItem`: a message, a function call, its output, a reasoning
  item, ...) is one turn. Its JSON, exactly as added, is the turn's `payload`, and
  `get_items` returns it unchanged: tool calls and structured content round-trip.
- The turn's `text`, which memsvc chunks and searches, is what the item says: a message's
  content (or the text parts of its content list: a file by its name, an image as
  `[image]`), a function call's name and arguments, a tool's output (a string or such a
  list of parts), a reasoning summary; `[<type>]` when it says nothing. At most
  `max_text_chars` of it (the server's `MEMSVC_MAX_TURN_CHARS`, 100,000 by default): a huge
  tool output is searchable by its head and still comes back whole. An item whose JSON is
  over memsvc's payload limit (3,000,000 characters: an image or file inlined as base64)
  is kept in parts, consecutive turns put back together by every read (`_parts`): it
  comes back whole, and a limit or a pop counts it once. A write memsvc refuses raises
  `RefusedEvents` (a ValueError) naming the field, and none of the call's items is kept.
- Speaker: role user -> "user"; role assistant, and calls the model makes (function,
  computer, search calls, reasoning) -> "assistant"; role system or developer, and the
  outputs of calls -> "system".
- Turn ids and timestamps are the server's (`assign_turn_ids`: the ids after the
  conversation's last turn, the time of receipt): writers in several processes never
  collide, and each call's items stay in order.
- `session_settings` (a `SessionSettings` or a dict, as the SDK's sessions take it) gives
  `get_items` its default limit; 0 reads nothing, a negative limit everything.
- `get_items(limit)` reads only the newest `limit` turns (`ExportEventsRequest.last`), and
  `pop_item` only the newest one: neither grows with the conversation.
- A turn whose payload is not a JSON object (written by another client) is skipped, as
  `SQLiteSession` skips rows it cannot parse: `get_items(limit)` counts only items and
  reads further back past such turns, and `pop_item` deletes them on its way to the newest
  item. A turn with no payload (plain text from another client) reads as a message.
- `pop_item` deletes the newest live turn and returns its item, in one call (PopEvents:
  processes popping at once get different items); `clear_session` deletes every turn.
  Both return once the log holds the deletion (milliseconds, whatever the indexing
  backlog, as the SDK's own sessions pop); the store follows in the background. Deleted
  turns never come back (not in `get_items`, not in search); their text stays in the log
  until `purge()` erases it (an admin token).

The session opens one grpc.aio channel per event loop it is used from (`Runner.run_sync`
runs each call on a loop of its own); `close()` closes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import grpc

from memsvc_client.aio import AsyncMemoryClient
from memsvc_client.client import MemsvcError, new_idempotency_key, written
from memsvc_client.integrations._ids import single_id
from memsvc_client.integrations._parts import appended, arun, joined, part_of, split
from memsvc_client.v1 import memory_pb2 as pb

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import SessionSettings

# Items the model produces (its calls and reasoning) speak as the assistant; what comes
# back from a call speaks as the system.
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def speaker_of(item: Mapping[str, Any]) -> str:
    role = item.get("role")
    if isinstance(role, str) and role in _ROLES:
        return _ROLES[role]
    kind = str(item.get("type", ""))
    return "system" if kind.endswith("_output") else "assistant"


def _said(parts: list[Any]) -> list[str]:
    """What a list of content parts says: its texts and refusals, a file by its name, an
    image as `[image]` (a message's content, or a tool's output given as parts)."""
    said = []
    for part in parts:
        if not isinstance(part, Mapping):
            continue
        text = part.get("text", part.get("refusal"))
        if isinstance(text, str):
            said.append(text)
        elif part.get("type") == "input_file":
            said.append(f"[file {part.get('filename') or part.get('file_id') or ''}]".strip())
        elif part.get("type") == "input_image":
            said.append("[image]")
    return said


def text_of(item: Mapping[str, Any]) -> str:
    """What the item says, for search."""
    parts: list[str] = []
    content = item.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        parts += _said(content)
    for key in ("name", "arguments", "output"):
        value = item.get(key)
        if isinstance(value, str):
            parts.append(value)
        elif key == "output" and isinstance(value, list):  # a tool's output as parts
            parts += _said(value)
    summary = item.get("summary")
    if isinstance(summary, list):
        parts += [
            s["text"] for s in summary if isinstance(s, Mapping) and isinstance(s.get("text"), str)
        ]
    text = "\n".join(p for p in parts if p.strip())
    return text or f"[{item.get('type') or item.get('role') or 'item'}]"


def _item_of(event: pb.MemoryEvent) -> TResponseInputItem | None:
    """The item a turn holds: its payload, or (a turn written by another client) a message;
    None for a payload that is not a JSON object (corrupt: skipped, as SQLiteSession skips
    rows it cannot parse)."""
    if not event.payload:
        return {"role": event.speaker, "content": event.text}  # type: ignore[return-value]
    try:
        item = json.loads(event.payload)
    except ValueError:
        return None
    return item if isinstance(item, dict) else None  # type: ignore[return-value]


class MemsvcSession:
    """An Agents SDK session kept in memsvc (see the module's docstring for the mapping)."""

    def __init__(
        self,
        session_id: str,
        target: str = "127.0.0.1:50051",
        *,
        token: str | None = None,
        ca_file: str | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        max_text_chars: int = 100_000,
    ) -> None:
        from agents.memory.session_settings import SessionSettings, coerce_session_settings

        self.session_id = session_id
        self.conversation_id = single_id(session_id)  # injective (memsvc folds ids)
        # as SQLiteSession: a dict is coerced, None is SessionSettings()
        self.session_settings: SessionSettings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self.max_text_chars = max_text_chars
        self._client = AsyncMemoryClient(target, token=token, ca_file=ca_file)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        if limit is None:
            limit = self.session_settings.limit
        if limit is not None and limit < 0:
            limit = None  # as SQLiteSession reads a negative limit: every item
        if limit == 0:
            return []
        # the server reads only the newest turns; the slice keeps older servers exact. A
        # limit counts items: past corrupt newest turns, read further back.
        wanted = limit or 0
        while True:
            events = await self._client.export(self.conversation_id, last=wanted)
            if wanted:
                events = events[-wanted:]
            # an item in parts whose first turns are older than these is read next round
            items = [i for i in map(_item_of, joined(events)) if i is not None]
            if limit is None or len(items) >= limit or len(events) < wanted:
                return items if limit is None else items[-limit:]
            wanted += limit - len(items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        if not items:
            return
        turns = []
        for item in items:
            raw: Mapping[str, Any] = item
            event = pb.MemoryEvent(
                conversation_id=self.conversation_id,
                speaker=speaker_of(raw),
                text=text_of(raw)[: self.max_text_chars],
                payload=json.dumps(item, ensure_ascii=False),
            )
            turns += split(event)  # an item over the payload limit: in parts
        plan = appended(self.conversation_id, turns, new_idempotency_key())
        written(await arun(self._client, plan), "items")

    async def pop_item(self) -> TResponseInputItem | None:
        while True:
            try:
                popped = await self._client.pop(self.conversation_id)
            except MemsvcError as exc:
                if exc.code is not grpc.StatusCode.UNIMPLEMENTED:
                    raise
                return await self._pop_by_delete()  # a server from before PopEvents
            if not popped:
                return None
            part = part_of(popped[-1])
            if part is not None and part.index == part.count > 1:
                # the last part of an item kept in parts: its others are the turns before
                popped = await self._client.pop(self.conversation_id, part.count - 1) + popped
            whole = joined(sorted(popped, key=lambda t: t.turn_id))
            item = _item_of(whole[-1]) if whole else None
            if item is not None:
                return item
            # a turn holding no item is dropped (as SQLiteSession drops it): the next newest

    async def _pop_by_delete(self) -> TResponseInputItem | None:
        """pop_item in two calls, for servers without PopEvents: read the newest turn, then
        delete it; another process may take it between the two."""
        while True:
            events = await self._client.export(self.conversation_id, last=1)
            if not events:
                return None
            newest = events[-1]
            deleted = await self._client.delete(
                self.conversation_id, (newest.turn_id, newest.turn_id), defer_store=True
            )
            item = _item_of(newest)
            if deleted.events_deleted and item is not None:
                return item
            # a corrupt item is dropped, and one another process popped first is theirs

    async def clear_session(self) -> None:
        try:
            await self._client.delete(self.conversation_id, defer_store=True)
        except MemsvcError as exc:
            if exc.code is not grpc.StatusCode.NOT_FOUND:  # nothing ever added: nothing to clear
                raise

    async def purge(self) -> pb.PurgeDeletedResponse:
        """Erase the text of this session's deleted turns for good (needs an admin token)."""
        reply: pb.PurgeDeletedResponse = await self._client.call(
            "PurgeDeleted", pb.PurgeDeletedRequest(conversation_id=self.conversation_id)
        )
        return reply

    async def close(self) -> None:
        """Close the channel this session opened on the running event loop."""
        await self._client.close()
