"""The current call's deadline, for work deep below the transport that waits on a remote
server: it gives up in time for the caller to hear why (a contextvar set per call)."""

from __future__ import annotations

import contextvars
import time

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "memsvc_deadline", default=None
)


# gRPC reports a call without a deadline as ~10^11 s left: beyond this, no deadline (and
# no wait whose time-out overflows the platform's time_t).
NO_DEADLINE_BEYOND_S = 10 * 365 * 86_400


def set_remaining(seconds: float | None) -> contextvars.Token[float | None]:
    """The call has `seconds` left (None, or more than ten years: no deadline)."""
    if seconds is None or seconds > NO_DEADLINE_BEYOND_S:
        return _DEADLINE.set(None)
    return _DEADLINE.set(time.monotonic() + seconds)


def reset(token: contextvars.Token[float | None]) -> None:
    _DEADLINE.reset(token)


def remaining() -> float | None:
    """Seconds the current call has left; None when it has no deadline."""
    at = _DEADLINE.get()
    return None if at is None else at - time.monotonic()


def bounded(limit_s: float, margin_s: float = 0.2) -> float:
    """At most `limit_s`, and no longer than the current call has left (less a margin to
    answer in): how long a call may wait for something."""
    left = remaining()
    return limit_s if left is None else max(0.0, min(limit_s, left - margin_s))
