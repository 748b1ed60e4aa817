"""What a chunk's vector is made of.

A chunk of several turns is embedded as its text (context prefix and turn lines). A chunk
of one turn stands for that turn: its vector is the normalised sum of the vectors of the
turn's head (its first part, up to `part_tokens`: what a one-vector-per-turn search
embeds) and its gist (its first `gist_tokens`: what the turn is about, usually the
question asked or the rule given). Every part of a turn unit carries that vector: dense
search finds a long turn by what it opens with, keyword search by whichever part holds the
words. On long agent turns this finds more than embedding each part on its own, which
lets a long answer's many parts crowd out the turns that hold the evidence; and the model
runs on two short texts per turn, whatever its length (benchmarks/archive/2026-11-25.md,
Retrieval v3).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from memsvc.domain.chunking import ChunkPolicy, ChunkWindow, TokenCounter

# A token covers at most this many characters in the tokenizers we meet (a long run of
# letters is cut into word pieces): bounds the search for a gist's end.
_MAX_CHARS_PER_TOKEN = 32


# Every part of a long turn has the turn's vector, so the gist of one turn is asked once a
# part, one part after another: counting the whole turn each time was a tenth of an index
# step's CPU on the remote path (a 1,000-part turn counted 1,000 times). Kept for a few turns.
@functools.lru_cache(maxsize=16)
def gist(text: str, tokens: int, count_tokens: TokenCounter) -> str:
    """The start of `text` within `tokens` model tokens, cut at a space when one is near."""
    if len(text) <= tokens or count_tokens([text])[0] <= tokens:
        return text
    lo, hi = 1, min(len(text), tokens * _MAX_CHARS_PER_TOKEN)
    while lo < hi:  # the longest head within the limit
        mid = (lo + hi + 1) // 2
        if count_tokens([text[:mid]])[0] <= tokens:
            lo = mid
        else:
            hi = mid - 1
    space = text.rfind(" ", 0, lo + 1)
    return text[: space if space > lo // 2 else lo].strip()


def vector_texts(
    window: ChunkWindow, policy: ChunkPolicy, count_tokens: TokenCounter
) -> tuple[str, ...] | None:
    """The texts whose vectors make the chunk's: None for the chunk's own text; for a chunk
    of one turn, the turn's head and gist (one text when they are the same)."""
    if len(window.turns) != 1:
        return None
    text = window.turns[0].text
    head = window.head or text
    start = gist(text, policy.gist_tokens, count_tokens)
    return (head,) if start == head else (head, start)


def combine(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """The normalised sum: a unit vector whose inner product with a query ranks like the
    sum of the parts' cosines."""
    total: np.ndarray = np.sum(np.asarray(vectors, dtype=np.float32), axis=0)
    norm = float(np.linalg.norm(total))
    out: np.ndarray = (total / norm if norm > 0 else total).astype(np.float32)
    return out
