"""Every MemoryService RPC over HTTP in the Connect protocol (unary; JSON or binary):
`POST /memsvc.v1.MemoryService/EmbedDb` with `Content-Type: application/json` and the
proto3 JSON mapping, so `curl` works and connect-es clients call it directly.

A bridge, not a second server: each request is forwarded over a private in-process channel
to the gRPC server of the same process, with the caller's `Authorization` header, so auth,
validation, limits, admission control and metrics are the gRPC surface's own (the
`transport` label says `http`). Connect's unary protocol is a few rules (codec by content
type, `Connect-Timeout-Ms`, an error JSON with google.rpc details) that these ~150 lines
follow; the `connectrpc` runtime on PyPI would need its own protobuf runtime and a code
generator for messages we already have as google.protobuf classes."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import anyio.to_thread
import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from memsvc.domain.limits import MAX_REQUEST_BYTES
from memsvc.transports.http import headers, json_body
from memsvc.transports.http.hosts import HostCheck, HostPolicy
from memsvc.transports.wire import refusal_of_bytes, refusal_of_json
from memsvc.v1 import memory_pb2 as pb

SERVICE = "memsvc.v1.MemoryService"
TRANSPORT_KEY = "x-memsvc-transport"
DEFAULT_TIMEOUT_S = 600.0

# Connect's codes and their HTTP statuses (connectrpc.com/docs/protocol#error-codes).
HTTP_STATUS = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}


# (code, message, ErrorInfo reason) of a call refused from its headers alone
Refusal = tuple[grpc.StatusCode, str, str]
# (method, Authorization values) -> a refusal, or None to go on
Gate = Callable[[str, list[str]], Refusal | None]


@dataclass(frozen=True)
class Method:
    name: str
    request: type[Message]
    call: Callable[..., Any]


def _methods(channel: grpc.Channel) -> dict[str, Method]:
    methods = {}
    for m in pb.DESCRIPTOR.services_by_name["MemoryService"].methods:
        request: type[Message] = getattr(pb, m.input_type.name)
        response: type[Message] = getattr(pb, m.output_type.name)
        call = channel.unary_unary(
            f"/{SERVICE}/{m.name}",
            request_serializer=request.SerializeToString,
            response_deserializer=response.FromString,
        )
        methods[m.name] = Method(m.name, request, call)
    return methods


def _error(code: grpc.StatusCode, message: str, details: Sequence[dict[str, str]] = ()) -> Response:
    body: dict[str, Any] = {"code": code.name.lower(), "message": message}
    if details:
        body["details"] = list(details)
    return Response(json.dumps(body), status_code=HTTP_STATUS[code], media_type="application/json")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")  # Connect: unpadded base64


def _rpc_error(exc: grpc.RpcError) -> Response:
    code, message = exc.code(), exc.details() or ""
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    details = [
        {"type": d.type_url.rpartition("/")[2], "value": _b64(d.value)}
        for d in (status.details if status is not None else ())
    ]
    response = _error(code, message, details)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
        for item in exc.trailing_metadata() or ():
            if item.key == "grpc-retry-pushback-ms":
                response.headers["retry-after"] = str(max(1, round(int(item.value) / 1000)))
    return response


def _ascii_number(text: str, digits: int) -> int | None:
    """A header's value as 1 to `digits` ASCII digits, else None. str.isdigit() also takes
    "²" or "١٢" (which int() refuses or reads): headers are parsed strictly."""
    if 0 < len(text) <= digits and all("0" <= ch <= "9" for ch in text):
        return int(text)
    return None


def _timeout(request: Request) -> float | None:
    """Connect-Timeout-Ms (1 to 10 ASCII digits); absent = the default; None = malformed."""
    raw = request.headers.get("connect-timeout-ms")
    if raw is None:
        return DEFAULT_TIMEOUT_S
    ms = _ascii_number(raw.strip(), 10)
    return ms / 1000 if ms else None


def _denied(denial: Refusal) -> Response:
    code, message, reason = denial
    info = error_details_pb2.ErrorInfo(reason=reason, domain="memsvc.v1")
    return _error(
        code,
        message,
        [{"type": "google.rpc.ErrorInfo", "value": _b64(info.SerializeToString())}],
    )


def _invalid(field: str, why: str) -> Response:
    """INVALID_ARGUMENT naming the field, with the BadRequest detail gRPC callers get."""
    violation = error_details_pb2.BadRequest.FieldViolation(field=field, description=why)
    detail = error_details_pb2.BadRequest(field_violations=[violation])
    return _error(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"{field}: {why}",
        [{"type": "google.rpc.BadRequest", "value": _b64(detail.SerializeToString())}],
    )


async def _read_body(request: Request, max_body: int) -> bytes | None:
    """The body, or None past `max_body` (read no further than that)."""
    declared = _ascii_number(request.headers.get("content-length", "").strip(), 20)
    if declared is not None and declared > max_body:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _decode(
    method: Method, kind: str, body: bytes
) -> tuple[Message, tuple[str, str] | None] | Response:
    """The request message and any count refusal (field, why), or the error response for a
    body that does not decode: INVALID_ARGUMENT, whatever the body (never a 500)."""
    message = method.request()
    try:
        if kind == "application/json":
            parsed = json_body.decoded(body)
            refused = refusal_of_json(method.name, parsed)
            if refused is None:
                json_format.ParseDict(parsed, message)
        else:
            refused = refusal_of_bytes(method.name, body)
            if refused is None:
                message.ParseFromString(body)
    except (json_format.ParseError, DecodeError, UnicodeDecodeError, ValueError) as exc:
        return _error(grpc.StatusCode.INVALID_ARGUMENT, f"request: {exc}")
    except RecursionError:  # protobuf's own nesting limit (binary), past any check of ours
        return _error(grpc.StatusCode.INVALID_ARGUMENT, "request: nested too deeply")
    return message, refused


# What a browser may send and read across origins: Connect's own headers and the token
# (connectrpc.com/docs/cors); no credentials mode, since tokens travel in a header.
CORS_ALLOW_HEADERS = [
    "authorization",
    "content-type",
    "connect-protocol-version",
    "connect-timeout-ms",
    "x-user-agent",
    *headers.TRACE_HEADERS,
]
CORS_EXPOSE_HEADERS = ["retry-after", "content-length"]
CORS_MAX_AGE_S = 7200


def connect_app(
    channel: grpc.Channel,
    gate: Gate | None = None,
    max_body: int = MAX_REQUEST_BYTES,
    hosts: HostPolicy | None = None,
    pages: Sequence[BaseRoute] = (),
) -> Starlette:
    """The Connect endpoints, forwarding to the gRPC server behind `channel`. `gate`, when
    authentication is on, refuses a call from its headers before its body is read (as the
    gRPC server refuses one before decoding it). `hosts`: which Host and Origin headers are
    answered, and the browser origins that may call across origins (CORS: preflights
    answered, headers exposed; none by default). `pages`: GET routes served beside the API
    (the console)."""
    hosts = hosts or HostPolicy()
    methods = _methods(channel)

    async def handle(request: Request) -> Response:
        method = methods.get(request.path_params["method"])
        if method is None:
            return _error(grpc.StatusCode.UNIMPLEMENTED, f"no method {request.url.path}")
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind not in ("application/json", "application/proto"):
            return Response(
                status_code=415, headers={"accept-post": "application/json, application/proto"}
            )
        if request.headers.get("content-encoding", "identity") != "identity":
            return _error(grpc.StatusCode.UNIMPLEMENTED, "content-encoding: identity only")
        timeout = _timeout(request)
        if timeout is None:
            return _error(
                grpc.StatusCode.INVALID_ARGUMENT,
                "connect-timeout-ms: must be 1 to 10 ASCII digits (milliseconds)",
            )
        authorization = request.headers.getlist("authorization")
        if gate is not None:
            denial = gate(method.name, authorization)
            if denial is not None:
                return _denied(denial)
        body = await _read_body(request, max_body)
        if body is None:
            return _error(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"request: over {max_body // (1024 * 1024)} MiB (MEMSVC_MAX_REQUEST_MB):"
                " split the events over several calls",
            )
        # decoding a 16 MiB body takes a second: off the event loop
        decoded = await anyio.to_thread.run_sync(_decode, method, kind, body)
        if isinstance(decoded, Response):
            return decoded
        message, refused = decoded
        if refused is not None:
            field, why = refused
            return _invalid(field, why)
        # every value (two are refused as ambiguous, as over gRPC) that metadata can carry:
        # the gate has refused any other when tokens are on; off, the server ignores them
        metadata = [(TRANSPORT_KEY, "http")]
        metadata += [("authorization", v) for v in headers.kept("authorization", authorization)]
        # the caller's trace continues through the bridge (W3C Trace Context, and baggage)
        metadata += headers.trace_metadata(
            {k: request.headers.getlist(k) for k in headers.TRACE_HEADERS}
        )
        try:
            reply = await anyio.to_thread.run_sync(
                lambda: method.call(message, metadata=metadata, timeout=timeout)
            )
        except grpc.RpcError as exc:
            return _rpc_error(exc)
        if kind == "application/json":
            # every field, zeros included (a turn range starting at 0 has its start), and
            # text as written (not \u escapes)
            return Response(
                json_format.MessageToJson(
                    reply, always_print_fields_with_no_presence=True, ensure_ascii=False
                ),
                media_type="application/json",
            )
        return Response(reply.SerializeToString(), media_type="application/proto")

    # outermost first: a refused Host or Origin meets no handler, CORS preflight included
    middleware = [Middleware(HostCheck, policy=hosts)]
    if hosts.cors_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(hosts.cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=CORS_ALLOW_HEADERS,
                expose_headers=CORS_EXPOSE_HEADERS,
                allow_credentials=False,
                max_age=CORS_MAX_AGE_S,
            )
        )
    description = (resources.files("memsvc.v1") / "openapi.json").read_bytes()

    async def openapi(_: Request) -> Response:
        """The OpenAPI 3.1 description, generated from the proto (make proto)."""
        return Response(description, media_type="application/json")

    return Starlette(
        routes=[
            Route(f"/{SERVICE}/{{method}}", handle, methods=["POST"]),
            Route("/openapi.json", openapi, methods=["GET"]),
            *pages,
        ],
        middleware=middleware,
    )
