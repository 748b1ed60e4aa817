"""Ranking algorithms of hybrid search: score and reciprocal-rank fusion of ranked lists,
identical-text deduplication, maximal marginal relevance. Pure functions on (id, score)
lists and stored records."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from memsvc.domain.records import Scored, StoredChunk

RRF_K = 60


# Texts with nothing in common, in several languages and scripts: a model's cosine between
# them is what "unrelated" scores on it, about 0.03 on all-MiniLM-L6-v2 and 0.75 on
# multilingual-e5-small, whose cosines all lie high.
UNRELATED_TEXTS = (
    "where did I put my passport before the trip?",
    "The quarterly budget review moved to Thursday.",
    "我喜欢在周末画日落。",
    "Our cat knocked the plant off the windowsill again.",
    "私の名前は太郎です",
    "Install the package with pip and restart the server.",
    "Меня зовут Алексей, я живу в Казани.",
    "She ran her first marathon in under four hours.",
)


def unrelated_similarity(queries: np.ndarray, passages: np.ndarray) -> float:
    """The median cosine of each UNRELATED_TEXTS query with the other texts' passages."""
    scores = np.asarray(queries, dtype=np.float32) @ np.asarray(passages, dtype=np.float32).T
    return float(np.median(scores[~np.eye(len(scores), dtype=bool)]))


def score_fuse(
    lists: Sequence[Sequence[Scored]],
    weights: Sequence[float],
    floors: Sequence[float] | None = None,
) -> list[Scored]:
    """Weighted sum of each list's scores above its floor (the dense list's: the model's
    unrelated similarity), scaled by that list's best (a list whose best is not above its
    floor adds nothing), over the sum of the weights: best in every list scores 1.0.
    Unlike ranks, scores keep how far apart candidates are: a clear winner in one list is
    not pulled level with the runner-up (LoCoMo dev figures: benchmarks/archive/
    2026-11-25.md). Without the floor, a model whose cosines lie between 0.7 and 0.9
    (multilingual-e5-small) scales every dense candidate to 0.8-1.0, and keyword scores
    decide alone (benchmarks/archive/2026-12-04.md)."""
    total = sum(weights) or 1.0
    scores: dict[str, float] = {}
    raw: dict[str, float] = {}  # the scores as given: the order of those the floor levels
    for i, (ranked, weight) in enumerate(zip(lists, weights, strict=True)):
        floor = floors[i] if floors else 0.0
        best = max((s for _, s in ranked), default=0.0) - floor
        for cid, s in ranked:
            gain = weight * max(0.0, s - floor) / best if best > 0 else 0.0
            scores[cid] = scores.get(cid, 0.0) + gain
            raw[cid] = raw.get(cid, 0.0) + weight * s
    # Candidates at or under every floor all score 0: ordered by their own scores, not by
    # chunk id (which differs between a node and one restored from its export).
    order = sorted(scores, key=lambda cid: (-scores[cid], -raw[cid], cid))
    return [(cid, scores[cid] / total) for cid in order]


def rrf_fuse(lists: Sequence[Sequence[Scored]], weights: Sequence[float]) -> list[Scored]:
    """Reciprocal-rank fusion, normalised so rank 1 in every list scores 1.0."""
    norm = sum(w / (RRF_K + 1) for w in weights) or 1.0
    scores: dict[str, float] = {}
    for ranked, weight in zip(lists, weights, strict=True):
        for rank, (cid, _) in enumerate(ranked, start=1):
            scores[cid] = scores.get(cid, 0.0) + weight / (RRF_K + rank)
    order = sorted(scores, key=lambda cid: (-scores[cid], cid))
    return [(cid, scores[cid] / norm) for cid in order]


def dedup_text(ranked: Sequence[Scored], records: Mapping[str, StoredChunk]) -> list[Scored]:
    """Keep the best-ranked of hits whose text is identical; drop ids without a record
    (removed since the search)."""
    seen: set[str] = set()
    out = []
    for cid, score in ranked:
        stored = records.get(cid)
        if stored is not None and stored.record.text not in seen:
            seen.add(stored.record.text)
            out.append((cid, score))
    return out


def mmr_select(
    ranked: Sequence[Scored], vectors: dict[str, StoredChunk], k: int, lam: float
) -> list[Scored]:
    """Maximal marginal relevance: lam * relevance - (1 - lam) * max similarity to picks.
    Relevance is the score min-max scaled to [0, 1] within the candidate pool."""
    # A chunk removed since the search cannot be diversified against: drop it.
    ranked = [(c, s) for c, s in ranked if vectors.get(c) is not None]
    if not ranked:
        return []
    scores = np.array([s for _, s in ranked], dtype=np.float64)
    span = scores.max() - scores.min() if len(scores) else 0.0
    rel = (scores - scores.min()) / span if span > 0 else np.ones_like(scores)
    mat = np.stack([np.asarray(vectors[c].vector, dtype=np.float32) for c, _ in ranked])
    sims = mat @ mat.T
    chosen: list[int] = []
    left = list(range(len(ranked)))
    while left and len(chosen) < k:
        penalty = sims[np.ix_(left, chosen)].max(axis=1) if chosen else np.zeros(len(left))
        values = lam * rel[left] - (1 - lam) * penalty
        best = left[int(np.argmax(values))]
        chosen.append(best)
        left.remove(best)
    return [ranked[i] for i in chosen]
