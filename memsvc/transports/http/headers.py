"""Which of an HTTP caller's headers the bridge copies into gRPC metadata, and which it
drops: a metadata value must be printable ASCII, and the metadata of a call must stay
under gRPC's 8 KiB soft limit (over it a call is refused at random; over 16 KiB always,
as RESOURCE_EXHAUSTED, which an HTTP client reads as 429 and retries forever). So each
copied header is checked first: a malformed or oversized trace header is dropped and
counted (W3C Trace Context: a vendor "MUST ignore" a malformed traceparent, and then the
tracestate), never passed on raw; the call goes on without it.

Limits (bytes): traceparent its W3C form (55 for version 00), tracestate 512 (W3C's own
limit), baggage 4,096 (W3C allows 8,192; half keeps the sum under 8 KiB), authorization
4,096."""

from __future__ import annotations

import re
from collections.abc import Sequence

from memsvc.observability import metrics

TRACE_HEADERS = ("traceparent", "tracestate", "baggage")
MAX_HEADER_BYTES = {"tracestate": 512, "baggage": 4096, "authorization": 4096}

# version-traceid-parentid-flags, lowercase hex; a later version may append fields
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def printable(value: str) -> bool:
    """Printable ASCII only (what gRPC takes in a text metadata value). Starlette decodes
    header bytes as Latin-1, so a byte over 0x7E reads as a character over "~"."""
    return all(" " <= ch <= "~" for ch in value)


def _traceparent(value: str) -> bool:
    found = _TRACEPARENT.fullmatch(value.strip())
    if found is None:
        return False
    version, trace_id, parent_id, _, rest = found.groups()
    return (
        version != "ff"
        and (version != "00" or rest is None)
        and trace_id != "0" * 32
        and parent_id != "0" * 16
    )


def acceptable(name: str, value: str) -> bool:
    """Whether this header's value may be copied into metadata."""
    if not printable(value):
        return False
    if name == "traceparent":
        return _traceparent(value)
    return len(value) <= MAX_HEADER_BYTES.get(name, 0)


def kept(name: str, values: Sequence[str]) -> list[str]:
    """The values of `name` that may be copied; the others are dropped and counted."""
    good = [v for v in values if acceptable(name, v)]
    if len(good) < len(values):
        metrics.HTTP_HEADERS_DROPPED.labels(name).inc(len(values) - len(good))
    return good


def trace_metadata(headers: dict[str, list[str]]) -> list[tuple[str, str]]:
    """The caller's trace context to continue (the first value of each header): a
    tracestate without a valid traceparent is dropped with it (W3C Trace Context 3.3)."""
    out: list[tuple[str, str]] = []
    for name in TRACE_HEADERS:
        first = headers.get(name, [])[:1]
        good = kept(name, first)
        if name == "tracestate" and good and not any(k == "traceparent" for k, _ in out):
            metrics.HTTP_HEADERS_DROPPED.labels(name).inc()
            good = []
        out += [(name, v) for v in good]
    return out
