"""The scale benchmark's conversations: deterministic, shaped after the dev sets.

Each conversation takes `turns` consecutive turns of one dev conversation, from a random
place: a LoCoMo conversation (short chat turns, median 125 characters), or with
probability `beam_share` a BEAM 100K dev chat (agent work: code, logs, plans; median 1,573
characters, up to 349,000). One word of each turn is swapped for another word of the pool,
so no two conversations hold the same text (a store of copies would flatter BM25 and the
embedding cache). Conversation ids spread over 50 tenant prefixes: `t07/u0001234`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from evals import beam, locomo
from memsvc.domain.types import MemoryEvent

TENANTS = 50


@dataclass(frozen=True)
class Pool:
    """The dev sets' conversations as runs of turns, and their questions."""

    runs: list[list[MemoryEvent]]  # LoCoMo first, then BEAM
    beam_from: int  # index of the first BEAM run
    words: list[str]
    questions: list[str]


def load_pool(locomo_file: Path, beam_dir: Path | None) -> Pool:
    convs = locomo.load_locomo(locomo_file)
    runs = [c.events for c in convs]
    questions = [q.question for c in convs for q in c.questions]
    beam_from = len(runs)
    if beam_dir is not None and beam_dir.exists():
        chats = beam.load_beam(beam_dir, list(beam.DEV_CHATS))
        runs += [c.events for c in chats]
        questions += [q.question for c in chats for q in c.questions]
    words = sorted({w for run in runs for e in run for w in e.text.split()[:200] if w.isalpha()})
    return Pool(runs, beam_from, words, questions)


def conversation_id(n: int) -> str:
    return f"t{n % TENANTS:02d}/u{n:07d}"


def conversation(pool: Pool, n: int, turns: int, beam_share: float) -> list[MemoryEvent]:
    """Conversation number `n`: the same turns for the same arguments, on any machine."""
    rng = random.Random(n)
    beam = len(pool.runs) > pool.beam_from and rng.random() < beam_share
    run = (
        pool.runs[rng.randrange(pool.beam_from, len(pool.runs))]
        if beam
        else pool.runs[rng.randrange(pool.beam_from)]
    )
    start = rng.randrange(len(run))
    cid = conversation_id(n)
    events = []
    for turn in range(turns):
        source = run[(start + turn) % len(run)]
        words = source.text.split(" ")
        words[rng.randrange(len(words))] = rng.choice(pool.words)
        events.append(
            MemoryEvent(
                conversation_id=cid,
                turn_id=turn,
                speaker=source.speaker,
                text=" ".join(words),
                timestamp=source.timestamp,
                participants=source.participants,
                speaker_name=source.speaker_name,
            )
        )
    return events


def batches(
    pool: Pool, numbers: Sequence[int], turns: int, beam_share: float, max_bytes: int
) -> Iterator[list[MemoryEvent]]:
    """The conversations `numbers`, cut into AppendEvents calls of at most `max_bytes` of
    text (whole conversations where they fit)."""
    batch: list[MemoryEvent] = []
    size = 0
    for n in numbers:
        for event in conversation(pool, n, turns, beam_share):
            length = len(event.text.encode()) + 200
            if batch and (size + length > max_bytes or len(batch) >= 5000):
                yield batch
                batch, size = [], 0
            batch.append(event)
            size += length
    if batch:
        yield batch
