"""memsvc as a LlamaIndex long-term memory block (`pip install 'memsvc-client[llama-index]'`,
llama-index-core's `Memory`).

`MemsvcMemoryBlock(BaseMemoryBlock[str])` goes in `Memory.from_defaults(memory_blocks=[...])`
beside or instead of `VectorMemoryBlock`. The `Memory` keeps recent messages itself and
hands the block the ones it flushes out of its token budget; the block keeps them in memsvc
and, on every `aget`, returns what memsvc finds for the latest messages, which the `Memory`
inserts into the prompt. Unlike a vector store of flushed batches, each message stays a
turn: deletes, tenants, exports and every replica see the same memory.

How LlamaIndex's types map onto memsvc:
- The conversation is `conversation_id` if given, else the `Memory`'s `session_id` (which
  the `Memory` passes on every put and get), mapped injectively (`_ids.single_id`). With
  a token limited to a tenant's prefixes, use ids within them.
- Each `ChatMessage` is one turn. Its JSON (`model_dump_json`, without the `session_id` the
  `Memory` adds) is the turn's `payload`, so `messages()` gives back the messages exactly.
  The turn's `text` is what the message says: its text blocks, `[<role>]` when it has none.
  A message is kept whole and searched by the head of its text (`max_text_chars`); one
  whose JSON is over memsvc's 3,000,000-character payload (an `ImageBlock` of 2.3 MB or
  more) is kept in parts, consecutive turns `messages()` puts back together (`_parts`).
  A put memsvc refuses raises `RefusedEvents` (a ValueError naming the field), and none
  of its messages is kept.
- Speaker: role user -> "user"; assistant, model and chatbot -> "assistant"; system,
  developer, tool and function -> "system".
- Turn ids and timestamps are the server's (`assign_turn_ids`): several processes may put
  into one conversation. `aput` returns once the messages are searchable (`wait`, on by
  default: the next `aget` finds them, as an in-memory block would); a message with no
  text and nothing else is not stored (as `VectorMemoryBlock`).
- `aget` searches the conversation with the text of the last `retrieval_context_window`
  messages (`top_k` hits, or VectorMemoryBlock's `similarity_top_k`; memsvc's default
  hybrid mode), and lists standing instructions the server returns apart ("always answer
  in metric units") before the hits, through `format_template` (as `VectorMemoryBlock`'s:
  `{{ text }}` by default), each hit without the chunk's context line (English or
  Chinese); "" when nothing is found.
- `clear()` deletes the conversation's turns (they never come back); `purge()` erases their
  text (an admin token).
"""

from __future__ import annotations

from typing import Any

import grpc
from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock
from llama_index.core.memory.memory import BaseMemoryBlock
from llama_index.core.prompts import BasePromptTemplate, RichPromptTemplate
from pydantic import AliasChoices, Field, PrivateAttr

from memsvc_client.aio import AsyncMemoryClient
from memsvc_client.client import MemsvcError, new_idempotency_key, search_request, written
from memsvc_client.integrations._hits import said_lines
from memsvc_client.integrations._ids import single_id
from memsvc_client.integrations._parts import appended, arun, joined, split
from memsvc_client.v1 import memory_pb2 as pb

SPEAKERS = {
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.MODEL: "assistant",
    MessageRole.CHATBOT: "assistant",
}  # every other role (system, developer, tool, function) -> "system"
ROLES = {"user": MessageRole.USER, "assistant": MessageRole.ASSISTANT}
SESSION_KEY = "session_id"  # what Memory.aput writes into each message's additional_kwargs


def text_of(message: ChatMessage) -> str:
    """What the message says, for search."""
    text = "\n".join(b.text for b in message.blocks if isinstance(b, TextBlock) and b.text.strip())
    return text or f"[{message.role.value}]"


def says_nothing(message: ChatMessage) -> bool:
    """No text, no other block (an image, a tool call's parts) and nothing in
    additional_kwargs (tool calls): a message with nothing to remember."""
    blocks = [b for b in message.blocks if not (isinstance(b, TextBlock) and not b.text.strip())]
    return not blocks and not message.additional_kwargs


def describe(hit: pb.Hit) -> str:
    """One line per hit: the day and speakers, then the turns (without the chunk's context
    line, which says the same)."""
    meta = hit.metadata
    when = meta.timestamp_range.start[:10]
    head = " ".join(part for part in (when, ", ".join(meta.speakers)) if part)
    said = " / ".join(said_lines(hit))
    return f"- ({head}) {said}" if head else f"- {said}"


def to_message(event: pb.MemoryEvent) -> ChatMessage | None:
    """The message a turn holds; a turn without a payload (plain text from another client)
    reads as a message of its text; None for a payload that is not a ChatMessage (another
    adapter's item: skipped, never a crash)."""
    if not event.payload:
        return ChatMessage(role=ROLES.get(event.speaker, MessageRole.SYSTEM), content=event.text)
    try:
        return ChatMessage.model_validate_json(event.payload)
    except ValueError:  # pydantic's ValidationError, a JSONDecodeError
        return None


