"""memsvc as a Google ADK memory service (`pip install 'memsvc-client[google-adk]'`).

`MemsvcMemoryService(BaseMemoryService)` goes where ADK takes a memory service
(`Runner(..., memory_service=MemsvcMemoryService(target, token=...))`): agents' `load_memory`
and `preload_memory` tools then search memsvc, and `add_session_to_memory` keeps a session's
events there, shared by every process and replica.

How ADK's types map onto memsvc:
- ADK's memory is per app and user: each (app_name, user_id) is one memsvc conversation,
  `"{prefix}{app_name}/{user_id}"`, each name percent-encoded where it holds a `/` or `%` or
  is not in memsvc's normal form (`conversation_of`): two pairs never share a conversation,
  and the ids of plain names read as they are. `prefix` (default none) puts every
  conversation within a tenant's prefix (`prefix="acme/"` with a token limited to `acme/`).
  Every session of that user goes into it, in the order added.
- Each event with content is one turn: author "user" -> speaker "user"; an agent's event ->
  "assistant" with the agent's name as speaker_name; an event answering a function call ->
  "system". The turn's text is what the event says (`said_by`: its text parts; a function
  call `called name({args})`, a response `name returned {...}`, code and its result, an
  image or a file by name, type and size; every event with content is kept, as
  InMemoryMemoryService keeps it); its timestamp is the event's. The event's JSON is the
  turn's `payload`, so `events()` gives the events back exactly. An event is kept whole and
  searched by the head of its text (`max_text_chars`); one whose JSON is over memsvc's
  3,000,000-character payload (`inline_data` of 2.2 MB or more) is kept in parts,
  consecutive turns every read puts back together (`_parts`). An add memsvc refuses raises
  `RefusedEvents` (a ValueError naming the field), and none of its events is kept.
- `add_session_to_memory` returns once the events are searchable (`wait`, on by default),
  so an agent started next finds them, as with `InMemoryMemoryService`.
- Adding is idempotent by event id: `add_session_to_memory` may be called again as a
  session grows, and adds only events not yet kept (`add_events_to_memory` too). Processes
  adding at the same moment add each event once, whether they add the same events or one
  adds a longer slice of the session: each reads the user's last turn id, then what is
  kept (the whole memory once per service, then only the turns added since: `_kept`),
  and writes only onto that turn (memsvc's compare-and-append,
  `expected_last_turn`); one whose write another came before reads again and adds what is
  still missing.
- `search_memory` returns nothing when nothing matches, as `InMemoryMemoryService` does: a
  hit is kept when it shares a word with the query (memsvc's keyword analyzer: English
  stemmed, very common English words left out, Chinese and Japanese by two-character
  pieces) or its cosine similarity with the query reaches the floor. By default
  (`min_similarity="model"`) the floor is the model's: a third of the way from its cosine
  of unrelated texts, which the server reports, to 1.0 (`RELATED_SHARE`): 0.35 on
  all-MiniLM-L6-v2, 0.83 on multilingual-e5-small, whose unrelated texts score 0.75; on
  LoCoMo dev questions 0.1-0.2 % of other conversations' turns reach it on either. A
  number sets the floor itself; None keeps every hit. The English model reads Chinese and
  Japanese poorly: two unrelated texts in those scripts can pass its floor.
- `search_memory` returns one `MemoryEntry` per event, as `InMemoryMemoryService` does: the
  events of memsvc's hits (standing instructions first, then by score; each event once).
  A hit is a chunk of several events: of a hit that shares words with the query, the
  events holding those words, the most first (then in turn order), as
  `InMemoryMemoryService` matches and ranks events; of a hit kept by similarity alone,
  all its events. At most `top_k` of them, each read back from memsvc exactly as
  added: its content, author and timestamp are the event's, its id the event's id.
  A memory whose event has no text part (a function call or response, code, a file) gets
  one saying it, after its own parts: `PreloadMemoryTool` shows text parts only.
  `add_memory` (ADK 2's `Context.add_memory`) keeps each `MemoryEntry` as an event of its
  content, author and time (`memory_event`), once however often it is added.
  `delete_memory(memory_id=...)` deletes that one event (its neighbours stay): it is never
  found or returned again, and adding the session again does not add it back, as with
  `InMemoryMemoryService`: the deleted ids are kept in a conversation of their own,
  `conversation_of(...) + "/%deleted"` (no pair's conversation ends so), one system turn
  per id. `purge` erases the deleted events' text (an admin token).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import grpc
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.genai import types

from memsvc_client.aio import AsyncMemoryClient
from memsvc_client.client import MemsvcError, search_request, written
from memsvc_client.integrations._adk_matching import answering, matches
from memsvc_client.integrations._ids import joined_id
from memsvc_client.integrations._kept import KeptIds
from memsvc_client.integrations._parts import (
    LAST_TURN_MOVED,
    appended,
    arun,
    item_id,
    items,
    joined,
    part_of,
    split,
)
from memsvc_client.v1 import memory_pb2 as pb

if TYPE_CHECKING:
    from google.adk.events.event import Event
    from google.adk.sessions.session import Session

MEMORY_ID_PREFIX = "turns:"
# where a user's deleted event ids are kept: no encoded or plain id part is "%deleted"
DELETED_SUFFIX = "/%deleted"
# an add that finds its user's memory moved by another writer reads it again, this often
ADD_ATTEMPTS = 20
# The default similarity floor: this share of the way from the model's cosine of unrelated
# texts (EmbedDbResponse.unrelated_similarity) to 1.0. On LoCoMo dev questions against
# other conversations' turns, 0.1-0.2 % reach it on either bundled model: 0.35 on
# all-MiniLM-L6-v2 (unrelated 0.03), 0.83 on multilingual-e5-small (unrelated 0.75), where
# a fixed 0.35 kept every hit (benchmarks/archive/2026-12-04.md).
RELATED_SHARE = 0.33
MODEL_FLOOR = "model"


def conversation_of(app_name: str, user_id: str, prefix: str = "") -> str:
    """The conversation of one (app, user): injective for a given prefix."""
    return prefix + joined_id(app_name, user_id)


def said_by(part: types.Part) -> str:
    """What one part says, for search and for a memory's text: every kind of part says
    something, so no event with content is left out (as InMemoryMemoryService keeps it)."""
    if part.text:
        return part.text
    if part.function_call:
        args = json.dumps(part.function_call.args or {}, ensure_ascii=False)
        return f"called {part.function_call.name}({args})"
    if part.function_response:
        answer = json.dumps(part.function_response.response or {}, ensure_ascii=False)
        return f"{part.function_response.name} returned {answer}"
    if part.executable_code:
        code = part.executable_code
        language = code.language.value.lower() if code.language else "code"
        return f"ran {language} code:\n{code.code or ''}"
    if part.code_execution_result:
        result = part.code_execution_result
        outcome = result.outcome.value.lower() if result.outcome else "outcome unknown"
        return f"code result ({outcome}): {result.output or ''}"
    if part.inline_data:
        blob = part.inline_data
        size = f"{len(blob.data or b'')} bytes"
        return "[" + ", ".join(x for x in (blob.display_name, blob.mime_type, size) if x) + "]"
    if part.file_data:
        file = part.file_data
        return (
            "["
            + ", ".join(x for x in (file.display_name, file.mime_type, file.file_uri) if x)
            + "]"
        )
    return ""


def text_of(event: Event) -> str:
    """What the event says, for search."""
    parts = event.content.parts if event.content and event.content.parts else []
    return "\n".join(said for part in parts if (said := said_by(part)).strip())


def to_turns(conversation_id: str, event: Event, max_text_chars: int) -> list[pb.MemoryEvent]:
    """The event's turn; an event over the payload limit in parts (its id on the first)."""
    return split(to_turn(conversation_id, event, max_text_chars), event.id)


