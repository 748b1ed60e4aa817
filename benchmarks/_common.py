"""Shared benchmark helpers: a server in its own process, LoCoMo ingestion over the RPCs."""

from __future__ import annotations

import atexit
import os
import platform
import shutil
import statistics
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
    """The CPU model first: figures from two machines must be told apart (issue 38)."""
    from memsvc.embedding.tuning import cpu_model, usable_cores

    return (
        f"{cpu_model()} ({platform.machine()}), {usable_cores()} cores,"
        f" Python {platform.python_version()}"
    )


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


class ServerTimes:
    """Where a server's time went between two scrapes of its metrics port: per RPC
    (memsvc_rpc_duration_seconds) and per stage (memsvc_stage_duration_seconds)."""

    def __init__(self, metrics_port: int) -> None:
        self.port = metrics_port
        self.before = self._scrape()

    def _scrape(self) -> dict[tuple[str, ...], tuple[float, float]]:
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        url = f"http://127.0.0.1:{self.port}/metrics"
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        sums: dict[tuple[str, ...], list[float]] = {}
        for family in text_string_to_metric_families(body):
            for s in family.samples:
                if s.name == "memsvc_stage_duration_seconds_sum":
                    key: tuple[str, ...] = ("stage", s.labels["operation"], s.labels["stage"])
                elif s.name == "memsvc_stage_duration_seconds_count":
                    key = ("stage", s.labels["operation"], s.labels["stage"])
                elif s.name in (
                    "memsvc_rpc_duration_seconds_sum",
                    "memsvc_rpc_duration_seconds_count",
                ):
                    key = ("rpc", s.labels["method"])
                else:
                    continue
                slot = sums.setdefault(key, [0.0, 0.0])
                slot[0 if s.name.endswith("_sum") else 1] += s.value
        return {k: (v[0], v[1]) for k, v in sums.items()}

    def since(self, calls: int, operation: str, rpcs: Sequence[str]) -> dict[str, float]:
        """Mean milliseconds per call of each RPC in `rpcs` and of each stage of
        `operation`, over `calls` calls, since this object was made (or last asked)."""
        after = self._scrape()
        keys = [("rpc", m) for m in rpcs] + [("stage", operation, s) for s in STAGES[operation]]
        out = {}
        for key in keys:
            spent = after.get(key, (0.0, 0.0))[0] - self.before.get(key, (0.0, 0.0))[0]
            if spent > 0:
                out[key[-1]] = spent * 1000 / calls
        self.before = after
        return out


def breakdown(runs: Sequence[dict[str, float]]) -> str:
    """Medians over runs of ServerTimes.since's figures, in call order."""
    keys = list(dict.fromkeys(k for r in runs for k in r))
    return ", ".join(f"{k} {statistics.median(r.get(k, 0.0) for r in runs):.2f}" for k in keys)


# memsvc_stage_duration_seconds's stages, in the order a call runs them.
STAGES = {
    "search": ("standing", "embed", "keyword", "dense", "fuse", "read", "verify"),
    "write": ("check", "read", "tokens", "embed", "store", "bookkeep", "settle"),
}


def rss_kib(pid: int) -> int:
    """Resident memory of process `pid`, KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (Milvus Lite's server under memsvc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out
