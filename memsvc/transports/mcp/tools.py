"""The four MCP tools: add_turns, search_memory, delete_turns, memory_status.

Each is one gRPC call (add_turns with `wait`: two) made through `MemoryGateway` with the
caller's token. Results are structured (an output schema per tool) with a short text
rendering beside them, for hosts that show text only."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal, TypeVar

import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from memsvc.transports.mcp.gateway import MemoryGateway
from memsvc.transports.mcp.models import (
    AddTurnsResult,
    ConversationStatus,
    DeleteResult,
    SearchResult,
    StatusResult,
    Turn,
    hit_of,
)
from memsvc.transports.mcp.retries import RecentCalls
from memsvc.v1 import memory_pb2 as pb

T = TypeVar("T")
# The token of the call: from the HTTP request's headers, or the one the stdio server was
# started with.
TokenOf = Callable[[Mapping[str, str] | None], str]

INSTRUCTIONS = """\
Long-term memory of conversations (user and assistant turns), searchable by meaning and by
keywords. Store turns with add_turns (leave turn_id and timestamp out and memsvc numbers
and stamps them; pass wait=true when you will search for them right away), find evidence
with search_memory,
forget turns with delete_turns, and check indexing with memory_status."""

MODES = {
    "hybrid": pb.SEARCH_MODE_HYBRID,
    "dense": pb.SEARCH_MODE_DENSE,
    "keyword": pb.SEARCH_MODE_KEYWORD,
}
MODE_NAMES = {v: k for k, v in MODES.items()}
ORDERS = {
    "relevance": pb.SEARCH_ORDER_RELEVANCE,
    "time": pb.SEARCH_ORDER_TIME,
    "newest": pb.SEARCH_ORDER_NEWEST,
}
WAIT_TIMEOUT_MS = 60_000
# Conversations per memory_status answer: what an agent reads, not a dump of the server.
STATUS_PAGE = 100


def _result(text: str, value: BaseModel) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=value.model_dump(mode="json"),
    )


async def _off_loop(fn: Callable[..., T], *args: Any, **kw: Any) -> T:
    # gRPC calls block: off the event loop, so one slow call does not stall the others
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kw))


def build_mcp(gateway: MemoryGateway, token_of: TokenOf) -> MCPServer:
    server: MCPServer = MCPServer(
        name="memsvc", instructions=INSTRUCTIONS, log_level="WARNING", version="1"
    )
    recent = RecentCalls()

    def token(ctx: Context) -> str:
        try:
            headers = ctx.headers
        except ValueError:  # outside a request: no headers
            headers = None
        return token_of(headers)

    @server.tool(
        title="Add conversation turns to memory",
        description=(
            "Store turns of one conversation in long-term memory. Writes are durable when "
            "this returns; they become searchable within seconds (pass wait=true to return "
            "only once they are). To retry a call safely, send it again with the same "
            "request_id: the turns are stored once. Without request_id, the same turns sent "
            "again within 30 s, with no other add_turns to the conversation between, are "
            "taken as a retry and stored once."
        ),
        annotations=ToolAnnotations(
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,  # exactly only with request_id
            open_world_hint=False,
        ),
    )
    async def add_turns(
        conversation_id: Annotated[str, Field(description="The conversation's id.")],
        turns: Annotated[list[Turn], Field(description="The turns, in order.")],
        ctx: Context,
        wait: Annotated[
            bool, Field(description="Return once the last turn is searchable (up to 60 s).")
        ] = False,
        request_id: Annotated[
            str | None,
            Field(
                description="Any id of yours for this call (e.g. a UUID), up to 128 characters:"
                " a retry with the same request_id and turns stores nothing twice."
            ),
        ] = None,
    ) -> Annotated[CallToolResult, AddTurnsResult]:
        if not turns:
            raise ToolError("INVALID_ARGUMENT: turns: at least one turn")
        numbered = [t.turn_id is not None for t in turns]
        if any(numbered) and not all(numbered):
            raise ToolError(
                "INVALID_ARGUMENT: turns[].turn_id: give every turn an id, or none (memsvc"
                " then numbers them after the conversation's last turn)"
            )
        assign = not any(numbered)
        if not assign and any(t.timestamp is None for t in turns):
            first = next(i for i, t in enumerate(turns) if t.timestamp is None)
            raise ToolError(
                f"INVALID_ARGUMENT: turns[{first}].timestamp: required with turn ids"
                " (omit the ids too and memsvc stamps the time of receipt)"
            )
        events = [
            pb.MemoryEvent(
                conversation_id=conversation_id,
                turn_id=t.turn_id or 0,
                speaker=t.speaker,
                text=t.text,
                timestamp=t.timestamp or "",
                speaker_name=t.speaker_name or "",
                participants=t.participants or [],
            )
            for t in turns
        ]
        bearer = token(ctx)
        if request_id is None:  # a retry of this call is still stored once (retries.py)
            sent = b"".join(e.SerializeToString(deterministic=True) for e in events)
            caller = hashlib.sha256(bearer.encode()).hexdigest()
            request_id = recent.key_for(caller, conversation_id, sent)
        request = pb.AppendEventsRequest(
            events=events, assign_turn_ids=assign, idempotency_key=request_id
        )
        renames = {
            "events[0].conversation_id": "conversation_id",
            "events": "turns",
            "idempotency_key": "request_id",
        }
        reply = await _off_loop(
            gateway.call, lambda s: s.AppendEvents, request, bearer, renames=renames
        )
        if reply.errors:  # a conversation with a bad turn is refused whole
            # the server names request fields (events[i]...); this caller sent turns[i]
            problems = "; ".join(_tool_words(e.message) for e in reply.errors[:20])
            raise ToolError(f"INVALID_ARGUMENT: nothing was written. {problems}")
        ids = list(reply.turn_ids) if assign else [t.turn_id or 0 for t in turns]
        value = AddTurnsResult(
            accepted=reply.accepted,
            duplicates=reply.duplicates,
            turn_ids=ids,
            indexed=None,
            backlog=None,
        )
        text = f"Stored {reply.accepted} turn(s) of {conversation_id}"
        text += f" as turn(s) {_spans(ids)}" if assign else ""
        text += f" ({reply.duplicates} already stored)." if reply.duplicates else "."
        if wait:
            last = max(ids)
            try:
                waited = await _off_loop(
                    gateway.call,
                    lambda s: s.WaitForIndexed,
                    pb.WaitForIndexedRequest(
                        conversation_id=conversation_id, turn_id=last, timeout_ms=WAIT_TIMEOUT_MS
                    ),
                    bearer,
                    timeout_s=WAIT_TIMEOUT_MS / 1000 + 10,
                )
            except ToolError as exc:
                # the turns are stored: a failed wait is no reason to send them again
                value.indexed = False
                text += f" Stored; whether they are searchable yet is not known ({exc})."
                return _result(text, value)
            value.indexed, value.backlog = waited.indexed, waited.status.backlog
            text += (
                " They are searchable now."
                if waited.indexed
                else f" Not searchable yet ({waited.status.backlog} turn(s) to index"
                + (f"; last error: {waited.status.last_error}" if waited.status.last_error else "")
                + ")."
            )
        return _result(text, value)

    @server.tool(
        title="Search memory",
        description=(
            "Find stored conversation passages relevant to a query (by meaning and keywords). "
            "Each hit is a passage of consecutive turns with its conversation, turn range "
            "and time. Narrow with conversation_ids, speakers and a time range."
        ),
        annotations=ToolAnnotations(
            read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        ),
    )
    async def search_memory(
        query: Annotated[str, Field(description="What to look for, in natural language.")],
        ctx: Context,
        conversation_ids: Annotated[
            list[str] | None, Field(description="Only these conversations.")
        ] = None,
        top_k: Annotated[int | None, Field(description="Hits to return (default 6).")] = None,
        mode: Annotated[
            Literal["hybrid", "dense", "keyword"] | None,
            Field(description="hybrid (default), dense (meaning) or keyword (BM25)."),
        ] = None,
        speakers: Annotated[
            list[str] | None,
            Field(description='Only passages where any of these roles speaks ("user", ...).'),
        ] = None,
        time_from: Annotated[
            str | None, Field(description="Only passages at or after this RFC 3339 time.")
        ] = None,
        time_to: Annotated[
            str | None, Field(description="Only passages at or before this RFC 3339 time.")
        ] = None,
        turn_budget: Annotated[
            int | None,
            Field(description="At most this many turns in all (each counted once); fills it."),
        ] = None,
        order: Annotated[
            Literal["relevance", "time", "newest"] | None,
            Field(
                description="relevance (default), time (oldest first: how a topic unfolded)"
                " or newest (newest first: the current value of something)."
            ),
        ] = None,
    ) -> Annotated[CallToolResult, SearchResult]:
        request = pb.EmbedDbRequest(
            query_text=query,
            top_k=top_k or 0,
            turn_budget=turn_budget or 0,
            order=ORDERS[order] if order else pb.SEARCH_ORDER_UNSPECIFIED,
            mode=MODES[mode] if mode else pb.SEARCH_MODE_UNSPECIFIED,
            filters=pb.SearchFilters(
                conversation_ids=conversation_ids or [],
                speakers=speakers or [],
                timestamp_range=pb.TimestampRange(start=time_from or "", end=time_to or ""),
            ),
        )
        renames = {
            "query_text": "query",
            "filters.conversation_ids": "conversation_ids",
            "filters.speakers": "speakers",
            "filters.timestamp_range.start": "time_from",
            "filters.timestamp_range.end": "time_to",
            "filters.timestamp_range": "time_from",
            "turn_budget": "turn_budget",
        }
        reply = await _off_loop(
            gateway.call, lambda s: s.EmbedDb, request, token(ctx), renames=renames
        )
        hits = [hit_of(h) for h in reply.hits]
        standing = [hit_of(h) for h in reply.standing]
        value = SearchResult(
            query=query, mode=MODE_NAMES.get(reply.mode, "hybrid"), hits=hits, standing=standing
        )
        if not hits and not standing:
            return _result("No stored passage matches.", value)
        lines = []
        if standing:
            lines.append(f"{len(standing)} standing instruction(s) of the user that apply:")
            lines += [f"\n- {h.conversation_id} turn {h.turn_start}: {h.text}" for h in standing]
            lines.append("")
        first = {"time": "oldest", "newest": "newest"}.get(order or "", "best")
        lines.append(f"{len(hits)} passage(s), {first} first:")
        for n, h in enumerate(hits, 1):
            lines.append(
                f"\n[{n}] {h.conversation_id} turns {h.turn_start}-{h.turn_end}, "
                f"{h.time_start}, score {h.score:.3f}\n{h.text}"
            )
        return _result("\n".join(lines), value)

    @server.tool(
        title="Delete turns from memory",
        description=(
            "Forget turns of a conversation: they are never returned by search again. "
            "Give turn_start (and turn_end for a range, inclusive); with neither, the whole "
            "conversation is deleted."
        ),
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
        ),
    )
    async def delete_turns(
        conversation_id: Annotated[str, Field(description="The conversation.")],
        ctx: Context,
        turn_start: Annotated[
            int | None, Field(description="First turn to delete (alone: just that turn).")
        ] = None,
        turn_end: Annotated[
            int | None, Field(description="Last turn to delete, inclusive.")
        ] = None,
    ) -> Annotated[CallToolResult, DeleteResult]:
        if turn_end is not None and turn_start is None:
            raise ToolError("INVALID_ARGUMENT: turn_start: required when turn_end is given")
        request = pb.LogicalDeleteBySourceRequest(conversation_id=conversation_id)
        if turn_start is not None:
            end = turn_start if turn_end is None else turn_end
            request.turn_range.CopyFrom(pb.TurnRange(start=turn_start, end=end))
        renames = {"turn_range.start": "turn_start", "turn_range.end": "turn_end"}
        reply = await _off_loop(
            gateway.call, lambda s: s.LogicalDeleteBySource, request, token(ctx), renames=renames
        )
        value = DeleteResult(
            conversation_id=conversation_id,
            turns_deleted=reply.events_deleted,
            chunks_deleted=reply.deleted,
        )
        which = (
            "the whole conversation"
            if turn_start is None
            else f"turns {request.turn_range.start}-{request.turn_range.end}"
        )
        text = (
            f"Deleted {which} of {conversation_id}: {reply.events_deleted} turn(s) newly "
            f"deleted; search no longer returns them."
        )
        return _result(text, value)

    @server.tool(
        title="Memory indexing status",
        description=(
            "How far stored turns are searchable: per conversation the last stored and last "
            "indexed turn, the backlog and the state (idle | pending | indexing | failed)."
        ),
        annotations=ToolAnnotations(
            read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
        ),
    )
    async def memory_status(
        ctx: Context,
        conversation_ids: Annotated[
            list[str] | None,
            Field(description="These conversations (default: all, a page at a time)."),
        ] = None,
        page_token: Annotated[
            str, Field(description="From a previous answer's next_page_token.")
        ] = "",
    ) -> Annotated[CallToolResult, StatusResult]:
        request = pb.GetIndexStatusRequest(
            conversation_ids=conversation_ids or [],
            page_size=STATUS_PAGE,
            page_token=page_token,
        )
        reply = await _off_loop(gateway.call, lambda s: s.GetIndexStatus, request, token(ctx))
        conversations = [
            ConversationStatus(
                conversation_id=c.conversation_id,
                state=c.state,
                last_appended_turn=c.last_appended_turn,
                last_indexed_turn=c.last_indexed_turn,
                backlog=c.backlog,
                last_error=c.last_error,
            )
            for c in reply.conversations
        ]
        value = StatusResult(
            conversations=conversations,
            total_conversations=reply.total_conversations,
            total_backlog=reply.total_backlog,
            paused=reply.paused,
            next_page_token=reply.next_page_token,
        )
        lines = [
            f"{reply.total_conversations} conversation(s), {reply.total_backlog} turn(s) to"
            " index" + (", indexing paused." if reply.paused else ".")
        ]
        lines += [
            f"- {c.conversation_id}: {c.state}, turns stored to {c.last_appended_turn}, "
            f"searchable to {c.last_indexed_turn}"
            + (f", error: {c.last_error}" if c.last_error else "")
            for c in conversations
        ]
        if reply.next_page_token:
            lines.append(f"More: page_token={reply.next_page_token}")
        return _result("\n".join(lines), value)

    return server


def _tool_words(message: str) -> str:
    """A server message in this tool's words: its turns[i], and only options it has."""
    message = message.replace("events[", "turns[")
    message = message.replace(
        "send the missing turns or set allow_gaps",
        "send the missing turns, or omit turn_id so that memsvc numbers the turns",
    )
    restore = message.find(" To bring them back from an export")
    if restore >= 0:  # restoring is an operator's act (memsvc append --restore), not a tool's
        message = message[:restore] + " Omit turn_id to add new turns after the last one."
    return message


def _spans(ids: list[int]) -> str:
    return f"{ids[0]}" if len(ids) == 1 else f"{min(ids)}-{max(ids)}"
