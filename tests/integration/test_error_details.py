"""Machine-readable errors (issue 13): google.rpc.Status details in the trailer."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from memsvc.app import Services
from memsvc.transports.grpc.auth import TokenTable
from memsvc.transports.grpc.server import start_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc


def details(err: grpc.RpcError) -> dict[str, object]:
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    assert status is not None and status.message == err.details()
    out: dict[str, object] = {}
    for any_ in status.details:
        for kind in (
            error_details_pb2.BadRequest,
            error_details_pb2.ErrorInfo,
            error_details_pb2.RetryInfo,
        ):
            if any_.Is(kind.DESCRIPTOR):
                message = kind()
                any_.Unpack(message)
                out[kind.__name__] = message
    return out


@pytest.fixture()
def stub(services: Services) -> Iterator[pb_grpc.MemoryServiceStub]:
    running = start_server("127.0.0.1:0", max_waiting_calls=1)
    running.mark_ready(services)
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield pb_grpc.MemoryServiceStub(channel)
    running.stop(0)


def test_invalid_argument_carries_field_violations(stub: pb_grpc.MemoryServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.EmbedDb(pb.EmbedDbRequest(query_text="x", top_k=1000))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = details(err.value)["BadRequest"]
    assert [(v.field, v.description) for v in bad.field_violations] == [  # type: ignore[attr-defined]
        ("top_k", "must be 0 (= 6) to 100")
    ]


def test_other_errors_carry_a_stable_reason_and_retry_hints(
    stub: pb_grpc.MemoryServiceStub, services: Services
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.WaitForIndexed(pb.WaitForIndexedRequest(conversation_id="nope", timeout_ms=10))
    assert details(err.value)["ErrorInfo"].reason == "NOT_FOUND"  # type: ignore[attr-defined]

    services.control.set_paused(True)
    from memsvc.transports.grpc.convert import event_to_pb
    from tests.conftest import turn

    stub.AppendEvents(pb.AppendEventsRequest(events=[event_to_pb(turn("w", 0, "hello"))]))
    wait = pb.WaitForIndexedRequest(conversation_id="w", turn_id=0, timeout_ms=2000)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(stub.WaitForIndexed, wait)  # holds the one waiting slot
        import time

        time.sleep(0.5)
        with pytest.raises(grpc.RpcError) as err:
            stub.WaitForIndexed(wait)
        first.result()
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    found = details(err.value)
    assert found["ErrorInfo"].reason == "TOO_MANY_CALLS"  # type: ignore[attr-defined]
    assert found["RetryInfo"].retry_delay.ToMilliseconds() == 1000  # type: ignore[attr-defined]


def test_auth_denials_carry_a_reason(services: Services, tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text("reader reader-token-0123456789\n")
    running = start_server("127.0.0.1:0", tokens=TokenTable(tmp_path / "tokens"))
    running.mark_ready(services)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.MemoryServiceStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.EmbedChunk(pb.EmbedChunkRequest(query="x"))
            assert details(err.value)["ErrorInfo"].reason == "TOKEN_MISSING"  # type: ignore[attr-defined]
            with pytest.raises(grpc.RpcError) as err:
                stub.Reindex(
                    pb.ReindexRequest(all=True),
                    metadata=[("authorization", "Bearer reader-token-0123456789")],
                )
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert details(err.value)["ErrorInfo"].reason == "ROLE_TOO_LOW"  # type: ignore[attr-defined]
    finally:
        running.stop(0)