def to_turn(conversation_id: str, event: Event, max_text_chars: int) -> pb.MemoryEvent:
    responds = bool(event.get_function_responses())
    # an event answering a function call, or a memory added with no author: "system"
    speaker = (
        "user"
        if event.author == "user"
        else "system"
        if responds or not event.author
        else "assistant"
    )
    when = datetime.fromtimestamp(event.timestamp, timezone.utc).isoformat()  # noqa: UP017 (3.10)
    return pb.MemoryEvent(
        conversation_id=conversation_id,
        speaker=speaker,
        speaker_name="" if speaker == "user" else event.author,
        text=text_of(event)[:max_text_chars],
        timestamp=when,
        payload=event.model_dump_json(exclude_none=True),
    )


def memory_event(entry: MemoryEntry) -> Event:
    """The event a memory added directly (`add_memory`) is kept as: its content, author and
    time; its id the entry's, or one of what it says, so adding it again adds nothing."""
    from google.adk.events.event import Event

    try:
        when = datetime.fromisoformat(entry.timestamp).timestamp() if entry.timestamp else None
    except ValueError:  # a time ADK forwards to the model as written, not ISO 8601
        when = None
    said = entry.content.model_dump_json(exclude_none=True) + "\n" + (entry.author or "")
    memory_id = entry.id or "memory-" + hashlib.sha256(said.encode()).hexdigest()[:32]
    event = Event(id=memory_id, author=entry.author or "", content=entry.content)
    if when is not None:
        event.timestamp = when
    return event


