"""Security (issue 12): bearer tokens with roles on every RPC, unscoped calls admin-only,
TLS and mTLS with real certificates, token rotation by SIGHUP, refusal to serve an open
port unauthenticated, private files on disk, undecodable requests as INVALID_ARGUMENT."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from memsvc.app import Services
from memsvc.domain.ids import chunk_id
from memsvc.transports.grpc.auth import METHOD_ROLES, Role, TokenTable
from memsvc.transports.grpc.convert import event_to_pb
from memsvc.transports.grpc.server import RunningServer, start_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.conftest import turn
from tests.support.launch import free_port, start_child, wait_serving
from tests.support.tls import make_pki

TOKENS = {
    Role.READER: "reader-token-0123456789",
    Role.WRITER: "writer-token-0123456789",
    Role.ADMIN: "admin-token-0123456789ab",
}


def write_tokens(path: Path, tokens: dict[Role, str]) -> Path:
    lines = ["# role token"] + [f"{r.name.lower()} {t}" for r, t in tokens.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def bearer(token: str | None) -> list[tuple[str, str]]:
    return [] if token is None else [("authorization", f"Bearer {token}")]


def code_of(call: Any, request: Any, token: str | None) -> grpc.StatusCode:
    try:
        call(request, metadata=bearer(token), timeout=60)
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.fixture()
def secured(services: Services, tmp_path: Path) -> Iterator[tuple[RunningServer, grpc.Channel]]:
    services.ingest.append([turn("sec", 0, "a first message about the harbor")])
    table = TokenTable(write_tokens(tmp_path / "tokens", TOKENS))
    running = start_server("127.0.0.1:0", tokens=table)
    running.mark_ready(services)
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield running, channel
    running.stop(0)


# one scoped, harmless request per RPC
REQUESTS: dict[str, Any] = {
    "EmbedDb": pb.EmbedDbRequest(
        query_text="harbor", filters=pb.SearchFilters(conversation_ids=["sec"])
    ),
    "EmbedChunk": pb.EmbedChunkRequest(query="harbor"),
    "EmbedBatch": pb.EmbedBatchRequest(texts=["harbor"]),
    "ListChunks": pb.ListChunksRequest(conversation_id="sec"),
    "GetIndexStatus": pb.GetIndexStatusRequest(conversation_ids=["sec"]),
    "WaitForIndexed": pb.WaitForIndexedRequest(conversation_id="sec", turn_id=0, timeout_ms=10),
    "ExportEvents": pb.ExportEventsRequest(conversation_id="sec"),
    "AppendEvents": pb.AppendEventsRequest(
        events=[event_to_pb(turn("sec", 0, "a first message about the harbor"))]
    ),
    "BuildIncrementalChunks": pb.BuildIncrementalChunksRequest(conversation_id="sec"),
    "UpsertVectorRecords": pb.UpsertVectorRecordsRequest(),
    "LogicalDeleteBySource": pb.LogicalDeleteBySourceRequest(
        conversation_id="nope", turn_range=pb.TurnRange(start=0, end=0)
    ),
    "PopEvents": pb.PopEventsRequest(conversation_id="nope"),
    "PurgeDeleted": pb.PurgeDeletedRequest(conversation_id="nope"),
    "RetireChunkVersion": pb.RetireChunkVersionRequest(conversation_id="nope", chunk_version=9),
    "Reindex": pb.ReindexRequest(conversation_ids=["nope"]),
    "SetIndexingPaused": pb.SetIndexingPausedRequest(paused=False),
}
DENIED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}


def test_every_rpc_against_every_role(secured: tuple[RunningServer, grpc.Channel]) -> None:
    _, channel = secured
    stub = pb_grpc.MemoryServiceStub(channel)
    assert (
        set(REQUESTS)
        == set(METHOD_ROLES)
        == set(pb.DESCRIPTOR.services_by_name["MemoryService"].methods_by_name)
    )
    for method, request in REQUESTS.items():
        call = getattr(stub, method)
        assert code_of(call, request, None) is grpc.StatusCode.UNAUTHENTICATED, method
        assert code_of(call, request, "not-a-known-token-at-all") is grpc.StatusCode.UNAUTHENTICATED
        for role, token in TOKENS.items():
            code = code_of(call, request, token)
            if role >= METHOD_ROLES[method]:
                assert code not in DENIED, (method, role, code)
            else:
                assert code is grpc.StatusCode.PERMISSION_DENIED, (method, role, code)


def test_global_operations_are_admin_only_and_explicit(
    secured: tuple[RunningServer, grpc.Channel],
) -> None:
    _, channel = secured
    stub = pb_grpc.MemoryServiceStub(channel)
    reader, admin = TOKENS[Role.READER], TOKENS[Role.ADMIN]
    unscoped_search = pb.EmbedDbRequest(query_text="harbor")
    assert code_of(stub.EmbedDb, unscoped_search, reader) is grpc.StatusCode.PERMISSION_DENIED
    assert code_of(stub.EmbedDb, unscoped_search, admin) is grpc.StatusCode.OK
    everything = pb.GetIndexStatusRequest()
    assert code_of(stub.GetIndexStatus, everything, reader) is grpc.StatusCode.PERMISSION_DENIED
    assert code_of(stub.GetIndexStatus, everything, admin) is grpc.StatusCode.OK
    with pytest.raises(grpc.RpcError) as err:
        stub.PurgeDeleted(pb.PurgeDeletedRequest(), metadata=bearer(admin))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith("conversation_id:")
    purge_all = pb.PurgeDeletedRequest(all_conversations=True)
    assert stub.PurgeDeleted(purge_all, metadata=bearer(admin)).events_purged == 0


def test_health_stays_open_and_reflection_is_off_with_auth(
    secured: tuple[RunningServer, grpc.Channel],
) -> None:
    _, channel = secured
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest()).status == (
        health_pb2.HealthCheckResponse.SERVING
    )
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    with pytest.raises(grpc.RpcError) as err:
        list(
            refl.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
        )
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_undecodable_request_is_invalid_argument(
    secured: tuple[RunningServer, grpc.Channel],
) -> None:
    _, channel = secured
    raw = channel.unary_unary(
        "/memsvc.v1.MemoryService/ListChunks",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    bad_utf8 = b"\x0a\x02\xff\xfe"  # field 1 (conversation_id), 2 bytes of invalid UTF-8
    with pytest.raises(grpc.RpcError) as err:
        raw(bad_utf8, metadata=bearer(TOKENS[Role.READER]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith("request:")


def test_tls_and_mutual_tls(services: Services, tmp_path: Path) -> None:
    ca, server_pem, client_pem = make_pki(tmp_path)
    for mutual in (False, True):
        creds = grpc.ssl_server_credentials(
            [(server_pem.key.read_bytes(), server_pem.cert.read_bytes())],
            root_certificates=ca.cert.read_bytes() if mutual else None,
            require_client_auth=mutual,
        )
        running = start_server("127.0.0.1:0", credentials=creds)
        running.mark_ready(services)
        target = f"127.0.0.1:{running.port}"
        request = pb.EmbedChunkRequest(query="harbor")
        try:
            with grpc.insecure_channel(target) as plain, pytest.raises(grpc.RpcError):
                pb_grpc.MemoryServiceStub(plain).EmbedChunk(request, timeout=5)
            if not mutual:  # the CLI without --ca-file says what is likely wrong (issue 40)
                plain_cli = subprocess.run(
                    [sys.executable, "-m", "memsvc", "status", "--target", target],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    env={**os.environ, "MEMSVC_CA_FILE": ""},
                )
                assert plain_cli.returncode == 1
                assert "serving TLS? then pass --ca-file" in plain_cli.stderr, plain_cli.stderr
            anonymous = grpc.ssl_channel_credentials(root_certificates=ca.cert.read_bytes())
            with grpc.secure_channel(target, anonymous) as channel:
                stub = pb_grpc.MemoryServiceStub(channel)
                if mutual:
                    with pytest.raises(grpc.RpcError):
                        stub.EmbedChunk(request, timeout=5)
                else:
                    assert stub.EmbedChunk(request, timeout=30).dim > 0
            with_cert = grpc.ssl_channel_credentials(
                root_certificates=ca.cert.read_bytes(),
                private_key=client_pem.key.read_bytes(),
                certificate_chain=client_pem.cert.read_bytes(),
            )
            with grpc.secure_channel(target, with_cert) as channel:
                assert pb_grpc.MemoryServiceStub(channel).EmbedChunk(request, timeout=30).dim > 0
        finally:
            running.stop(0)


def test_refuses_an_open_port_without_tokens(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "memsvc",
            "serve",
            "--listen",
            f"0.0.0.0:{free_port()}",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "MEMSVC_AUTH_TOKENS_FILE" in proc.stderr and "--allow-insecure" in proc.stderr
    assert not (tmp_path / "data").exists()  # refused before touching anything


def test_rotation_by_sighup_and_private_files(tmp_path: Path) -> None:
    tokens_file = write_tokens(tmp_path / "tokens", {Role.ADMIN: "old-admin-token-0123456789"})
    data = tmp_path / "data"
    port = free_port()
    old_umask = os.umask(0o022)  # the child must not depend on a careful umask
    try:
        proc = start_child(data, port, "--auth-tokens-file", str(tokens_file))
    finally:
        os.umask(old_umask)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        wait_serving(channel, proc)
        stub = pb_grpc.MemoryServiceStub(channel)
        append = pb.AppendEventsRequest(events=[event_to_pb(turn("rot", 0, "private words"))])
        assert (
            code_of(stub.AppendEvents, append, "old-admin-token-0123456789") is grpc.StatusCode.OK
        )
        write_tokens(tokens_file, {Role.ADMIN: "new-admin-token-0123456789"})
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while (
            code_of(stub.AppendEvents, append, "new-admin-token-0123456789")
            is not grpc.StatusCode.OK
        ):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert (
            code_of(stub.AppendEvents, append, "old-admin-token-0123456789")
            is grpc.StatusCode.UNAUTHENTICATED
        )
        stub.WaitForIndexed(
            pb.WaitForIndexedRequest(conversation_id="rot", turn_id=0, timeout_ms=60_000),
            metadata=bearer("new-admin-token-0123456789"),
        )
        probe = subprocess.run(
            [sys.executable, "-m", "memsvc", "health"],
            env={**os.environ, "MEMSVC_LISTEN": f"127.0.0.1:{port}"},
            timeout=60,
        )
        assert probe.returncode == 0  # the container HEALTHCHECK: no token needed
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        files = [p for p in data.rglob("*") if p.is_file()]
        assert any(p.name == "events.sqlite" for p in files)
        loose = {
            str(p.relative_to(data)): oct(stat.S_IMODE(p.stat().st_mode))
            for p in files
            if stat.S_IMODE(p.stat().st_mode) & 0o077
        }
        assert loose == {}
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=60)


def test_hostile_input_names_the_exact_field(secured: tuple[RunningServer, grpc.Channel]) -> None:
    _, channel = secured
    stub = pb_grpc.MemoryServiceStub(channel)
    admin = bearer(TOKENS[Role.ADMIN])
    cases: list[tuple[Any, Any, str]] = [
        (
            stub.EmbedDb,
            pb.EmbedDbRequest(
                query_text="x", filters=pb.SearchFilters(conversation_ids=["ok", "sec\u200b"])
            ),
            "filters.conversation_ids[1]",
        ),
        (
            stub.EmbedDb,
            pb.EmbedDbRequest(
                query_text="x",
                filters=pb.SearchFilters(
                    conversation_ids=["sec"], participants=["A", "B", "\u202e"]
                ),
            ),
            "filters.participants[2]",
        ),
        (
            stub.AppendEvents,
            pb.AppendEventsRequest(
                events=[
                    pb.MemoryEvent(
                        conversation_id="sec",
                        turn_id=5,
                        speaker="user",
                        text="x",
                        timestamp="2026-02-02T10:00:00." + "1" * 70_000 + "+08:00",
                    )
                ]
            ),
            "events[0].timestamp",
        ),
        (
            stub.UpsertVectorRecords,
            pb.UpsertVectorRecordsRequest(
                records=[
                    pb.ChunkRecord(
                        chunk_id=chunk_id("sec", 0, 0, 1),
                        text="x",
                        metadata=pb.ChunkMetadata(
                            conversation_id="sec",
                            chunk_version=1,
                            participants=["A", "B", "zero\u200bwidth"],
                        ),
                    )
                ]
            ),
            "records[0].metadata.participants[2]",
        ),
    ]
    for call, request, field in cases:
        try:
            reply = call(request, metadata=admin)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, err.details())
            assert (err.details() or "").startswith(field + ":"), (field, err.details())
            continue
        # batch calls report per-item errors and write the good ones
        messages = [e.message for e in reply.errors]
        assert any(m.startswith(field + ":") for m in messages), (field, messages)


def test_the_security_pages_certificates_serve_and_bad_files_are_one_line(
    tmp_path: Path,
) -> None:
    """Issue 84, item 1: the recipe ended in `FileNotFoundError: 'server.key'` from
    server_credentials, and the page never said how to make the files. The page's openssl
    lines run here as written; memsvc serves with what they make (a CLI call trusting
    ca.crt); a missing key, a file that is not PEM and a key of another certificate each
    stop the start with one line naming the setting, before the model loads."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    recipe = next(b for b in page.split("```sh\n")[1:] if "openssl req -x509" in b)
    recipe = recipe.split("```")[0]
    subprocess.run(["sh", "-e", "-c", recipe], cwd=tmp_path, check=True, capture_output=True)
    tokens = write_tokens(tmp_path / "tokens", TOKENS)
    port = free_port()
    env = {"MEMSVC_TLS_CERT_FILE": "server.crt", "MEMSVC_TLS_KEY_FILE": "server.key"}

    def start(**changed: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "memsvc", "serve", "--listen", f"127.0.0.1:{port}"),
                *("--data-dir", str(tmp_path / "data"), "--auth-tokens-file", str(tokens)),
            ],
            cwd=tmp_path,
            env={
                **os.environ,
                "MEMSVC_EMBED_MODEL": "sentence-transformers/all-MiniLM-L6-v2",
                "MEMSVC_METRICS_LISTEN": "",
                **env,
                **changed,
            },
            stderr=subprocess.PIPE,
        )

    (tmp_path / "not-pem.key").write_text("hello")
    (tmp_path / "other").mkdir()
    make_pki(tmp_path / "other")  # another CA's server certificate and key
    for changed, says in [
        ({"MEMSVC_TLS_KEY_FILE": "missing.key"}, "MEMSVC_TLS_KEY_FILE=missing.key: No such file"),
        ({"MEMSVC_TLS_KEY_FILE": "not-pem.key"}, "MEMSVC_TLS_KEY_FILE=not-pem.key: not a PEM"),
        ({"MEMSVC_TLS_KEY_FILE": str(tmp_path / "other" / "server.key")}, "MEMSVC_TLS_CERT_FILE"),
    ]:
        refused = start(**changed)
        _, err = refused.communicate(timeout=120)
        assert refused.returncode == 1, err
        lines = err.decode().strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and "Traceback" not in lines[0], lines
    served = start()
    try:
        trust = grpc.ssl_channel_credentials((tmp_path / "ca.crt").read_bytes())
        with grpc.secure_channel(f"localhost:{port}", trust) as channel:
            wait_serving(channel, served)
        status = subprocess.run(
            [
                *(sys.executable, "-m", "memsvc", "status", "--target", f"localhost:{port}"),
                *("--ca-file", str(tmp_path / "ca.crt"), "--token", TOKENS[Role.ADMIN]),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert status.returncode == 0, status.stderr
        assert "model" in status.stdout
    finally:
        served.terminate()
        served.wait(timeout=60)
