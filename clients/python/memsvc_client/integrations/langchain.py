"""memsvc as LangChain memory (`pip install 'memsvc-client[langchain]'`, langchain-core).

`MemsvcChatMessageHistory(BaseChatMessageHistory)`: one memsvc conversation.
- `session_id` is the conversation id (with a tenant's token, within its tenant).
- Messages map to turns: HumanMessage -> speaker "user", AIMessage -> "assistant",
  SystemMessage -> "system"; `message.name` -> speaker_name. Other message types (tool
  calls and results) are refused with a TypeError naming the type: memsvc keeps what was
  said, and a ToolMessage would come back as something else.
- Turn ids and timestamps are the server's (`assign_turn_ids`: the next ids after the
  conversation's last turn, the time of receipt), so several processes may add to one
  history without colliding.
- `messages` reads the conversation back in turn order (ExportEvents), as sent: the text
  is the one appended, not memsvc's cleaned form. `clear()` deletes the conversation's turns
  (LogicalDeleteBySource); later messages get new ids, and deleted turns never come back.
- String content only (a list of content blocks is refused): memsvc indexes text.

`MemsvcRetriever(BaseRetriever)`: memsvc search as LangChain documents. Each hit is a
`Document` whose page_content is the chunk's text and whose metadata holds chunk_id,
score, conversation_id, turn_start, turn_end, time_start, time_end and speakers.

Both have async variants on `AsyncMemoryClient` (grpc.aio), so nothing blocks an event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field

from memsvc_client.aio import AsyncMemoryClient
from memsvc_client.client import MemoryClient
from memsvc_client.v1 import memory_pb2 as pb

SPEAKERS: dict[type[BaseMessage], str] = {
    HumanMessage: "user",
    AIMessage: "assistant",
    SystemMessage: "system",
}
MESSAGES: dict[str, type[BaseMessage]] = {v: k for k, v in SPEAKERS.items()}


def to_event(session_id: str, message: BaseMessage) -> pb.MemoryEvent:
    speaker = SPEAKERS.get(type(message))
    if speaker is None:
        raise TypeError(
            f"{type(message).__name__}: memsvc keeps human, AI and system messages only"
        )
    if not isinstance(message.content, str):
        raise TypeError(f"{type(message).__name__}.content: text only, not content blocks")
    return pb.MemoryEvent(
        conversation_id=session_id,
        speaker=speaker,
        text=message.content,
        speaker_name=message.name or "",
    )


def to_message(event: pb.MemoryEvent) -> BaseMessage:
    kind = MESSAGES.get(event.speaker, HumanMessage)
    return kind(content=event.text, name=event.speaker_name or None)


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
        self.client = client
        self.async_client = async_client
        self.wait = wait

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return [to_message(e) for e in self._sync().export(self.session_id)]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        events = [to_event(self.session_id, m) for m in messages]
        if events:
            self._sync().append(events, assign_turn_ids=True, wait=self.wait)

    def clear(self) -> None:
        self._sync().delete(self.session_id)

    async def aget_messages(self) -> list[BaseMessage]:
        if self.async_client is None:
            return await super().aget_messages()
        return [to_message(e) for e in await self.async_client.export(self.session_id)]

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        if self.async_client is None:
            return await super().aadd_messages(messages)
        events = [to_event(self.session_id, m) for m in messages]
        if events:
            await self.async_client.append(events, assign_turn_ids=True, wait=self.wait)

    async def aclear(self) -> None:
        if self.async_client is None:
            return await super().aclear()
        await self.async_client.delete(self.session_id)

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
    """memsvc search as a LangChain retriever: `top_k` hits (0 = the server's default) of
    `mode` (hybrid by default), within `conversation_ids` and `speakers` when given."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: MemoryClient | None = None
    async_client: AsyncMemoryClient | None = None
    conversation_ids: list[str] = Field(default_factory=list)
    speakers: list[str] = Field(default_factory=list)
    top_k: int = 0
    mode: str | None = None

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        if self.client is None:
            raise RuntimeError("this retriever has an async client only: use ainvoke")
        hits = self.client.search(query, **self._filters())
        return [to_document(h) for h in hits]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        if self.async_client is None:
            return await super()._aget_relevant_documents(query, run_manager=run_manager)
        hits = await self.async_client.search(query, **self._filters())
        return [to_document(h) for h in hits]

    def _filters(self) -> dict[str, Any]:
        return {
            "conversation_ids": self.conversation_ids,
            "speakers": self.speakers,
            "top_k": self.top_k,
            "mode": self.mode,
        }