def events_key(events: Sequence[Event], last_turn: int) -> str:
    """The idempotency key of adding these events after `last_turn`: the same for every
    process adding the same new events onto the same memory (memsvc scopes keys by
    conversation); another once that memory has moved, so a refusal is not its answer."""
    ids = "\n".join([str(last_turn), *(e.id for e in events)])
    return "adk-events:" + hashlib.sha256(ids.encode()).hexdigest()


def event_id(turn: pb.MemoryEvent) -> str:
    """The ADK event id a turn was added from ("" for a turn without one, or holding a later
    part of an event kept in parts)."""
    split_id = item_id(turn)
    if split_id is not None:
        return split_id
    event = event_of(turn)
    return event.id if event is not None else ""


def event_of(turn: pb.MemoryEvent) -> Event | None:
    """The ADK event a turn was added from; None for a turn without one, or whose payload
    another client wrote (skipped by every read, never a crash)."""
    from google.adk.events.event import Event

    if not turn.payload:
        return None
    try:
        return Event.model_validate_json(turn.payload)
    except ValueError:  # pydantic's ValidationError, a JSONDecodeError
        return None


def covered(hit: pb.Hit) -> list[int]:
    """The turn ids a hit returns (a narrowed hit names them), in order."""
    span = hit.metadata.turn_range
    return list(hit.turns) or list(range(span.start, span.end + 1))


def to_entry(hit: pb.Hit, turn: pb.MemoryEvent, event: Event) -> MemoryEntry:
    content = event.content or types.Content(role="user", parts=[])
    if not any(p.text for p in content.parts or []):
        # PreloadMemoryTool shows text parts only: a function call, its response, code or a
        # file gets its text as a part of its own, beside the parts as added
        readable = types.Part(text=turn.text or text_of(event))
        content = content.model_copy(update={"parts": [*(content.parts or []), readable]})
    return MemoryEntry(
        id=event.id,
        content=content,
        author=event.author,
        timestamp=datetime.fromtimestamp(event.timestamp).isoformat(),  # as ADK's own entries
        custom_metadata={"score": hit.score, "chunk_id": hit.chunk_id, "turn_id": turn.turn_id},
    )


