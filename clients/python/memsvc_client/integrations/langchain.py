"""memsvc as LangChain memory (`pip install 'memsvc-client[langchain]'`, langchain-core).

`MemsvcChatMessageHistory(BaseChatMessageHistory)`: one memsvc conversation.
- `session_id` is the conversation id (with a tenant's token, within its tenant): as it is
  when memsvc's normal form and without `%`, else percent-encoded (`_ids.single_id`), so
  no two session ids share a conversation (memsvc folds ids: NFC, runs of spaces).
- Each message is one turn. Its serialised form (`message_to_dict`) is the turn's
  `payload`, so `messages` gives back every message exactly as added: AI messages with
  tool calls, tool results, content blocks, ids and metadata included.
- What memsvc chunks and searches (the turn's `text`) is what the message says: its text
  content (the text blocks of a list), and an AI message's tool calls as name and
  arguments; `[<type>]` when it says nothing. Speaker: human -> "user", AI -> "assistant",
  system and tool results -> "system"; `message.name` -> speaker_name.
- Turn ids and timestamps are the server's (`assign_turn_ids`: the next ids after the
  conversation's last turn, the time of receipt), so several processes may add to one
  history without colliding.
- `messages` reads the conversation back in turn order (ExportEvents); turns another
  client wrote (no payload) come back as human, AI or system messages of their text.
  `clear()` deletes the conversation's turns (LogicalDeleteBySource); later messages get
  new ids, and deleted turns never come back.
- A message is kept whole and searched by the head of its text (MAX_TEXT_CHARS); one whose
  payload is over memsvc's 3,000,000 characters (an image inlined as base64) is kept in
  parts, consecutive turns `messages` puts back together (`_parts`). A write memsvc
  refuses raises `RefusedEvents` (a ValueError naming the field); none of the call's
  messages is kept.

`MemsvcRetriever(BaseRetriever)`: memsvc search as LangChain documents. Each hit is a
`Document` whose page_content is the chunk's text and whose metadata holds chunk_id,
score, conversation_id, turn_start, turn_end, time_start, time_end and speakers.

Both have async variants on `AsyncMemoryClient` (grpc.aio), so nothing blocks an event loop;
the client may be made outside any loop and used from several (one channel per loop).
`invoke(query, k=...)` (or `top_k`) sets the number of hits for one call, as LangChain's
standard retriever tests expect; `MemsvcRetriever(k=...)` is `top_k`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field

from memsvc_client.aio import AsyncMemoryClient
from memsvc_client.client import MemoryClient, new_idempotency_key, written
from memsvc_client.integrations._ids import single_id
from memsvc_client.integrations._parts import appended, arun, joined, run, split
from memsvc_client.v1 import memory_pb2 as pb

# By message type (BaseMessage.type): who speaks in memsvc's turns.
SPEAKERS = {"human": "user", "ai": "assistant", "system": "system", "tool": "system"}
MESSAGES: dict[str, type[BaseMessage]] = {
    "user": HumanMessage,
    "assistant": AIMessage,
    "system": SystemMessage,
}
# The text memsvc searches, at most (the server's MEMSVC_MAX_TURN_CHARS default); the
# payload keeps the whole message.
MAX_TEXT_CHARS = 100_000


def text_of(message: BaseMessage) -> str:
    """What the message says, for search."""
    content = message.content
    blocks = [content] if isinstance(content, str) else content
    parts = [b if isinstance(b, str) else str(b.get("text", "")) for b in blocks]
    for call in getattr(message, "tool_calls", None) or []:
        parts.append(f"{call['name']} {json.dumps(call.get('args', {}), ensure_ascii=False)}")
    text = "\n".join(p for p in parts if p.strip())
    return text or f"[{message.type}]"


def to_event(session_id: str, message: BaseMessage) -> pb.MemoryEvent:
    return pb.MemoryEvent(
        conversation_id=session_id,
        speaker=SPEAKERS.get(message.type, "system"),
        text=text_of(message)[:MAX_TEXT_CHARS],
        speaker_name=message.name or "",
        payload=json.dumps(message_to_dict(message), ensure_ascii=False),
    )


def to_message(event: pb.MemoryEvent) -> BaseMessage | None:
    """The message a turn holds; a turn without a payload (plain text from another client)
    reads as a message of its text; None for a payload that is not a LangChain message
    (another adapter's item: skipped, as the Agents SDK adapter skips ours)."""
    if event.payload:
        try:
            return messages_from_dict([json.loads(event.payload)])[0]
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            return None
    kind = MESSAGES.get(event.speaker, HumanMessage)
    return kind(content=event.text, name=event.speaker_name or None)


def to_messages(events: list[pb.MemoryEvent]) -> list[BaseMessage]:
    return [m for m in map(to_message, joined(events)) if m is not None]


def to_turns(session_id: str, messages: Sequence[BaseMessage]) -> list[pb.MemoryEvent]:
    """The turns of these messages: one each, a message over the payload limit in parts."""
    return [t for m in messages for t in split(to_event(session_id, m))]


class MemsvcChatMessageHistory(BaseChatMessageHistory):
    """The chat history of conversation `session_id` in memsvc (see the module docstring).
    `wait`: add_messages returns once the new turns are searchable."""

    def __init__(
        self,
        session_id: str,
        client: MemoryClient | None = None,
        *,
        async_client: AsyncMemoryClient | None = None,
        wait: bool = False,
    ) -> None:
        if client is None and async_client is None:
            raise ValueError("client or async_client: at least one")
        self.session_id = session_id
        self.conversation_id = single_id(session_id)  # injective (memsvc folds ids)
        self.client = client
        self.async_client = async_client
        self.wait = wait

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return to_messages(self._sync().export(self.conversation_id))

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        turns = to_turns(self.conversation_id, messages)
        if turns:
            plan = appended(self.conversation_id, turns, new_idempotency_key(), wait=self.wait)
            written(run(self._sync(), plan), "messages")

    def clear(self) -> None:
        self._sync().delete(self.conversation_id, defer_store=True)

    async def aget_messages(self) -> list[BaseMessage]:
        if self.async_client is None:
            return await super().aget_messages()
        return to_messages(await self.async_client.export(self.conversation_id))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if self.async_client is None:
            return await super().aadd_messages(messages)
        turns = to_turns(self.conversation_id, messages)
        if turns:
            plan = appended(self.conversation_id, turns, new_idempotency_key(), wait=self.wait)
            written(await arun(self.async_client, plan), "messages")

    async def aclear(self) -> None:
        if self.async_client is None:
            return await super().aclear()
        await self.async_client.delete(self.conversation_id, defer_store=True)

    def _sync(self) -> MemoryClient:
        if self.client is None:
            raise RuntimeError("this history has an async client only: use the a* methods")
        return self.client


def to_document(hit: pb.Hit) -> Document:
    m = hit.metadata
    return Document(
        page_content=hit.text,
        metadata={
            "chunk_id": hit.chunk_id,
            "score": hit.score,
            "conversation_id": m.conversation_id,
            "turn_start": m.turn_range.start,
            "turn_end": m.turn_range.end,
            "time_start": m.timestamp_range.start,
            "time_end": m.timestamp_range.end,
            "speakers": list(m.speakers),
        },
    )


class MemsvcRetriever(BaseRetriever):
    """memsvc search as a LangChain retriever: `top_k` (or `k`) hits (0 = the server's
    default) of `mode` (hybrid by default), within `conversation_ids` and `speakers` when
    given; `invoke(query, k=3)` asks for another number for one call."""

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True)

    client: MemoryClient | None = None
    async_client: AsyncMemoryClient | None = None
    conversation_ids: list[str] = Field(default_factory=list)
    speakers: list[str] = Field(default_factory=list)
    top_k: int = Field(0, alias="k")
    mode: str | None = None

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        if self.client is None:
            raise RuntimeError("this retriever has an async client only: use ainvoke")
        hits = self.client.search(query, keep_query_end=True, **self._filters(kwargs))
        return [to_document(h) for h in hits]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        if self.async_client is None:
            return await super()._aget_relevant_documents(query, run_manager=run_manager, **kwargs)
        hits = await self.async_client.search(query, keep_query_end=True, **self._filters(kwargs))
        return [to_document(h) for h in hits]

    def _filters(self, call: dict[str, Any]) -> dict[str, Any]:
        """The search's arguments: this retriever's, `k` (or `top_k`) of the call first."""
        unknown = set(call) - {"k", "top_k"}
        if unknown:
            raise TypeError(f"MemsvcRetriever.invoke: unexpected {', '.join(sorted(unknown))}")
        return {
            "conversation_ids": self.conversation_ids,
            "speakers": self.speakers,
            "top_k": int(call.get("k", call.get("top_k", self.top_k))),
            "mode": self.mode,
        }
