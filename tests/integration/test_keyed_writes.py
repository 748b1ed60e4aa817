"""A write whose answer was lost (issue 62, item 8): the server commits, the reply never
reaches the caller (here a proxy drops everything the server sends back), the caller's
deadline passes, and it sends the same call again. With the same idempotency key, the
retry returns the first answer and nothing is written twice; without one, the turns would
be stored again (what MCP add_turns did). In this process: the gRPC server, the proxy you
control, and a real stub."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from memsvc.app import Services
from memsvc.transports.grpc.server import start_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.support.tcp_proxy import TcpProxy


@pytest.fixture()
def through_proxy(services: Services) -> Iterator[TcpProxy]:
    running = start_server("127.0.0.1:0")
    running.mark_ready(services)
    proxy = TcpProxy("127.0.0.1", running.port)
    try:
        yield proxy
    finally:
        proxy.close()
        running.stop(0)


def stub_through(proxy: TcpProxy) -> tuple[grpc.Channel, pb_grpc.MemoryServiceStub]:
    # a connection of its own: gRPC shares connections between a process's channels, and a
    # new channel could be handed the reset one before gRPC noticed ("Socket closed")
    channel = grpc.insecure_channel(
        f"127.0.0.1:{proxy.port}", options=[("grpc.use_local_subchannel_pool", 1)]
    )
    return channel, pb_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]


def test_a_retry_after_a_lost_answer_is_written_once(
    through_proxy: TcpProxy, services: Services
) -> None:
    proxy = through_proxy
    channel, stub = stub_through(proxy)
    said = [
        pb.MemoryEvent(conversation_id="lost", speaker="user", text=f"note {i}") for i in range(3)
    ]
    request = pb.AppendEventsRequest(
        events=said, assign_turn_ids=True, idempotency_key="4f1c-retry"
    )
    # the connection is up (an answered call), then the server's replies stop coming back
    stub.GetIndexStatus(pb.GetIndexStatusRequest(conversation_ids=["lost"]), timeout=30)
    proxy.answers_lost()
    with pytest.raises(grpc.RpcError) as lost:
        stub.AppendEvents(request, timeout=3)
    assert lost.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    proxy.reset()  # the broken connection goes
    proxy.heal()
    channel.close()
    channel, stub = stub_through(proxy)  # the caller dials again and sends the same call
    retried = stub.AppendEvents(request, timeout=30, wait_for_ready=True)
    assert list(retried.turn_ids) == [0, 1, 2] and retried.accepted == 3
    exported, _ = services.ingest.export_events("lost", 0, "")
    assert [e.text for e in exported] == ["note 0", "note 1", "note 2"]  # once
    # without a key the same retry stores the turns again: what the key prevents
    unkeyed = pb.AppendEventsRequest(events=said, assign_turn_ids=True)
    assert list(stub.AppendEvents(unkeyed, timeout=30).turn_ids) == [3, 4, 5]
    channel.close()


def test_a_keyed_pop_whose_answer_was_lost_pops_once(
    through_proxy: TcpProxy, services: Services
) -> None:
    """Issue 81, item 2: a pop that committed but whose answer was lost, sent again, popped
    a second turn and the first was lost to the caller. With the same key the retry gets
    the first pop's turn and nothing more is deleted."""
    proxy = through_proxy
    channel, stub = stub_through(proxy)
    said = [
        pb.MemoryEvent(conversation_id="lost-pop", speaker="user", text=f"item {i}")
        for i in range(3)
    ]
    stub.AppendEvents(pb.AppendEventsRequest(events=said, assign_turn_ids=True), timeout=30)
    request = pb.PopEventsRequest(conversation_id="lost-pop", idempotency_key="pop-7a")
    proxy.answers_lost()
    with pytest.raises(grpc.RpcError) as lost:
        stub.PopEvents(request, timeout=3)
    assert lost.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    proxy.reset()
    proxy.heal()
    channel.close()
    channel, stub = stub_through(proxy)
    retried = stub.PopEvents(request, timeout=30, wait_for_ready=True)
    assert [(e.turn_id, e.text) for e in retried.events] == [(2, "item 2")]
    exported, _ = services.ingest.export_events("lost-pop", 0, "")
    assert [e.text for e in exported] == ["item 0", "item 1"]  # one turn popped, not two
    channel.close()


def test_a_stock_client_pops_a_large_turn_or_nothing_is_deleted(
    through_proxy: TcpProxy, services: Services
) -> None:
    """Issue 81, item 1: a stock grpcio client (4 MiB receive) popped a 4.8 MB turn; the
    server committed, the client got RESOURCE_EXHAUSTED, and the turn was gone. Now the
    default budget fits that client: refused before the delete, naming the field; a client
    that raises its limit and says so gets the turn."""
    channel, stub = stub_through(through_proxy)
    big = pb.MemoryEvent(
        conversation_id="big-pop", speaker="user", text="big", payload="\U0001f600" * 1_200_000
    )
    stub.AppendEvents(pb.AppendEventsRequest(events=[big], assign_turn_ids=True), timeout=60)
    with pytest.raises(grpc.RpcError) as refused:
        stub.PopEvents(pb.PopEventsRequest(conversation_id="big-pop"), timeout=60)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "max_reply_bytes" in (refused.value.details() or "")
    assert "REPLY_TOO_LARGE" in str(refused.value.trailing_metadata())
    exported, _ = services.ingest.export_events("big-pop", 0, "")
    assert [e.turn_id for e in exported] == [0]  # still there
    channel.close()
    roomy = grpc.insecure_channel(
        f"127.0.0.1:{through_proxy.port}",
        options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)],
    )
    popped = pb_grpc.MemoryServiceStub(roomy).PopEvents(  # type: ignore[no-untyped-call]
        pb.PopEventsRequest(conversation_id="big-pop", max_reply_bytes=64 * 1024 * 1024),
        timeout=60,
    )
    assert [e.payload for e in popped.events] == [big.payload]
    roomy.close()
