"""Shared benchmark helpers: a server in its own process, LoCoMo ingestion over the RPCs."""

from __future__ import annotations

import atexit
import os
import platform
import shutil
import tempfile

# Before anything imports tqdm: no progress bars from FlagEmbedding in benchmark output.
os.environ.setdefault("TQDM_DISABLE", "1")
from collections.abc import Sequence
from pathlib import Path

from memsvc.domain.types import MemoryEvent
from memsvc.transports.grpc.convert import event_to_pb as to_pb
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EVAL = ROOT.parent / "shared" / "eval" / "locomo-dev.json"


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def ingest(
    stub: pb_grpc.MemoryServiceStub, events: Sequence[MemoryEvent], batch_turns: int
) -> tuple[int, int]:
    """Build + Upsert in calls of `batch_turns` turns; returns (chunks upserted, calls)."""
    upserted = calls = 0
    for i in range(0, len(events), batch_turns):
        built = stub.BuildIncrementalChunks(
            pb.BuildIncrementalChunksRequest(events=[to_pb(e) for e in events[i : i + batch_turns]])
        )
        res = stub.UpsertVectorRecords(pb.UpsertVectorRecordsRequest(records=built.chunks))
        if res.errors:
            raise RuntimeError(f"upsert errors: {list(res.errors)[:3]}")
        upserted += res.upserted + res.updated
        calls += 1
    return upserted, calls


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def scratch_dir(prefix: str) -> Path:
    """A temporary directory removed when the benchmark exits (a bench-perf run writes
    ~900 MB: a 100,000-chunk store and three servers' data)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path
