"""gRPC status for domain errors: the human message plus google.rpc.Status details in the
`grpc-status-details-bin` trailer, so clients in any language can act without parsing
English:

- INVALID_ARGUMENT: google.rpc.BadRequest, one FieldViolation per bad field (field = the
  proto field path, snake_case, e.g. `records[3].metadata.participants[2]`);
- every other error: google.rpc.ErrorInfo with a stable `reason` (domain "memsvc.v1");
- UNAVAILABLE and RESOURCE_EXHAUSTED: google.rpc.RetryInfo with the delay to wait."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2  # type: ignore[import-untyped]

from memsvc.domain.errors import (
    Busy,
    Cancelled,
    EmbedderUnavailable,
    FailedPrecondition,
    InvalidArgument,
    MemsvcError,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)

DOMAIN = "memsvc.v1"
DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True)
class RichStatus(grpc.Status):  # type: ignore[misc]
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...]


def _pack(message: object) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)  # type: ignore[arg-type]
    return packed


def rich_status(
    code: grpc.StatusCode,
    message: str,
    *,
    violations: Sequence[tuple[str, str]] = (),
    reason: str = "",
    retry_after_s: float | None = None,
) -> RichStatus:
    details = []
    if violations:
        details.append(
            _pack(
                error_details_pb2.BadRequest(
                    field_violations=[
                        error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                        for f, d in violations
                    ]
                )
            )
        )
    if reason:
        details.append(_pack(error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN)))
    metadata: list[tuple[str, str | bytes]] = []
    if retry_after_s is not None:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(int(retry_after_s * 1000))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
        # honoured by gRPC clients with a retry policy
        metadata.append(("grpc-retry-pushback-ms", str(int(retry_after_s * 1000))))
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=message, details=details)
    metadata.insert(0, (DETAILS_KEY, status.SerializeToString()))
    return RichStatus(code, message, tuple(metadata))


def status_of(code: grpc.StatusCode, message: str, exc: BaseException) -> RichStatus:
    """The status for a domain error (or an unexpected one: INTERNAL, no details)."""
    if isinstance(exc, InvalidArgument):
        return rich_status(code, message, violations=[(exc.field, exc.description)])
    if not isinstance(exc, MemsvcError):
        return rich_status(code, message, reason="INTERNAL")
    retry: float | None = None
    if isinstance(exc, ResourceExhausted | EmbedderUnavailable | Busy):
        retry = exc.retry_after_s
    elif isinstance(exc, Unavailable):
        retry = 1.0
    return rich_status(code, message, reason=exc.reason, retry_after_s=retry)


# Domain error -> status code; anything else is INTERNAL (logged, never shown to callers).
CODES: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Cancelled, grpc.StatusCode.CANCELLED),
]


def code_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message a caller sees for `exc`."""
    for kind, code in CODES:
        if isinstance(exc, kind):
            return code, str(exc)
    return grpc.StatusCode.INTERNAL, "internal error; see the server log"
