"""The current call's deadline, for work deep below the transport that waits on a remote
server: it gives up in time for the caller to hear why (a contextvar set per call)."""

from __future__ import annotations

import contextvars
import time

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "memsvc_deadline", default=None
)


def set_remaining(seconds: float | None) -> contextvars.Token[float | None]:
    """The call has `seconds` left (None: no deadline)."""
    return _DEADLINE.set(None if seconds is None else time.monotonic() + seconds)


def reset(token: contextvars.Token[float | None]) -> None:
    _DEADLINE.reset(token)


def remaining() -> float | None:
    """Seconds the current call has left; None when it has no deadline."""
    at = _DEADLINE.get()
    return None if at is None else at - time.monotonic()
