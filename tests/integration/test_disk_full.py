"""A full disk, a real one (tmpfs): writes are refused whole as DISK_FULL, reads answer,
and writes and indexing resume by themselves (issues 24 and 37)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memsvc.transports.grpc.convert import event_to_pb
from memsvc.transports.grpc.server import WRITES_HEALTH
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.conftest import EN_TURNS, conversation, turn
from tests.support.launch import free_port, start_child, wait_serving
from tests.support.surfaces import event, reason


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real filesystem of 48 MiB (tmpfs) for the data dir."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], capture_output=True
    )
    assert done.returncode == 0, f"this test mounts a tmpfs (needs root): {done.stderr!r}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path) -> Path:
    """A file that takes every byte left: MiB by MiB, then page by page."""
    filler = path / "filler"
    with filler.open("wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass
        os.fsync(f.fileno())
    return filler


def test_a_full_disk_is_disk_full_and_writes_resume_by_themselves(small_disk: Path) -> None:
    data = small_disk / "data"
    port = free_port()
    proc = start_child(data, port)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, proc)
            stub = pb_grpc.MemoryServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            stub.AppendEvents(
                pb.AppendEventsRequest(
                    events=[event_to_pb(e) for e in conversation("df", EN_TURNS)]
                )
            )
            filler = fill(small_disk)
            long_text = "The harbor ferry schedule changed again this week. " * 200  # ~10 KB
            big = [event_to_pb(turn("df", 6 + i, long_text)) for i in range(6)]
            with pytest.raises(grpc.RpcError) as err:
                stub.AppendEvents(pb.AppendEventsRequest(events=big), timeout=60)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert reason(err.value) == "DISK_FULL"
            assert ("grpc-retry-pushback-ms", "5000") in (err.value.trailing_metadata() or ())
            writes = health_pb2.HealthCheckRequest(service=WRITES_HEALTH)
            assert health.Check(writes).status == health_pb2.HealthCheckResponse.NOT_SERVING
            assert (
                health.Check(health_pb2.HealthCheckRequest()).status
                == health_pb2.HealthCheckResponse.SERVING
            )
            status = stub.GetIndexStatus(pb.GetIndexStatusRequest(conversation_ids=["df"]))
            assert status.conversations[0].last_appended_turn == 5  # reads still answer
            filler.unlink()
            deadline = time.monotonic() + 60
            while health.Check(writes).status != health_pb2.HealthCheckResponse.SERVING:
                assert time.monotonic() < deadline, "writes did not resume"
                time.sleep(0.2)
            assert stub.AppendEvents(pb.AppendEventsRequest(events=big), timeout=60).accepted == 6
            # and the worker indexes again: 60 KB of long turns (parts of 256 tokens each)
            waited = stub.WaitForIndexed(
                pb.WaitForIndexedRequest(conversation_id="df", turn_id=11, timeout_ms=300_000),
                timeout=310,
            )
            assert waited.indexed, waited.status
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_14_an_append_the_disk_cannot_hold_is_disk_full(small_disk: Path) -> None:
    """Leftover (issue 37): a full disk made AppendEvents INTERNAL when it struck inside
    an append's transaction (SQLite rolls the transaction back, and the savepoint's own
    rollback then failed with another error): it is RESOURCE_EXHAUSTED DISK_FULL."""
    data = small_disk / "data"
    port = free_port()
    proc = start_child(data, port)
    try:
        with grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]
        ) as channel:
            wait_serving(channel, proc)
            stub = pb_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]
            stub.AppendEvents(pb.AppendEventsRequest(events=[event("small", 0, "hello")]))
            filler = fill(small_disk)
            text = "The harbor ferry schedule changed again this week. " * 1900  # ~100 KB
            # several conversations of many turns: the transaction spills pages mid-way
            big = [event(f"big{c}", i, text) for c in range(3) for i in range(25)]
            with pytest.raises(grpc.RpcError) as err:
                stub.AppendEvents(pb.AppendEventsRequest(events=big), timeout=120)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
            assert reason(err.value) == "DISK_FULL"
            filler.unlink()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
