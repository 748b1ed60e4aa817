"""Tokens at the process edge: a body is not decoded before its token is checked (nor a
message over the limit read), two authorization values are refused, and prefix-limited
tokens over gRPC reach only their conversations (issues 24 and 37)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from memsvc.app import Services
from memsvc.transports.grpc.auth import TokenTable
from memsvc.transports.grpc.convert import event_to_pb
from memsvc.transports.grpc.server import start_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.conftest import EN_TURNS, conversation, turn
from tests.integration.test_security import TOKENS, write_tokens
from tests.support.surfaces import event, reason

ADMIN = "admin-token-0123456789ab"


READER = "reader-token-0123456789"


ACME_READER = "acme-reader-token-0123456789"


ACME_WRITER = "acme-writer-token-0123456789"


def bearer(*tokens: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {t}") for t in tokens]


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


def test_13_a_message_over_the_limit_is_refused_before_its_token_is_read(
    services: Services, tmp_path: object
) -> None:
    """Leftover (issue 37): 61 MB bodies sent without a token were refused, but the server
    held each whole first (64 MiB limit): the limit is now 16 MiB (MEMSVC_MAX_REQUEST_MB)."""
    table = TokenTable(write_tokens(tmp_path / "t", TOKENS))  # type: ignore[operator]
    running = start_server("127.0.0.1:0", tokens=table)
    running.mark_ready(services)
    try:
        with grpc.insecure_channel(
            f"127.0.0.1:{running.port}",
            options=[("grpc.max_send_message_length", 64 * 1024 * 1024)],
        ) as channel:
            stub = pb_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]
            big = "x" * (17 * 1024 * 1024)
            with pytest.raises(grpc.RpcError) as refused:
                stub.AppendEvents(pb.AppendEventsRequest(events=[event("big", 0, big)]), timeout=60)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            small = "y" * (15 * 1024 * 1024)
            with pytest.raises(grpc.RpcError) as unauthenticated:
                stub.AppendEvents(
                    pb.AppendEventsRequest(events=[event("big", 0, small)]), timeout=60
                )
            assert unauthenticated.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        running.stop(0)
