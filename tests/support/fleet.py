"""A fleet for tests and benchmarks: replicas of `memsvc serve` in child processes sharing
one PostgreSQL database and one Milvus server (milvus-lite's TCP server standing in)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.support.launch import free_port, wait_serving


class MilvusServer:
    """milvus-lite's server on a loopback TCP port (one process), stopped by its pid."""

    def __init__(self, db_file: Path, port: int | None = None) -> None:
        from milvus_lite.server import Server

        self.port = port or free_port()
        self._server = Server(str(db_file), f"127.0.0.1:{self.port}")
        if not self._server.init() or not self._server.start():
            raise RuntimeError("milvus-lite's TCP server did not start")

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._server.stop()

    def emptied(self, db_file: Path) -> MilvusServer:
        """This server stopped and an empty one started on its port: the same URI, back
        without its data (what a Milvus server restarted on a lost volume looks like)."""
        self.stop()
        return MilvusServer(db_file, port=self.port)


@dataclass
class Replica:
    name: str
    data_dir: Path
    port: int
    proc: subprocess.Popen[bytes]
    metrics_port: int | None = None
    channel: grpc.Channel = field(init=False)
    stub: pb_grpc.MemoryServiceStub = field(init=False)

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.MemoryServiceStub(self.channel)  # type: ignore[no-untyped-call]

    def metric(self, family: str, **labels: str) -> float:
        """Sum of a metric's samples with these labels on this replica's /metrics (a replica
        started with metrics=True)."""
        import urllib.request

        assert self.metrics_port is not None, "started without metrics"
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as res:
            lines = res.read().decode().splitlines()
        wanted = [f'{k}="{v}"' for k, v in labels.items()]
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in lines
            if line.startswith((family + " ", family + "{")) and all(w in line for w in wanted)
        )

    def kill(self) -> None:
        """kill -9: no shutdown, no lease handed back."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


def start_replica(
    root: Path, name: str, database_url: str, milvus_uri: str, metrics: bool = False, **env: str
) -> Replica:
    data_dir = root / name
    port = free_port()
    metrics_port = free_port() if metrics else None
    environment = dict(os.environ)
    environment.update(
        MEMSVC_EMBED_MODEL="sentence-transformers/all-MiniLM-L6-v2",
        MEMSVC_DATABASE_URL=database_url,
        MEMSVC_MILVUS_URI=milvus_uri,
        MEMSVC_METRICS_LISTEN=f"127.0.0.1:{metrics_port}" if metrics_port else "",
        TQDM_DISABLE="1",
    )
    environment.update(env)
    root.mkdir(parents=True, exist_ok=True)
    log = (root / f"{name}.log").open("ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memsvc",
            "serve",
            "--listen",
            f"127.0.0.1:{port}",
            "--data-dir",
            str(data_dir),
            "--log-level",
            "WARNING",
            "--log-format",
            "json",
        ],
        env=environment,
        stdout=log,
        stderr=log,
    )
    return Replica(name, data_dir, port, proc, metrics_port)


def start_fleet(
    root: Path, count: int, database_url: str, milvus_uri: str, metrics: bool = False, **env: str
) -> list[Replica]:
    """`count` replicas, started together, each SERVING on return."""
    replicas = [
        start_replica(root, f"r{i}", database_url, milvus_uri, metrics, **env) for i in range(count)
    ]
    try:
        for r in replicas:
            wait_serving(r.channel, r.proc, timeout_s=300)
    except BaseException:
        for r in replicas:
            r.stop()
        raise
    return replicas


def until(condition: object, timeout_s: float, what: str, state: object = lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {what} {state()}")  # type: ignore[operator]
        time.sleep(0.1)
