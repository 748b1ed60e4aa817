"""Shared benchmark helpers: a server in its own process, LoCoMo ingestion over the RPCs."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memsvc.server import event_to_pb as to_pb
from memsvc.types import MemoryEvent
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_EVAL = ROOT.parent / "shared" / "eval" / "locomo-dev.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


@contextmanager
def running_server(data_dir: Path, *extra: str) -> Iterator[tuple[pb_grpc.MemoryServiceStub, int]]:
    """`memsvc serve` in a child process on a loopback port; yields a stub once SERVING."""
    port = free_port()
    env = dict(
        os.environ,
        MEMSVC_EMBED_MODEL=os.environ.get(
            "MEMSVC_EMBED_MODEL", "sentence-transformers/all-MiniLM-L6-v2"
        ),
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memsvc.cli",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--data-dir",
            str(data_dir),
            "--log-level",
            "WARNING",
            *extra,
        ],
        env=env,
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        health = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 180
        while True:
            try:
                status = health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("server did not become ready")
            time.sleep(0.5)
        yield pb_grpc.MemoryServiceStub(channel), proc.pid
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=30)


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
