"""Render processes under faults, real processes (memsvc.services.render_processes): a
server whose render process is killed (kill -9) while it indexes stores the chunks a
server without render processes stores; a server killed outright leaves none of its
render processes behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import grpc

from memsvc.transports.grpc.convert import event_to_pb
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.support.conversations import generate
from tests.support.launch import free_port, list_all_chunks, start_child, wait_serving

CONVERSATIONS = [f"r{i}" for i in range(12)]
RENDERING = {"MEMSVC_INDEX_RENDER_PROCESSES": "1", "MEMSVC_INDEX_WORKERS": "3"}


def children(pid: int) -> dict[int, str]:
    """Pid -> command line of each process whose parent is `pid`."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if int(stat[1]) == pid:
            out[int(entry)] = cmdline.decode(errors="replace")
    return out


def render_processes(server: int) -> list[int]:
    return [p for p, cmd in children(server).items() if "--multiprocessing-fork" in cmd]


def multiprocessing_helpers(server: int) -> list[int]:
    """Render processes and multiprocessing's resource tracker."""
    return [p for p, cmd in children(server).items() if "multiprocessing" in cmd]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return stat[0] != "Z"


def load(stub: pb_grpc.MemoryServiceStub) -> dict[str, int]:
    last = {}
    for seed, conv in enumerate(CONVERSATIONS):
        events = generate(conv, seed, sessions=3, turns_per_session=(8, 16))
        stub.AppendEvents(pb.AppendEventsRequest(events=[event_to_pb(e) for e in events]))
        last[conv] = events[-1].turn_id
    return last


def indexed(stub: pb_grpc.MemoryServiceStub, last: dict[str, int]) -> dict[str, list[str]]:
    chunks = {}
    for conv, turn in last.items():
        reply = stub.WaitForIndexed(
            pb.WaitForIndexedRequest(conversation_id=conv, turn_id=turn, timeout_ms=120_000),
            timeout=130,
        )
        assert reply.indexed, conv
        chunks[conv] = sorted(f"{c.chunk_id}\n{c.text}" for c in list_all_chunks(stub, conv))
    return chunks


def serve(data_dir: Path, env: dict[str, str]) -> tuple[grpc.Channel, object]:
    port = free_port()
    proc = start_child(data_dir, port, env=env)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    wait_serving(channel, proc)
    return channel, proc


def test_a_killed_render_process_changes_no_chunk_and_a_killed_server_leaves_none(
    tmp_path: Path,
) -> None:
    channel, proc = serve(tmp_path / "plain", {})
    try:
        expected = indexed(
            pb_grpc.MemoryServiceStub(channel), load(pb_grpc.MemoryServiceStub(channel))
        )  # type: ignore[no-untyped-call]
    finally:
        channel.close()
        proc.terminate()  # type: ignore[attr-defined]
        proc.wait(30)  # type: ignore[attr-defined]

    channel, proc = serve(tmp_path / "rendering", RENDERING)
    server = proc.pid  # type: ignore[attr-defined]
    try:
        stub = pb_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + 60
        while not render_processes(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        killed = render_processes(server)
        assert len(killed) == 1
        last = load(stub)
        os.kill(killed[0], signal.SIGKILL)  # while the appended turns are indexed
        assert indexed(stub, last) == expected
        again = render_processes(server)
        assert again and killed[0] not in again  # a new one took over

        helpers = multiprocessing_helpers(server)
        assert set(again) < set(helpers)  # the resource tracker too
        os.kill(server, signal.SIGKILL)
        proc.wait(30)  # type: ignore[attr-defined]
        deadline = time.monotonic() + 60
        while any(alive(p) for p in helpers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in helpers if alive(p)], "processes outlived the server"
    finally:
        channel.close()
        if proc.poll() is None:  # type: ignore[attr-defined]
            proc.kill()  # type: ignore[attr-defined]
            proc.wait(30)  # type: ignore[attr-defined]
