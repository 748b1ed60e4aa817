"""Regression tests for issue 24 at the process edges: authentication before decoding,
tenants over gRPC, file modes, start-up checks before the model loads, a real full disk,
and the CLI's append."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from memsvc.app import Services, build_services
from memsvc.embedding.model import Embedder
from memsvc.storage import datadir
from memsvc.transports.grpc.auth import TokenTable
from memsvc.transports.grpc.convert import event_to_pb
from memsvc.transports.grpc.server import WRITES_HEALTH, RunningServer, start_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.conftest import EN_TURNS, conversation, make_settings, turn
from tests.support.launch import free_port, start_child, wait_serving

ADMIN = "admin-token-0123456789ab"
READER = "reader-token-0123456789"
ACME_READER = "acme-reader-token-0123456789"
ACME_WRITER = "acme-writer-token-0123456789"


def bearer(*tokens: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {t}") for t in tokens]


def reason(err: grpc.RpcError) -> str:
    from google.rpc import error_details_pb2  # type: ignore[import-untyped]

    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""


@pytest.fixture()
def tenants(services: Services, tmp_path: Path) -> Iterator[grpc.Channel]:
    (tmp_path / "tokens").write_text(
        f"admin {ADMIN}\nreader {READER}\n"
        f"reader {ACME_READER} acme/\nwriter {ACME_WRITER} acme/ shared/\n"
    )
    running = start_server("127.0.0.1:0", tokens=TokenTable(tmp_path / "tokens"))
    running.mark_ready(services)
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield channel
    running.stop(0)


# -- before authentication -------------------------------------------------------------------
def test_a_body_is_not_decoded_before_the_token_is_checked(tenants: grpc.Channel) -> None:
    raw = tenants.unary_unary(
        "/memsvc.v1.MemoryService/PurgeDeleted",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    undecodable = b"\x0a\x02\xff\xfe"  # field 1, two bytes of invalid UTF-8
    # were the body decoded first, these would be INVALID_ARGUMENT
    for metadata, code, why in (
        ([], grpc.StatusCode.UNAUTHENTICATED, "TOKEN_MISSING"),
        (bearer("not-a-token-of-ours-at-all"), grpc.StatusCode.UNAUTHENTICATED, "TOKEN_UNKNOWN"),
        (bearer(READER), grpc.StatusCode.PERMISSION_DENIED, "ROLE_TOO_LOW"),
    ):
        with pytest.raises(grpc.RpcError) as err:
            raw(undecodable, metadata=metadata, timeout=30)
        assert (err.value.code(), reason(err.value)) == (code, why)
    with pytest.raises(grpc.RpcError) as err:
        raw(undecodable, metadata=bearer(ADMIN), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # authenticated: decoded


def test_two_authorization_values_are_refused(tenants: grpc.Channel) -> None:
    stub = pb_grpc.MemoryServiceStub(tenants)
    request = pb.EmbedChunkRequest(query="harbor")
    for tokens in ((READER, ADMIN), (ADMIN, READER), (ADMIN, ADMIN)):
        with pytest.raises(grpc.RpcError) as err:
            stub.EmbedChunk(request, metadata=bearer(*tokens), timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert reason(err.value) == "TOKEN_AMBIGUOUS"
    assert stub.EmbedChunk(request, metadata=bearer(READER), timeout=30).dim == 384


# -- tenants -------------------------------------------------------------------------------
def test_prefix_limited_tokens_over_grpc(services: Services, tenants: grpc.Channel) -> None:
    stub = pb_grpc.MemoryServiceStub(tenants)
    for conv in ("acme/a", "other/b"):
        built = services.ingest.build(conversation(conv, EN_TURNS))
        services.ingest.upsert(built.chunks)
    services.deletion.delete("acme/a", pb.TurnRange(start=0, end=0), [])  # type: ignore[arg-type]

    def denied(call: object, request: object, token: str) -> str:
        with pytest.raises(grpc.RpcError) as err:
            call(request, metadata=bearer(token), timeout=60)  # type: ignore[operator]
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        return reason(err.value)

    other = pb.SearchFilters(conversation_ids=["other/b"])
    assert (
        denied(stub.EmbedDb, pb.EmbedDbRequest(query_text="puppy", filters=other), ACME_READER)
        == "CONVERSATION_NOT_ALLOWED"
    )
    assert (
        denied(stub.ListChunks, pb.ListChunksRequest(conversation_id="other/b"), ACME_READER)
        == "CONVERSATION_NOT_ALLOWED"
    )
    assert (
        denied(
            stub.GetIndexStatus, pb.GetIndexStatusRequest(conversation_ids=["other/b"]), ACME_READER
        )
        == "CONVERSATION_NOT_ALLOWED"
    )
    assert (
        denied(
            stub.WaitForIndexed,
            pb.WaitForIndexedRequest(conversation_id="other/b", turn_id=0),
            ACME_READER,
        )
        == "CONVERSATION_NOT_ALLOWED"
    )
    assert (
        denied(
            stub.LogicalDeleteBySource,
            pb.LogicalDeleteBySourceRequest(conversation_id="other/b"),
            ACME_WRITER,
        )
        == "CONVERSATION_NOT_ALLOWED"
    )
    append_other = pb.AppendEventsRequest(events=[event_to_pb(turn("other/b", 9, "x"))])
    assert denied(stub.AppendEvents, append_other, ACME_WRITER) == "CONVERSATION_NOT_ALLOWED"
    deleted = pb.SearchFilters(conversation_ids=["acme/a"], include_deleted=True)
    assert (
        denied(stub.EmbedDb, pb.EmbedDbRequest(query_text="puppy", filters=deleted), ACME_READER)
        == "ADMIN_REQUIRED"
    )
    # no conversation named: its own conversations only, counts included
    hits = stub.EmbedDb(
        pb.EmbedDbRequest(query_text="puppy Biscuit", top_k=20), metadata=bearer(ACME_READER)
    ).hits
    assert hits and {h.metadata.conversation_id for h in hits} == {"acme/a"}
    status = stub.GetIndexStatus(pb.GetIndexStatusRequest(), metadata=bearer(ACME_READER))
    assert [c.conversation_id for c in status.conversations] == ["acme/a"]
    assert status.total_conversations == 1
    named = stub.GetIndexStatus(
        pb.GetIndexStatusRequest(conversation_ids=["acme/a"]), metadata=bearer(ACME_READER)
    )
    assert named.total_conversations == 1  # never the count of others
    assert denied(stub.EmbedDb, pb.EmbedDbRequest(query_text="puppy"), READER) == "ADMIN_REQUIRED"


# -- files and start-up ---------------------------------------------------------------------
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


# -- a full disk -------------------------------------------------------------------------------
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


# -- the CLI's append -------------------------------------------------------------------------
@pytest.fixture()
def plain_server(services: Services) -> Iterator[tuple[RunningServer, str]]:
    running = start_server("127.0.0.1:0")
    running.mark_ready(services)
    yield running, f"127.0.0.1:{running.port}"
    running.stop(0)


def cli(target: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memsvc", *args, "--target", target],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def lines(events: list[object]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def event_json(conv: str, turn_id: int, text: str) -> dict[str, object]:
    return {
        "conversation_id": conv,
        "turn_id": turn_id,
        "speaker": "user" if turn_id % 2 == 0 else "assistant",
        "text": text,
        "timestamp": f"2026-02-02T10:{turn_id % 60:02d}:00+08:00",
    }


def test_append_wait_returns_when_part_of_the_file_was_refused(
    plain_server: tuple[RunningServer, str], tmp_path: Path
) -> None:
    _, target = plain_server
    file = tmp_path / "mixed.jsonl"
    good = [event_json("cli-good", i, f"turn {i} about gardening") for i in range(4)]
    bad = [
        event_json("cli-bad", 0, "fine"),
        {**event_json("cli-bad", 1, "broken"), "timestamp": "yesterday"},
    ]
    file.write_text(lines([*good, *bad]) + "5\n" + '"just a string"\n')
    done = cli(target, "append", str(file), "--wait", "--wait-timeout", "120")
    assert done.returncode == 1  # it reports the refused lines, and returns
    assert "accepted 4" in done.stdout
    assert "line 7: expected a JSON object" in done.stderr and "line 8:" in done.stderr
    assert "line 6:" in done.stderr  # the bad timestamp, by the line it came from
    assert "Traceback" not in done.stderr


def test_append_sends_each_conversation_in_turn_order(
    plain_server: tuple[RunningServer, str], services: Services, tmp_path: Path
) -> None:
    _, target = plain_server
    file = tmp_path / "reversed.jsonl"
    events = [event_json("cli-order", i, f"note {i}") for i in range(520)]
    file.write_text(lines(list(reversed(events))))  # turn 519 first: batch 1 ends at 20
    done = cli(target, "append", str(file))
    assert done.returncode == 0, done.stderr
    assert "accepted 520, duplicates 0, errors 0" in done.stdout
    assert services.queue.status(["cli-order"])[0].last_appended_turn == 519
