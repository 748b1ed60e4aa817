"""What the tests of retrieval share (tests/test_long_turns.py,
test_standing_instructions, test_hit_selection): turns and chats to chunk and search."""

from __future__ import annotations

from memsvc.domain.chunking import StoredTurn
from memsvc.domain.types import MemoryEvent
from tests.conftest import turn


def chars(texts: list[str]) -> list[int]:
    """A stand-in token counter: one token per character."""
    return [len(t) for t in texts]


def stored(i: int, speaker: str, text: str) -> StoredTurn:
    return StoredTurn(i, speaker, text, f"2026-02-02T10:{i:02d}:00+08:00", tokens=len(text))


def chat(conv: str, n: int) -> list[MemoryEvent]:
    topics = ["hiking", "the ledger", "Biscuit the puppy", "the sprint", "Lake Tahoe", "CSV"]
    return [
        turn(
            conv,
            i,
            f"Turn {i} talks about {topics[i % len(topics)]} again.",
            ts=f"2026-02-{1 + i // 10:02d}T10:{i % 60:02d}:00+00:00",
        )
        for i in range(n)
    ]


def covered(hit: object) -> set[int]:
    """The turns a hit returns: its own list when narrowed, else its chunk's range."""
    if hit.turns:  # type: ignore[attr-defined]
        return set(hit.turns)  # type: ignore[attr-defined]
    r = hit.metadata.turn_range  # type: ignore[attr-defined]
    return set(range(r.start, r.end + 1))
