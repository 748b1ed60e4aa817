"""What a request must be before a handler sees it: decodable as its method's message, and
within the count limits of memsvc.transports.wire (checked on its bytes, before decoding).
Anything else is the caller's error, INVALID_ARGUMENT naming the field, not gRPC's default
INTERNAL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias

import grpc

from memsvc.transports.grpc.status import rich_status
from memsvc.transports.wire import refusal_of_bytes

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


class _Undecodable:
    def __init__(self, error: Exception) -> None:
        self.error = error


class _TooMany:
    def __init__(self, field: str, why: str) -> None:
        self.field = field
        self.why = why


class DecodeGuard(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """A request that does not decode (invalid UTF-8 in a string field, a malformed
    message) is the caller's error, INVALID_ARGUMENT, not gRPC's default INTERNAL; and one
    with too many items is refused from its bytes, before it is decoded (memsvc.transports.wire)."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler: Any = continuation(details)  # a namedtuple at run time (_replace)
        if handler is None or not handler.unary_unary or handler.request_deserializer is None:
            return handler  # type: ignore[no-any-return]
        decode = handler.request_deserializer
        behavior = handler.unary_unary
        method = details.method.rpartition("/")[2]

        def safe_decode(data: bytes) -> Any:
            refused = refusal_of_bytes(method, data)
            if refused is not None:
                return _TooMany(*refused)
            try:
                return decode(data)
            except Exception as exc:
                return _Undecodable(exc)

        def checked(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, _TooMany):
                context.abort_with_status(
                    rich_status(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"{request.field}: {request.why}",
                        violations=[(request.field, request.why)],
                    )
                )
            if isinstance(request, _Undecodable):
                description = (
                    "does not decode as the method's message (invalid UTF-8 in a string"
                    f" field, or a malformed message): {request.error}"[:500]
                )
                context.abort_with_status(
                    rich_status(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"request: {description}",
                        violations=[("request", description)],
                    )
                )
            return behavior(request, context)

        replaced: Handler = handler._replace(request_deserializer=safe_decode, unary_unary=checked)
        return replaced