class MemsvcMemoryService(BaseMemoryService):
    """ADK memory kept in memsvc (see the module's docstring for the mapping)."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        token: str | None = None,
        ca_file: str | None = None,
        top_k: int = 10,
        max_text_chars: int = 100_000,
        prefix: str = "",
        wait: bool = True,
        min_similarity: float | str | None = MODEL_FLOOR,
    ) -> None:
        self.top_k = top_k
        self.min_similarity = min_similarity
        self.prefix = prefix
        # add_session_to_memory returns once the events are searchable, so a Runner started
        # next (PreloadMemoryTool) finds them, as with InMemoryMemoryService
        self.wait = wait
        self.max_text_chars = max_text_chars
        self._memory = AsyncMemoryClient(target, token=token, ca_file=ca_file)
        # what each user's memory (and its deleted ids) holds, read as it grows
        self._kept = KeptIds(
            self._memory.last_turn, lambda c, turns: self._export(c, turns), event_id
        )

    def _conversation(self, app_name: str, user_id: str) -> str:
        return conversation_of(app_name, user_id, self.prefix)

    async def add_session_to_memory(self, session: Session) -> None:
        await self.add_events_to_memory(
            app_name=session.app_name, user_id=session.user_id, events=session.events
        )

    async def add_events_to_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        events: Sequence[Event],
        session_id: str | None = None,
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        conversation = self._conversation(app_name, user_id)
        for _ in range(ADD_ATTEMPTS):
            # the last turn first: a write that lands after it is read makes ours refused
            (last, live), (_, deleted) = await asyncio.gather(
                self._kept.of(conversation), self._kept.of(conversation + DELETED_SUFFIX)
            )
            # a deleted event is not added back; no union of the two sets: a session of
            # 10,000 events is read against them on every add
            new = [e for e in events if e.id not in live and e.id not in deleted and text_of(e)]
            if not new:
                return
            turns, ids = [], []
            for event in new:
                parts = to_turns(conversation, event, self.max_text_chars)
                turns += parts
                ids += [event.id, *([""] * (len(parts) - 1))]  # as event_id reads them
            plan = appended(
                conversation,
                turns,
                events_key(new, last),
                wait=self.wait,
                expected_last_turn=last,
            )
            reply = await arun(self._memory, plan)
            if not any(e.reason == LAST_TURN_MOVED for e in reply.errors):
                written(reply)
                if len(reply.turn_ids) == len(turns):
                    self._kept.wrote(
                        conversation, last, list(zip(reply.turn_ids, ids, strict=True))
                    )
                return
        raise RuntimeError(
            f"{conversation!r} kept changing while these events were added"
            f" ({ADD_ATTEMPTS} tries): add them again"
        )

    async def add_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        memories: Sequence[MemoryEntry],
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        """Each memory is kept as an event (`memory_event`): found by `search_memory`,
        deleted by its id, added once however often it is added (ADK 2's
        `Context.add_memory`). `custom_metadata` is not used."""
        await self.add_events_to_memory(
            app_name=app_name, user_id=user_id, events=[memory_event(m) for m in memories]
        )

    async def events(self, *, app_name: str, user_id: str) -> list[Event]:
        """Every event kept for this user, in the order added, exactly as added."""

        turns = await self._export(self._conversation(app_name, user_id))
        return [e for e in map(event_of, joined(turns)) if e is not None]

    async def search_memory(
        self, *, app_name: str, user_id: str, query: str
    ) -> SearchMemoryResponse:
        request = search_request(
            query, [self._conversation(app_name, user_id)], self.top_k, None, (), True
        )
        request.explain = self.min_similarity is not None  # matched words, cosine per hit
        try:
            reply: pb.EmbedDbResponse = await self._memory.call("EmbedDb", request)
        except MemsvcError as exc:
            if exc.code is grpc.StatusCode.NOT_FOUND:  # nothing kept for this user yet
                return SearchMemoryResponse()
            raise
        floor = self.floor(reply)
        hits = [h for h in (*reply.standing, *reply.hits) if matches(h, floor)]
        spans = [covered(h) for h in hits]
        conversation = self._conversation(app_name, user_id)
        read = await asyncio.gather(  # each hit's turns as added, the rest left unread
            *(self._read_whole(conversation, (t[0], t[-1])) for t in spans)
        )
        memories: list[MemoryEntry] = []
        seen: set[int] = set()
        for hit, turns, events in zip(hits, spans, read, strict=True):
            wanted = set(turns)
            said = [t for t in events if t.turn_id in wanted and t.turn_id not in seen]
            added = {t.turn_id: e for t in said if (e := event_of(t)) is not None}
            for turn in answering(hit, [t for t in said if t.turn_id in added], floor):
                seen.add(turn.turn_id)
                memories.append(to_entry(hit, turn, added[turn.turn_id]))
        return SearchMemoryResponse(memories=memories[: self.top_k])

    async def _read_whole(self, conversation: str, span: tuple[int, int]) -> list[pb.MemoryEvent]:
        """The turns of `span`, an event kept in parts whole: its later parts past the span
        (they say nothing, so a hit's turns end at its first) read too."""
        turns = await self._memory.export(conversation, turns=span)
        part = part_of(turns[-1]) if turns else None
        if part is not None and part.index < part.count:
            end = turns[-1].turn_id + part.count - part.index
            turns += await self._memory.export(conversation, turns=(turns[-1].turn_id + 1, end))
        return joined(turns)

    def floor(self, reply: pb.EmbedDbResponse) -> float | None:
        """The similarity a hit sharing no word with the query must reach (None: every hit
        is kept): `min_similarity`, or by default the model's (`RELATED_SHARE`)."""
        if self.min_similarity != MODEL_FLOOR:
            return None if self.min_similarity is None else float(self.min_similarity)
        unrelated = reply.unrelated_similarity  # 0 from a server before it: floor 0.33
        return unrelated + RELATED_SHARE * (1.0 - unrelated)

    async def delete_memory(
        self, *, app_name: str, user_id: str, memory_id: str | None = None
    ) -> None:
        if not memory_id:
            return
        conversation = self._conversation(app_name, user_id)
        if memory_id.startswith(MEMORY_ID_PREFIX):  # "turns:START-END", as 0.1 gave them
            start, _, end = memory_id.removeprefix(MEMORY_ID_PREFIX).partition("-")
            found = items(await self._export(conversation, (int(start), int(end))))
        else:
            found = [
                i for i in items(await self._export(conversation)) if event_id(i.turn) == memory_id
            ]
        if not found:
            return
        # remembered first: a delete cut short leaves the event kept, and not added again
        ids = [i for i in (event_id(f.turn) for f in found) if i]  # turns added by ADK events
        if ids:
            await self._remember_deleted(conversation, ids)
        for turn_id in (t for f in found for t in f.turn_ids):  # an event in parts: each
            await self._memory.delete(conversation, (turn_id, turn_id), defer_store=True)
        self._kept.forget(conversation)

    async def _export(
        self, conversation: str, turns: tuple[int, int] | None = None
    ) -> list[pb.MemoryEvent]:
        try:
            return await self._memory.export(conversation, turns=turns)
        except MemsvcError as exc:
            if exc.code is grpc.StatusCode.NOT_FOUND:  # nothing kept for this user yet
                return []
            raise

    async def _remember_deleted(self, conversation: str, ids: Sequence[str]) -> None:
        when = datetime.now(timezone.utc).isoformat()  # noqa: UP017 (3.10)
        marks = [
            pb.MemoryEvent(
                conversation_id=conversation + DELETED_SUFFIX,
                speaker="system",
                text=f"deleted ADK event {i}",
                timestamp=when,
                payload=json.dumps({"id": i}),
            )
            for i in ids
        ]
        key = "adk-deleted:" + hashlib.sha256("\n".join(ids).encode()).hexdigest()
        written(await self._memory.append(marks, assign_turn_ids=True, idempotency_key=key))

    async def purge(self, *, app_name: str, user_id: str) -> pb.PurgeDeletedResponse:
        """Erase the text of this user's deleted turns for good (an admin token)."""
        request = pb.PurgeDeletedRequest(conversation_id=self._conversation(app_name, user_id))
        reply: pb.PurgeDeletedResponse = await self._memory.call("PurgeDeleted", request)
        return reply

    async def close(self) -> None:
        """Close the channel this service opened on the running event loop."""
        await self._memory.close()
