"""Turns longer than MEMSVC_MAX_TURN_CHARS: refused (the default), or accepted cut short.

An agent that pastes one huge tool output (a 349,000-character log) would otherwise have
that call refused and, with turn ids that then have a gap, every later call too, unless it
handles the error. With MEMSVC_OVERSIZE=truncate the turn is kept up to the limit, ending
with a marker that says how much was cut, and the response lists every truncated turn:
nothing is shortened silently. The log holds the truncated text, so what is accepted is
what is indexed, and a re-send of the same long turn is the same turn again (a duplicate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from enum import StrEnum

from memsvc.domain.types import MemoryEvent, Truncation


class Oversize(StrEnum):
    REFUSE = "refuse"
    TRUNCATE = "truncate"


def marker(original: int, kept: int) -> str:
    return f" [… truncated by memsvc: {original - kept:,} of {original:,} characters cut]"


def truncate(
    events: Sequence[MemoryEvent], max_chars: int
) -> tuple[list[MemoryEvent], list[Truncation]]:
    """The events with every text over `max_chars` cut to fit, marker included, and the
    truncations (field names by position in `events`)."""
    out: list[MemoryEvent] = []
    cut: list[Truncation] = []
    for i, e in enumerate(events):
        if len(e.text) <= max_chars:
            out.append(e)
            continue
        original = len(e.text)
        kept = max_chars - len(marker(original, max_chars))
        kept = max_chars - len(marker(original, kept))  # the marker's own digits
        text = e.text[:kept] + marker(original, kept)
        out.append(replace(e, text=text))
        cut.append(
            Truncation(f"{e.conversation_id}#{e.turn_id}", f"events[{i}].text", original, kept)
        )
    return out, cut