class MemsvcMemoryBlock(BaseMemoryBlock[str]):
    """Long-term memory kept in memsvc (see the module's docstring for the mapping)."""

    name: str = Field(default="memsvc", description="The block's name in the prompt.")
    target: str = Field(default="127.0.0.1:50051", description="memsvc's gRPC HOST:PORT.")
    token: str | None = Field(default=None, description="Bearer token, when auth is on.")
    ca_file: str | None = Field(default=None, description="PEM CA bundle, for TLS.")
    conversation_id: str | None = Field(
        default=None, description="The conversation; None = the Memory's session_id."
    )
    top_k: int = Field(
        default=5,
        # VectorMemoryBlock's name for it, so a block swapped in keeps its setting
        validation_alias=AliasChoices("top_k", "similarity_top_k"),
        description="Hits per retrieval (`similarity_top_k`, as VectorMemoryBlock's).",
    )
    retrieval_context_window: int = Field(
        default=3, description="How many of the latest messages make the query."
    )
    max_text_chars: int = Field(
        default=100_000, description="Searchable text per message, at most (the payload is whole)."
    )
    format_template: BasePromptTemplate = Field(
        default=RichPromptTemplate("{{ text }}"),
        description="Template for what aget returns (its `text`: the lines below), as"
        " VectorMemoryBlock's.",
    )
    wait: bool = Field(
        default=True,
        description="aput returns once the messages are searchable, so the next aget finds"
        " them (as an in-memory block would); False: at once, searchable within seconds.",
    )
    _memory: AsyncMemoryClient = PrivateAttr()

    def model_post_init(self, context: Any) -> None:
        self._memory = AsyncMemoryClient(self.target, token=self.token, ca_file=self.ca_file)

    def _conversation(self, session_id: str | None) -> str:
        # a Memory's session id mapped injectively (memsvc folds ids); conversation_id as given
        conversation = self.conversation_id or (single_id(session_id) if session_id else "")
        if not conversation:
            raise ValueError("MemsvcMemoryBlock needs conversation_id or a Memory session_id")
        return conversation

    async def _aget(
        self,
        messages: list[ChatMessage] | None = None,
        session_id: str | None = None,
        **block_kwargs: Any,
    ) -> str:
        context = (messages or [])[-self.retrieval_context_window :]
        query = " ".join(text_of(m) for m in context if m.role == MessageRole.USER)
        query = query or " ".join(text_of(m) for m in context)
        if not query.strip():
            return ""
        request = search_request(
            query, [self._conversation(session_id)], self.top_k, None, (), keep_query_end=True
        )
        try:
            reply: pb.EmbedDbResponse = await self._memory.call("EmbedDb", request)
        except MemsvcError as exc:
            if exc.code is grpc.StatusCode.NOT_FOUND:  # nothing kept yet
                return ""
            raise
        lines = []
        if reply.standing:
            lines += ["Standing instructions:", *(describe(h) for h in reply.standing)]
        if reply.hits:
            lines += ["From earlier in the conversation:", *(describe(h) for h in reply.hits)]
        return self.format_template.format(text="\n".join(lines)) if lines else ""

    async def _aput(self, messages: list[ChatMessage]) -> None:
        if not messages:
            return
        kept_messages = []
        session_id = None
        for message in messages:
            kept = message.model_copy(deep=True)
            session_id = kept.additional_kwargs.pop(SESSION_KEY, session_id)
            if not says_nothing(kept):  # as VectorMemoryBlock: nothing to remember
                kept_messages.append(kept)
        conversation = self._conversation(session_id)
        turns = []
        for kept in kept_messages:
            event = pb.MemoryEvent(
                conversation_id=conversation,
                speaker=SPEAKERS.get(kept.role, "system"),
                text=text_of(kept)[: self.max_text_chars],
                payload=kept.model_dump_json(),
            )
            turns += split(event)  # a message over the payload limit: in parts
        if not turns:
            return
        plan = appended(conversation, turns, new_idempotency_key(), wait=self.wait)
        written(await arun(self._memory, plan), "messages")

    async def messages(self, session_id: str | None = None) -> list[ChatMessage]:
        """Every message kept in the conversation, in order, exactly as put."""
        events = await self._memory.export(self._conversation(session_id))
        return [m for m in map(to_message, joined(events)) if m is not None]

    async def clear(self, session_id: str | None = None) -> None:
        """Delete the conversation's turns: they are never found or returned again."""
        try:
            await self._memory.delete(self._conversation(session_id), defer_store=True)
        except MemsvcError as exc:
            if exc.code is not grpc.StatusCode.NOT_FOUND:  # nothing ever put: nothing to clear
                raise

    async def purge(self, session_id: str | None = None) -> pb.PurgeDeletedResponse:
        """Erase the text of the conversation's deleted turns for good (an admin token)."""
        request = pb.PurgeDeletedRequest(conversation_id=self._conversation(session_id))
        reply: pb.PurgeDeletedResponse = await self._memory.call("PurgeDeleted", request)
        return reply

    async def close(self) -> None:
        """Close the channel this block opened on the running event loop."""
        await self._memory.close()
