"""Start-up: only memsvc's files in the data dir change mode, a file removed meanwhile does
not stop the start, start-up errors come before the model loads in one line, and Milvus
Lite keeps its cache beside its file (issues 24 and 37)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from memsvc.app import build_services
from memsvc.embedding.model import Embedder
from memsvc.storage import datadir
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.conftest import make_settings
from tests.support.launch import free_port, start_child, wait_serving
from tests.support.model_cache import cache_with
from tests.support.surfaces import event


def serve_briefly(
    data: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = dict(
        os.environ, MEMSVC_EMBED_MODEL="sentence-transformers/all-MiniLM-L6-v2", **(env or {})
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "memsvc",
            "serve",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--data-dir",
            str(data),
            "--log-format",
            "json",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )


def test_only_memsvc_files_in_the_data_dir_change_mode(tmp_path: Path, embedder: Embedder) -> None:
    data = tmp_path / "data"
    data.mkdir()
    script = data / "backup.sh"
    script.write_text("#!/bin/sh\necho backing up\n")
    script.chmod(0o755)
    notes = data / "notes"
    notes.mkdir(mode=0o755)
    (notes / "readme.txt").write_text("keep me as I am")
    (notes / "readme.txt").chmod(0o644)
    svc = build_services(make_settings(data), embedder=embedder)
    svc.close()
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert stat.S_IMODE(notes.stat().st_mode) == 0o755
    assert stat.S_IMODE((notes / "readme.txt").stat().st_mode) == 0o644
    assert stat.S_IMODE((data / "events.sqlite").stat().st_mode) == 0o600
    assert stat.S_IMODE(data.stat().st_mode) == 0o700


def test_a_file_removed_while_the_data_dir_is_secured_does_not_stop_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression (CI, 2026-11-26): after a kill -9, the old milvus-lite child removed its
    # journal between secure()'s listing and its chmod, and the restart failed with
    # FileNotFoundError. Here the removal happens exactly in between.
    data = tmp_path / "data"
    data.mkdir()
    journal = data / "milvus.db-journal"
    journal.write_text("")
    (data / "events.sqlite").write_text("")
    chmod = Path.chmod

    def removed_first(self: Path, mode: int, *, follow_symlinks: bool = True) -> None:
        if self == journal:
            self.unlink()  # what the other process does
        chmod(self, mode, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(Path, "chmod", removed_first)
    datadir.secure(data)
    assert not journal.exists()
    assert stat.S_IMODE((data / "events.sqlite").stat().st_mode) == 0o600


def test_start_up_errors_come_before_the_model_loads_in_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        metrics = serve_briefly(tmp_path / "a", "--metrics-listen", f"127.0.0.1:{port}")
    assert metrics.returncode != 0
    assert "Traceback" not in metrics.stderr and "embedder_ready" not in metrics.stderr
    assert f"cannot serve metrics on 127.0.0.1:{port}" in metrics.stderr
    assert "a second server needs a port of its own" in metrics.stderr
    # a second process on a data dir in use
    data = tmp_path / "b"
    first_port = free_port()
    first = start_child(data, first_port)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{first_port}") as channel:
            wait_serving(channel, first)
        second = serve_briefly(data, env={"MEMSVC_METRICS_LISTEN": ""})
        assert second.returncode != 0
        assert "Traceback" not in second.stderr and "embedder_ready" not in second.stderr
        assert "in use by memsvc pid" in second.stderr and str(first.pid) in second.stderr
    finally:
        first.terminate()
        first.wait(timeout=60)


def test_15_milvus_lite_keeps_its_cache_beside_its_file(tmp_path: Path) -> None:
    """Start race (issue 37): two Milvus Lite processes of one user shared
    $HOME/.cache/milvus, which each makes at start and removes at exit: started together
    they raced ("create dir failed", "Mmap manager has not been init"), and one stopping
    pulled it from under the other. Each now has a home of its own beside its file."""
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home)}
    servers = []
    for name in ("a", "b"):
        port = free_port()
        servers.append((port, start_child(tmp_path / name, port, env=env)))
    try:
        channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for port, _ in servers]
        for channel, (_, proc) in zip(channels, servers, strict=True):
            wait_serving(channel, proc)
        assert not (home / ".cache" / "milvus").exists()
        assert (tmp_path / "a" / ".milvus-lite" / ".cache" / "milvus").is_dir()
        servers[0][1].terminate()
        servers[0][1].wait(timeout=60)
        stub = pb_grpc.MemoryServiceStub(channels[1])  # type: ignore[no-untyped-call]
        built = stub.BuildIncrementalChunks(
            pb.BuildIncrementalChunksRequest(events=[event("race", 0, "the harbour ferry")])
        )
        assert not stub.UpsertVectorRecords(
            pb.UpsertVectorRecordsRequest(records=built.chunks)
        ).errors
        assert stub.EmbedDb(pb.EmbedDbRequest(query_text="ferry")).hits
        for channel in channels:
            channel.close()
    finally:
        for _, proc in servers:
            proc.terminate()
            proc.wait(timeout=60)


def test_an_invalid_setting_is_one_line_naming_its_variable(tmp_path: Path) -> None:
    # issue 66: five lines of validation output naming `max_turn_chars`
    for env, expected in (
        ({"MEMSVC_MAX_TURN_CHARS": "-5"}, "memsvc: MEMSVC_MAX_TURN_CHARS: Input should be"),
        (
            {"MEMSVC_CHUNK_OVERLAP_TURNS": "9"},
            "memsvc: invalid settings: MEMSVC_CHUNK_OVERLAP_TURNS must be smaller than"
            " MEMSVC_CHUNK_MAX_TURNS",
        ),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "memsvc", "serve", "--data-dir", str(tmp_path / "data")],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2
        assert done.stderr.splitlines() == [done.stderr.strip()]  # one line
        assert done.stderr.startswith(expected), done.stderr


PHASES = [
    "opening the event log",
    "loading the model",
    "timing the model's runtimes on this machine (once per machine)",
    "opening the vector store",
    "cleaning the log's turns in a new text form (once)",
    "checking the store against the log",
]


def test_a_starting_server_says_what_it_is_doing(tmp_path: Path, embedder: Embedder) -> None:
    """Issue 66: a first start took 98 s and only said "starting": a call before it serves
    is told the phase (UNAVAILABLE's message), and so is `/readyz` (its body)."""
    port, metrics_port = free_port(), free_port()
    # a cache of its own, with the session's export but no timings: this start loads the
    # model in full and times its runtimes (a start that exports: test_operations.py)
    cache = cache_with(tmp_path / "cache")
    proc = start_child(
        tmp_path / "data",
        port,
        "--metrics-listen",
        f"127.0.0.1:{metrics_port}",
        env={"MEMSVC_MODEL_CACHE_DIR": str(cache), "MEMSVC_TUNE_REPEATS": "2"},
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]
    said: list[str] = []
    ready_said: list[str] = []
    try:
        while True:
            try:
                stub.GetIndexStatus(pb.GetIndexStatusRequest(page_size=1), timeout=5)
                break
            except grpc.RpcError as exc:
                if exc.code() is grpc.StatusCode.UNAVAILABLE and "starting up" in (
                    exc.details() or ""
                ):
                    said.append(exc.details() or "")
                assert proc.poll() is None, "the server exited while starting"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=5):
                    pass
            except urllib.error.HTTPError as refused:
                ready_said.append(refused.read().decode())
            except OSError:
                pass  # the metrics port is not open yet
            time.sleep(0.05)
        wait_serving(channel, proc)
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=30)
    phases = [next(p for p in PHASES if s.startswith(f"starting up: {p} (")) for s in said]
    assert "loading the model" in phases and PHASES[2] in phases, said
    assert phases == sorted(phases, key=PHASES.index), said  # in the order a start takes
    assert all(" s into the start)" in s for s in said), said
    assert any(s.startswith("not ready: starting up, ") for s in ready_said), ready_said
