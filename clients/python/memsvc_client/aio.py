"""The asyncio client (grpc.aio): `AsyncMemoryClient`, the same calls, errors, retries, token
and TLS as `MemoryClient`, for frameworks that run on an event loop.

    async with AsyncMemoryClient("127.0.0.1:50051", token=...) as memory:
        await memory.append([pb.MemoryEvent(...)], wait=True)
        hits = await memory.search("what is the dog called?", conversation_ids=["c1"])
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

from memsvc_client.client import (
    MemsvcError,
    append_request,
    bearer,
    channel_options,
    credentials,
    export_request,
    last_turns,
    pop_request,
    retry_safely,
    search_request,
    trace_context,
    wait_request,
)
from memsvc_client.v1 import memory_pb2 as pb
from memsvc_client.v1 import memory_pb2_grpc as pb_grpc


class AsyncMemoryClient:
    """memsvc at `target` from asyncio code (arguments as MemoryClient's). It may be made
    outside any event loop and used from several: a grpc.aio channel belongs to the loop
    that made it, so the client opens one per running loop on first use (LangChain apps
    and `asyncio.run` called twice, the Agents SDK's `run_sync`, LlamaIndex's sync
    wrappers each run calls on a loop of their own). `close()` closes the running loop's."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        token: str | None = None,
        ca_file: str | None = None,
        attempts: int = 3,
        timeout_s: float = 60.0,
    ) -> None:
        self.target = target
        self._options = channel_options(attempts)
        self._credentials = credentials(ca_file)
        self._channels: dict[asyncio.AbstractEventLoop, grpc.aio.Channel] = {}
        self.metadata = bearer(token)
        self.timeout_s = timeout_s

    @property
    def channel(self) -> grpc.aio.Channel:
        """The running loop's channel, opened on first use."""
        loop = asyncio.get_running_loop()
        channel = self._channels.get(loop)
        if channel is None:
            # a loop that has ended cannot close its channel any more: forget it
            for ended in [known for known in self._channels if known.is_closed()]:
                del self._channels[ended]
            if self._credentials is not None:
                channel = grpc.aio.secure_channel(
                    self.target, self._credentials, options=self._options
                )
            else:
                channel = grpc.aio.insecure_channel(self.target, options=self._options)
            self._channels[loop] = channel
        return channel

    @property
    def stub(self) -> pb_grpc.MemoryServiceStub:
        return pb_grpc.MemoryServiceStub(self.channel)  # type: ignore[no-untyped-call]

    async def call(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        """Any RPC by name, e.g. await call("Reindex", pb.ReindexRequest(all=True))."""
        try:
            return await getattr(self.stub, method)(
                request,
                metadata=self.metadata + trace_context(),
                timeout=timeout_s or self.timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            raise MemsvcError(exc) from None

    async def append(
        self,
        events: Iterable[pb.MemoryEvent],
        *,
        wait: bool = False,
        wait_timeout_s: float = 120,
        assign_turn_ids: bool = False,
        idempotency_key: str | None = None,
        expected_last_turn: Mapping[str, int] | None = None,
    ) -> pb.AppendEventsResponse:
        """As MemoryClient.append."""
        events = list(events)
        request = append_request(events, assign_turn_ids, idempotency_key, expected_last_turn)
        try:
            reply: pb.AppendEventsResponse = await self.call("AppendEvents", request)
        except MemsvcError as exc:
            if not retry_safely(exc, idempotency_key):
                raise
            reply = await self.call("AppendEvents", request)  # the same key: written once
        if wait and not reply.errors:
            for conversation_id, turn_id in last_turns(events, reply.turn_ids).items():
                await self.wait_for_indexed(conversation_id, turn_id, wait_timeout_s)
        return reply

    async def wait_for_indexed(
        self, conversation_id: str, turn_id: int, timeout_s: float = 120
    ) -> pb.WaitForIndexedResponse:
        reply: pb.WaitForIndexedResponse = await self.call(
            "WaitForIndexed",
            wait_request(conversation_id, turn_id, timeout_s),
            timeout_s=min(timeout_s, 300) + 10,
        )
        return reply

    async def export(
        self, conversation_id: str, last: int = 0, turns: tuple[int, int] | None = None
    ) -> list[pb.MemoryEvent]:
        events: list[pb.MemoryEvent] = []
        token = ""
        while True:
            reply = await self.call(
                "ExportEvents",
                export_request(conversation_id, token, last, turns),
            )
            events += reply.events
            token = reply.next_page_token
            if not token:
                return events

    async def search(
        self,
        query: str,
        *,
        conversation_ids: Sequence[str] = (),
        top_k: int = 0,
        mode: str | None = None,
        speakers: Sequence[str] = (),
        keep_query_end: bool = False,
    ) -> list[pb.Hit]:
        request = search_request(query, conversation_ids, top_k, mode, speakers, keep_query_end)
        reply: pb.EmbedDbResponse = await self.call("EmbedDb", request)
        return list(reply.hits)

    async def delete(
        self,
        conversation_id: str,
        turns: tuple[int, int] | None = None,
        *,
        defer_store: bool = False,
    ) -> pb.LogicalDeleteBySourceResponse:
        request = pb.LogicalDeleteBySourceRequest(
            conversation_id=conversation_id, defer_store=defer_store
        )
        if turns is not None:
            request.turn_range.start, request.turn_range.end = turns
        reply: pb.LogicalDeleteBySourceResponse = await self.call("LogicalDeleteBySource", request)
        return reply

    async def pop(
        self, conversation_id: str, count: int = 1, *, idempotency_key: str | None = None
    ) -> list[pb.MemoryEvent]:
        """As MemoryClient.pop."""
        request = pop_request(conversation_id, count, idempotency_key)
        try:
            reply: pb.PopEventsResponse = await self.call("PopEvents", request)
        except MemsvcError as exc:
            if not retry_safely(exc, request.idempotency_key):
                raise
            reply = await self.call("PopEvents", request)  # the same key: popped once
        return list(reply.events)

    async def status(self, conversation_ids: Sequence[str] = ()) -> pb.GetIndexStatusResponse:
        reply: pb.GetIndexStatusResponse = await self.call(
            "GetIndexStatus", pb.GetIndexStatusRequest(conversation_ids=list(conversation_ids))
        )
        return reply

    async def last_turn(self, conversation_id: str) -> int:
        """As MemoryClient.last_turn."""
        rows = (await self.status([conversation_id])).conversations
        return rows[0].last_appended_turn if rows else -1

    async def close(self) -> None:
        """Close the running loop's channel, if this client opened one there."""
        channel = self._channels.pop(asyncio.get_running_loop(), None)
        if channel is not None:
            await channel.close(None)

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
