"""Domain errors; the gRPC layer maps each to a status code."""

from __future__ import annotations

from typing import ClassVar


class MemsvcError(Exception):
    """Base class of errors the service reports to callers. `reason` is the stable code
    clients read from the google.rpc.ErrorInfo detail."""

    reason: ClassVar[str] = "ERROR"


class InvalidArgument(MemsvcError):
    """Bad input; `field` names the offending request field (e.g. ``events[2].timestamp``)."""

    reason = "INVALID_FIELD"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.description = message


class FailedPrecondition(MemsvcError):
    """The request is valid but the system is not in a state to serve it."""

    reason = "FAILED_PRECONDITION"


class ReplyTooLarge(FailedPrecondition):
    """What the call would return is over the reply budget the caller stated (or its
    default, which fits a stock gRPC client): nothing was done; the message names the
    field that raises the budget and the bytes needed."""

    reason = "REPLY_TOO_LARGE"


class NotFound(MemsvcError):
    """A named entity does not exist."""

    reason = "NOT_FOUND"


class Unavailable(MemsvcError):
    """A dependency (model, store) is not ready or failed transiently."""

    reason = "UNAVAILABLE"


class Starting(Unavailable):
    """The model and store are still loading."""

    reason = "STARTING"


class EmbedderError(Unavailable):
    """The model failed to encode (the caller's batch is not written)."""

    reason = "MODEL_ERROR"


class EmbedderUnavailable(EmbedderError):
    """A remote embedding server did not answer usefully (down, slow, throttling, or
    answering with vectors of the wrong shape): nothing of the call was written; index
    steps wait for it without counting attempts."""

    reason = "EMBEDDER_UNAVAILABLE"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Busy(Unavailable):
    """Every slot of a kind of call is taken; refused before any work, so the same call
    may be sent again after `retry_after_s` (clients with gRPC's retry policy for
    UNAVAILABLE do so by themselves)."""

    reason = "BUSY"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(f"{message}; nothing was done, retry after {retry_after_s:g}s")
        self.retry_after_s = retry_after_s


class ResourceExhausted(MemsvcError):
    """Too many calls of one kind at once; the caller should retry after `retry_after_s`."""

    reason = "TOO_MANY_CALLS"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(f"{message}; retry after {retry_after_s:g}s")
        self.retry_after_s = retry_after_s


class Cancelled(MemsvcError):
    """The caller went away (deadline passed or call cancelled); the work was stopped."""

    reason = "CALLER_LEFT"


class StoreUnavailable(Unavailable):
    """The vector store cannot be reached; the service keeps trying to reconnect."""

    reason = "STORE_UNAVAILABLE"


class PermissionDenied(MemsvcError):
    """The caller's token may not do this (a conversation outside its prefixes, or an
    admin-only form of the call). `field` names the request field when one is at fault."""

    reason = "PERMISSION_DENIED"

    def __init__(self, message: str, reason: str = "PERMISSION_DENIED", field: str = "") -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.reason = reason  # type: ignore[misc]
        self.field = field


class DiskFull(ResourceExhausted):
    """The disk under the data dir (or the database's) is full: nothing was written."""

    reason = "DISK_FULL"

    def __init__(self, message: str, retry_after_s: float = 5.0) -> None:
        super().__init__(message, retry_after_s)


class LogUnavailable(Unavailable):
    """The event log's database cannot be reached; nothing of the call was written."""

    reason = "LOG_UNAVAILABLE"


class ConversationBusy(Unavailable):
    """Another writer held the conversation for longer than this call could wait (its
    deadline, or MEMSVC_WRITER_WAIT_S): nothing was written; retry."""

    reason = "CONVERSATION_BUSY"


# Reasons a call is refused for who calls (google.rpc.ErrorInfo.reason), beside the error
# classes' own: (status code, when). The transport refuses a token before decoding the
# request (memsvc.transports.grpc.auth); the services refuse what depends on the request
# (memsvc.domain.access).
ACCESS_REASONS: dict[str, tuple[str, str]] = {
    "TOKEN_MISSING": ("UNAUTHENTICATED", "no `authorization: Bearer <token>` was sent"),
    "TOKEN_UNKNOWN": ("UNAUTHENTICATED", "the token is not in the tokens file"),
    "TOKEN_AMBIGUOUS": ("UNAUTHENTICATED", "more than one authorization value was sent"),
    "ROLE_TOO_LOW": ("PERMISSION_DENIED", "the method needs a higher role than the token's"),
    "ADMIN_REQUIRED": (
        "PERMISSION_DENIED",
        "this form of the call needs role admin (deleted text, every conversation, restore)",
    ),
    "CONVERSATION_NOT_ALLOWED": (
        "PERMISSION_DENIED",
        "a conversation outside the prefixes the token is limited to",
    ),
    "PREFIX_LIMITED": (
        "PERMISSION_DENIED",
        "a call on every conversation by a token limited to prefixes",
    ),
}
