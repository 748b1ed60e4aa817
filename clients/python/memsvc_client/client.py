"""A thin client: one method per common call, errors with memsvc's machine-readable details,
transient failures retried by gRPC itself (UNAVAILABLE, honouring the server's retry
pushback)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from memsvc_client.v1 import memory_pb2 as pb
from memsvc_client.v1 import memory_pb2_grpc as pb_grpc

_propagate: Any
try:  # the application's OpenTelemetry, if it has one: memsvc-client does not require it
    from opentelemetry import propagate as _propagate
except ImportError:
    _propagate = None

MODES = {
    "hybrid": pb.SEARCH_MODE_HYBRID,
    "dense": pb.SEARCH_MODE_DENSE,
    "keyword": pb.SEARCH_MODE_KEYWORD,
}


def _retry_config(attempts: int) -> str:
    # gRPC's own retries: only UNAVAILABLE (nothing was done), with backoff; the server's
    # grpc-retry-pushback-ms overrides the backoff when it says how long to wait.
    return json.dumps(
        {
            "methodConfig": [
                {
                    "name": [{"service": "memsvc.v1.MemoryService"}],
                    "retryPolicy": {
                        "maxAttempts": max(2, min(attempts, 5)),
                        "initialBackoff": "0.5s",
                        "maxBackoff": "10s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                }
            ]
        }
    )


def channel_options(attempts: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.enable_retries", 1),
        ("grpc.service_config", _retry_config(attempts)),
        ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        # a request larger than the retry buffer is never retried (gRPC's default 256 KiB;
        # an append may be up to the server's 16 MiB request limit)
        ("grpc.per_rpc_retry_buffer_size", 32 * 1024 * 1024),
    ]


def credentials(ca_file: str | None) -> grpc.ChannelCredentials | None:
    """TLS credentials trusting `ca_file`; None: plaintext."""
    if not ca_file:
        return None
    with open(ca_file, "rb") as f:
        return grpc.ssl_channel_credentials(root_certificates=f.read())


def bearer(token: str | None) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")] if token else []


def trace_context() -> list[tuple[str, str]]:
    """The caller's current OpenTelemetry context as W3C headers (`traceparent`,
    `tracestate`), so memsvc's spans join the caller's trace; nothing when the application
    does not use OpenTelemetry (or has no span open)."""
    if _propagate is None:
        return []
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    return list(carrier.items())


def last_turns(events: Iterable[pb.MemoryEvent], turn_ids: Sequence[int] = ()) -> dict[str, int]:
    """The last turn of each conversation among `events` (or their assigned `turn_ids`)."""
    last: dict[str, int] = {}
    events = list(events)
    ids = list(turn_ids) or [e.turn_id for e in events]
    for e, turn_id in zip(events, ids, strict=True):
        last[e.conversation_id] = max(last.get(e.conversation_id, -1), turn_id)
    return last


def search_request(
    query: str,
    conversation_ids: Sequence[str],
    top_k: int,
    mode: str | None,
    speakers: Sequence[str],
    keep_query_end: bool = False,
) -> pb.EmbedDbRequest:
    """`keep_query_end`: a query over the server's limits (4,096 characters, the model's
    tokens) is cut to its end instead of refused (EmbedDbRequest.keep_query_end)."""
    return pb.EmbedDbRequest(
        query_text=query,
        top_k=top_k,
        mode=MODES[mode] if mode else pb.SEARCH_MODE_UNSPECIFIED,
        filters=pb.SearchFilters(conversation_ids=list(conversation_ids), speakers=list(speakers)),
        keep_query_end=keep_query_end,
    )


def export_request(
    conversation_id: str, page_token: str, last: int, turns: tuple[int, int] | None
) -> pb.ExportEventsRequest:
    request = pb.ExportEventsRequest(
        conversation_id=conversation_id, page_token=page_token, last=last
    )
    if turns is not None:
        request.turn_range.start, request.turn_range.end = turns
    return request


def wait_request(conversation_id: str, turn_id: int, timeout_s: float) -> pb.WaitForIndexedRequest:
    return pb.WaitForIndexedRequest(
        conversation_id=conversation_id,
        turn_id=turn_id,
        timeout_ms=int(min(timeout_s, 300) * 1000),
    )


class MemsvcError(Exception):
    """A failed call: the status code, memsvc's stable reason, each bad field, and how long
    to wait before retrying (None: not a transient failure)."""

    def __init__(self, rpc_error: grpc.RpcError) -> None:
        self.code: grpc.StatusCode = rpc_error.code()
        self.message: str = rpc_error.details() or ""
        self.reason = ""
        self.field_violations: list[tuple[str, str]] = []
        self.retry_after_s: float | None = None
        status = rpc_status.from_call(rpc_error)  # type: ignore[arg-type]
        for detail in status.details if status is not None else ():
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                self.field_violations += [(v.field, v.description) for v in bad.field_violations]
            elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                self.reason = info.reason
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                self.retry_after_s = retry.retry_delay.ToMilliseconds() / 1000
        super().__init__(
            f"{self.code.name}{f' ({self.reason})' if self.reason else ''}: {self.message}"
        )


class RefusedEvents(ValueError):
    """An append that memsvc answered, refusing some events: their conversations were not
    written (nothing half-written). `errors` are memsvc's, each message naming the field
    (`events[2].payload: longer than ...`)."""

    def __init__(self, what: str, errors: Sequence[pb.RecordError]) -> None:
        self.errors = list(errors)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"memsvc refused the {what}: {errors[0].message}{more}")


def written(reply: pb.AppendEventsResponse, what: str = "events") -> pb.AppendEventsResponse:
    """The reply of an append whose every event was written; else RefusedEvents. Adapters
    call it: a refused write is never dropped silently."""
    if reply.errors:
        raise RefusedEvents(what, reply.errors)
    return reply


def new_idempotency_key() -> str:
    """A fresh key for one write (AppendEventsRequest.idempotency_key)."""
    return uuid.uuid4().hex


def append_request(
    events: Sequence[pb.MemoryEvent],
    assign_turn_ids: bool,
    idempotency_key: str | None,
    expected_last_turn: Mapping[str, int] | None = None,
) -> pb.AppendEventsRequest:
    return pb.AppendEventsRequest(
        events=events,
        assign_turn_ids=assign_turn_ids,
        idempotency_key=idempotency_key or "",
        expected_last_turn=dict(expected_last_turn or {}),
    )


# What a pop's reply may hold: this client receives up to 64 MiB (channel_options), so it
# pops any turn the server accepted.
POP_REPLY_BYTES = 64 * 1024 * 1024


def pop_request(
    conversation_id: str, count: int, idempotency_key: str | None
) -> pb.PopEventsRequest:
    return pb.PopEventsRequest(
        conversation_id=conversation_id,
        count=count,
        max_reply_bytes=POP_REPLY_BYTES,
        idempotency_key=idempotency_key or new_idempotency_key(),
    )


def retry_safely(exc: MemsvcError, idempotency_key: str | None) -> bool:
    """Whether a keyed write that failed this way may be sent again: its answer was lost
    (the server may have written it; the key makes a second write a no-op)."""
    lost = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
    return bool(idempotency_key) and exc.code in lost


class MemoryClient:
    """memsvc at `target`. `token`: a bearer token when authentication is on; `ca_file`: a
    PEM CA to trust (TLS); `attempts`: tries per call while the server is UNAVAILABLE."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        token: str | None = None,
        ca_file: str | None = None,
        attempts: int = 3,
        timeout_s: float = 60.0,
    ) -> None:
        options = channel_options(attempts)
        creds = credentials(ca_file)
        if creds is not None:
            self.channel = grpc.secure_channel(target, creds, options=options)
        else:
            self.channel = grpc.insecure_channel(target, options=options)
        self.stub = pb_grpc.MemoryServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.metadata = bearer(token)
        self.timeout_s = timeout_s

    def call(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        """Any RPC by name, e.g. call("Reindex", pb.ReindexRequest(all=True))."""
        try:
            return getattr(self.stub, method)(
                request,
                metadata=self.metadata + trace_context(),
                timeout=timeout_s or self.timeout_s,
            )
        except grpc.RpcError as exc:
            raise MemsvcError(exc) from None

    def append(
        self,
        events: Iterable[pb.MemoryEvent],
        *,
        wait: bool = False,
        wait_timeout_s: float = 120,
        assign_turn_ids: bool = False,
        idempotency_key: str | None = None,
        expected_last_turn: Mapping[str, int] | None = None,
    ) -> pb.AppendEventsResponse:
        """Log the events durably; with `wait`, return once the last turn of each
        conversation is searchable (MemsvcError DEADLINE_EXCEEDED if not in time).
        `assign_turn_ids`: the server numbers the events after each conversation's last
        turn (their turn_id unset) and returns the ids in `turn_ids`. `idempotency_key`
        (`new_idempotency_key()`): a call whose answer was lost (DEADLINE_EXCEEDED,
        UNAVAILABLE) is sent once more with it, and the server writes it once.
        `expected_last_turn` (conversation -> its last turn id as `last_turn` read it, -1
        for none): compare-and-append, a conversation whose last turn moved since is not
        written (its events come back in `errors`, reason "last_turn_moved")."""
        events = list(events)
        request = append_request(events, assign_turn_ids, idempotency_key, expected_last_turn)
        try:
            reply: pb.AppendEventsResponse = self.call("AppendEvents", request)
        except MemsvcError as exc:
            if not retry_safely(exc, idempotency_key):
                raise
            reply = self.call("AppendEvents", request)  # the same key: written once
        if wait and not reply.errors:
            for conversation_id, turn_id in last_turns(events, reply.turn_ids).items():
                self.wait_for_indexed(conversation_id, turn_id, wait_timeout_s)
        return reply

    def wait_for_indexed(
        self, conversation_id: str, turn_id: int, timeout_s: float = 120
    ) -> pb.WaitForIndexedResponse:
        reply: pb.WaitForIndexedResponse = self.call(
            "WaitForIndexed",
            wait_request(conversation_id, turn_id, timeout_s),
            timeout_s=min(timeout_s, 300) + 10,
        )
        return reply

    def export(
        self, conversation_id: str, last: int = 0, turns: tuple[int, int] | None = None
    ) -> list[pb.MemoryEvent]:
        """The conversation's live events as appended, in turn order (every page); only the
        newest `last` of them when set (a 0.1 server ignores it and sends all); only those
        with turn ids in `turns` (first, last), when given."""
        events: list[pb.MemoryEvent] = []
        token = ""
        while True:
            reply = self.call(
                "ExportEvents",
                export_request(conversation_id, token, last, turns),
            )
            events += reply.events
            token = reply.next_page_token
            if not token:
                return events

    def search(
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
        reply: pb.EmbedDbResponse = self.call("EmbedDb", request)
        return list(reply.hits)

    def delete(
        self,
        conversation_id: str,
        turns: tuple[int, int] | None = None,
        *,
        defer_store: bool = False,
    ) -> pb.LogicalDeleteBySourceResponse:
        """Delete turns start..end (inclusive), or the whole conversation without `turns`.
        `defer_store`: return once the log holds the deletion (milliseconds), the store
        following in the background; the turns are never returned again either way."""
        request = pb.LogicalDeleteBySourceRequest(
            conversation_id=conversation_id, defer_store=defer_store
        )
        if turns is not None:
            request.turn_range.start, request.turn_range.end = turns
        reply: pb.LogicalDeleteBySourceResponse = self.call("LogicalDeleteBySource", request)
        return reply

    def pop(
        self, conversation_id: str, count: int = 1, *, idempotency_key: str | None = None
    ) -> list[pb.MemoryEvent]:
        """Delete the conversation's newest live turns (`count`, or fewer past 64 MiB) and
        return them as appended, in turn order: [] when it has none (PopEvents: one call,
        and callers popping at once get different turns). Every pop is keyed
        (`idempotency_key`, a fresh one by default): a pop whose answer was lost
        (UNAVAILABLE, retried by gRPC itself, or DEADLINE_EXCEEDED, sent once more here)
        returns the turns the first deleted, never a second turn."""
        request = pop_request(conversation_id, count, idempotency_key)
        try:
            reply: pb.PopEventsResponse = self.call("PopEvents", request)
        except MemsvcError as exc:
            if not retry_safely(exc, request.idempotency_key):
                raise
            reply = self.call("PopEvents", request)  # the same key: popped once
        return list(reply.events)

    def status(self, conversation_ids: Sequence[str] = ()) -> pb.GetIndexStatusResponse:
        reply: pb.GetIndexStatusResponse = self.call(
            "GetIndexStatus", pb.GetIndexStatusRequest(conversation_ids=list(conversation_ids))
        )
        return reply

    def last_turn(self, conversation_id: str) -> int:
        """The conversation's last turn id, deleted turns included (-1: none): what
        `append(expected_last_turn=...)` compares with."""
        rows = self.status([conversation_id]).conversations
        return rows[0].last_appended_turn if rows else -1

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
