"""The MCP surface's way into memsvc: a gRPC client of a running server.

The MCP tools hold no state and no model: every tool call is one or two gRPC calls, made
with the caller's own token, so roles, tenants, limits and validation are exactly the
gRPC surface's. A failed call becomes a `ToolError` whose text an agent can act on: the
status, the stable reason, each bad field (named as the tool names it) and, for a
retryable failure, how long to wait."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status
from mcp.server.mcpserver.exceptions import ToolError

from memsvc.observability import tracing
from memsvc.transports.channel import client_channel
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc

Response = TypeVar("Response")

# How long a token the server accepted (or refused) is trusted by the HTTP front door.
TOKEN_CHECK_TTL_S = 30.0
# A conversation id no caller uses: the token check asks for its status, the cheapest
# call every role may make (a tenant token is refused it, which still proves the token).
PROBE_CONVERSATION = "memsvc-mcp-token-probe"


@dataclass(frozen=True)
class Target:
    """Where memsvc listens and how to reach it."""

    address: str
    ca_file: str = ""
    timeout_s: float = 60.0


def _rename(field: str, renames: Mapping[str, str]) -> str:
    for grpc_name, tool_name in renames.items():
        if field == grpc_name or field.startswith((grpc_name + ".", grpc_name + "[")):
            return tool_name + field[len(grpc_name) :]
    return field


def describe(exc: grpc.RpcError, renames: Mapping[str, str] = {}, target: str = "") -> str:
    """One paragraph for an agent: CODE (REASON): message; each bad field; retry advice."""
    code = exc.code()
    message = exc.details() or ""
    reason = ""
    violations: list[str] = []
    retry_s: float | None = None
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    for detail in status.details if status is not None else ():
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations += [
                f"{_rename(v.field, renames)}: {v.description}" for v in bad.field_violations
            ]
        elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason = info.reason
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_s = retry.retry_delay.ToMilliseconds() / 1000
    if status is None and code == grpc.StatusCode.UNAVAILABLE and target:
        # no status from memsvc at all: the channel never reached it
        reason, message = "MEMSVC_UNREACHABLE", f"cannot reach memsvc at {target} ({message})"
    head = code.name + (f" ({reason})" if reason else "")
    text = f"{head}: " + ("; ".join(violations) if violations else message.rstrip(". "))
    text += "."
    if retry_s is not None:
        text += f" Temporary: retry the same call in {retry_s:g} s."
    elif code == grpc.StatusCode.UNAVAILABLE:
        text += " Temporary: retry the same call in a few seconds."
    return text


class MemoryGateway:
    """memsvc's gRPC stub, called with a per-call bearer token."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._channel = client_channel(target.address, target.ca_file)
        self._stub = pb_grpc.MemoryServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._checked: dict[str, tuple[bool, float]] = {}
        self._mutex = threading.Lock()

    def call(
        self,
        method: Callable[[pb_grpc.MemoryServiceStub], Callable[..., Response]],
        request: Any,
        token: str,
        *,
        renames: Mapping[str, str] = {},
        timeout_s: float | None = None,
    ) -> Response:
        metadata = tracing.outgoing([("authorization", f"Bearer {token}")] if token else [])
        try:
            return method(self._stub)(
                request, metadata=metadata, timeout=timeout_s or self.target.timeout_s
            )
        except grpc.RpcError as exc:
            raise ToolError(describe(exc, renames, self.target.address)) from None

    def token_accepted(self, token: str) -> bool:
        """Whether memsvc accepts this token (an empty one: whether it runs without
        authentication). Raises `ToolError` when memsvc cannot be asked."""
        now = time.monotonic()
        with self._mutex:
            known = self._checked.get(token)
        if known is not None and now - known[1] < TOKEN_CHECK_TTL_S:
            return known[0]
        metadata = [("authorization", f"Bearer {token}")] if token else []
        try:
            self._stub.GetIndexStatus(
                pb.GetIndexStatusRequest(conversation_ids=[PROBE_CONVERSATION]),
                metadata=metadata,
                timeout=10,
            )
            accepted = True
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNAUTHENTICATED:
                accepted = False
            elif code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise ToolError(describe(exc, target=self.target.address)) from None
            else:  # refused for another reason after the token was accepted
                accepted = True
        with self._mutex:
            if len(self._checked) > 10_000:
                self._checked.clear()
            self._checked[token] = (accepted, now)
        return accepted

    def close(self) -> None:
        self._channel.close()
