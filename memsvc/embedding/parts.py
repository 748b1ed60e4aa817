"""Parts of a text pooled from the forward pass that embeds the whole text (late chunking).

A window of short chat turns is embedded as one text; narrowing a hit to its turns nearest
the query (memsvc.services.narrowing) needs a vector per turn. Embedding each turn again
would cost 1.3-1.5x the ingest time on chat-shaped data; the mean of the window's own
token states over a turn's tokens costs no model run, and keeps the window's context in
each turn's vector (LoCoMo dev within 20 turns: 0.816 against 0.803 for the turns' own
vectors, open-domain 0.491 against 0.456; benchmarks/archive/2026-11-27.md). The mean is
taken whatever the model's own pooling (CLS or mean): a part has no CLS token of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pool_parts(
    states: np.ndarray, offsets: Sequence[tuple[int, int]], starts: Sequence[int]
) -> np.ndarray | None:
    """The L2-normalised mean token state of each part of one text: part i spans the
    characters from starts[i] to the next start (the last, to the end). `states`: the
    text's token states (padding after its tokens is ignored); `offsets`: each token's
    character span, (0, 0) for special tokens. None when a part has no token left (the
    token limit cut it off): such a text is not split into parts."""
    begins = np.fromiter((a for a, _ in offsets), dtype=np.int64, count=len(offsets))
    ends = np.fromiter((b for _, b in offsets), dtype=np.int64, count=len(offsets))
    real = ends > begins
    bounds = [*starts, np.iinfo(np.int64).max]
    vectors = []
    for i in range(len(starts)):
        mask = real & (begins >= bounds[i]) & (begins < bounds[i + 1])
        if not mask.any():
            return None
        v = states[: len(offsets)][mask].mean(axis=0)
        norm = float(np.linalg.norm(v))
        if norm == 0.0:
            return None
        vectors.append(v / norm)
    return np.stack(vectors).astype(np.float32)
