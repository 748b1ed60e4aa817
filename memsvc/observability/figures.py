"""A few running totals of this process, read from the metrics registry for callers that
have no Prometheus (GetIndexStatus.figures; the console charts their differences). The
same counts /metrics exports, summed over labels."""

from __future__ import annotations

import time
from dataclasses import dataclass

from memsvc.observability.metrics import CHUNKS_WRITTEN, INDEX_LAG, RPC_BUCKETS, RPC_DURATION

_STARTED = time.monotonic()
# Outcomes of CHUNKS_WRITTEN that put a chunk into the store.
_WRITES = ("upserted", "updated")
_SEARCH = "EmbedDb"


@dataclass(frozen=True)
class Figures:
    uptime_s: float
    chunks_written: int
    searches: int
    search_latency_bounds_s: tuple[float, ...]
    search_latency_counts: tuple[int, ...]  # cumulative, one per (finite) bound
    index_lag_count: int
    index_lag_sum_s: float


def figures() -> Figures:
    written = 0.0
    for metric in CHUNKS_WRITTEN.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.labels.get("outcome") in _WRITES:
                written += sample.value
    buckets: dict[float, float] = {}
    searches = 0.0
    for metric in RPC_DURATION.collect():
        for sample in metric.samples:
            if sample.labels.get("method") != _SEARCH:
                continue
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
            elif sample.name.endswith("_count"):
                searches += sample.value
    lag_count, lag_sum = 0.0, 0.0
    for metric in INDEX_LAG.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count"):
                lag_count += sample.value
            elif sample.name.endswith("_sum"):
                lag_sum += sample.value
    bounds = tuple(float(b) for b in RPC_BUCKETS)
    return Figures(
        uptime_s=time.monotonic() - _STARTED,
        chunks_written=int(written),
        searches=int(searches),
        search_latency_bounds_s=bounds,
        search_latency_counts=tuple(int(buckets.get(b, 0.0)) for b in bounds),
        index_lag_count=int(lag_count),
        index_lag_sum_s=lag_sum,
    )
