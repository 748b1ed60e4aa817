"""Start `memsvc serve` in a child process on a loopback port, and client helpers
(benchmarks and tests)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# `open_files`: the child lowers its own limit before memsvc runs. (A preexec_fn would
# run between fork and exec in a copy of a test process whose gRPC threads are restarted
# after the fork; one aborted there on a closed epoll descriptor, grpc/grpc#43157.)
_WITH_OPEN_FILES = (
    "import resource, runpy, sys; n = int(sys.argv.pop(1));"
    " resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); sys.argv[0] = 'memsvc';"
    " runpy.run_module('memsvc', run_name='__main__', alter_sys=True)"
)


def start_child(
    data_dir: Path,
    port: int,
    *extra: str,
    env: dict[str, str] | None = None,
    open_files: int | None = None,
) -> subprocess.Popen[bytes]:
    """`memsvc serve` in a child process; `open_files`: its hard limit on open files."""
    env = {**os.environ, **(env or {})}
    env.setdefault("MEMSVC_EMBED_MODEL", "sentence-transformers/all-MiniLM-L6-v2")
    env.setdefault("TQDM_DISABLE", "1")
    env.setdefault("MEMSVC_METRICS_LISTEN", "")  # tests run servers side by side
    entry = ["-m", "memsvc"] if open_files is None else ["-c", _WITH_OPEN_FILES, str(open_files)]
    return subprocess.Popen(
        [
            sys.executable,
            *entry,
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


def wait_serving(
    channel: grpc.Channel, proc: subprocess.Popen[bytes], timeout_s: float = 180
) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
            if status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("server did not become ready")
        time.sleep(0.3)


@contextmanager
def running_server(
    data_dir: Path, *extra: str, env: dict[str, str] | None = None, port: int = 0
) -> Iterator[tuple[pb_grpc.MemoryServiceStub, int]]:
    """Yields a stub once the child is SERVING (on `port`, or a free one), and its pid."""
    port = port or free_port()
    proc = start_child(data_dir, port, *extra, env=env)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        wait_serving(channel, proc)
        yield pb_grpc.MemoryServiceStub(channel), proc.pid  # type: ignore[no-untyped-call]
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=30)


def list_all_chunks(stub: pb_grpc.MemoryServiceStub, conversation_id: str) -> list[pb.ChunkRecord]:
    """Every live chunk of a conversation, following ListChunks pages."""
    out: list[pb.ChunkRecord] = []
    token = ""
    while True:
        page = stub.ListChunks(
            pb.ListChunksRequest(conversation_id=conversation_id, page_size=1000, page_token=token)
        )
        out += list(page.chunks)
        token = page.next_page_token
        if not token:
            return out
