"""Count limits are checked on the wire message before any per-item work (issue 62, item 4):
one 16 MiB AppendEvents of 8.4 million empty events took 81-117 s and 2.4 GiB to refuse,
because every event was converted before the count. Proven here by order, not by time: a
request whose item past the limit does not even decode is refused for its count, which it
could only be if counting came first. gRPC and HTTP (JSON and binary), in this process."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import httpx2
import pytest
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

from memsvc.app import Services
from memsvc.domain.limits import MAX_EVENTS_PER_CALL, MAX_REQUEST_BYTES
from memsvc.transports.grpc.server import start_server
from memsvc.transports.http.hosts import HostPolicy
from memsvc.transports.http.server import HttpServer, bind
from memsvc.transports.wire import OTHER_FIELDS
from memsvc.v1 import memory_pb2 as pb

APPEND = "/memsvc.v1.MemoryService/AppendEvents"


@dataclass
class Surfaces:
    channel: grpc.Channel
    http: str

    def append_bytes(self, data: bytes) -> grpc.RpcError:
        call = self.channel.unary_unary(
            APPEND, request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        with pytest.raises(grpc.RpcError) as refused:
            call(data, timeout=120)
        return refused.value


@pytest.fixture()
def surfaces(services: Services) -> Iterator[Surfaces]:
    running = start_server("127.0.0.1:0", bridge=True)
    running.mark_ready(services)
    http = HttpServer(
        bind("127.0.0.1:0"), running.bridge_target, None, None, hosts=HostPolicy()
    ).start()
    channel = grpc.insecure_channel(
        f"127.0.0.1:{running.port}", options=[("grpc.max_send_message_length", 64 << 20)]
    )
    try:
        yield Surfaces(channel, f"http://127.0.0.1:{http.port}{APPEND}")
    finally:
        channel.close()
        http.stop(0)
        running.stop(0)


def event_bytes(turn_id: int) -> bytes:
    event = pb.MemoryEvent(
        conversation_id="limits", turn_id=turn_id, speaker="user", text=f"turn {turn_id}"
    )
    return pb.AppendEventsRequest(events=[event]).SerializeToString()


# field 1 (events), length-delimited, holding a string field with invalid UTF-8: undecodable
UNDECODABLE_EVENT = b"\x0a\x04\x0a\x02\xff\xfe"


def violations(error: grpc.RpcError) -> list[tuple[str, str]]:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                bad = error_details_pb2.BadRequest()
                if detail.Unpack(bad):
                    return [(v.field, v.description) for v in bad.field_violations]
    return []


def test_the_count_is_checked_before_any_event_is_decoded(
    surfaces: Surfaces, services: Services
) -> None:
    many = b"".join(event_bytes(i) for i in range(MAX_EVENTS_PER_CALL)) + UNDECODABLE_EVENT
    error = surfaces.append_bytes(many)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert violations(error)[0][0] == "events"
    assert "at most 10,000" in (error.details() or "")
    # the same bytes one event shorter fail on that event instead: it is decoded then
    error = surfaces.append_bytes(many[len(event_bytes(0)) :])
    assert "does not decode" in (error.details() or "")
    with services.log.snapshot() as log:
        assert log.conversations() == []  # nothing half-written


def test_the_red_teams_sixteen_mebibytes_of_empty_events(surfaces: Surfaces) -> None:
    error = surfaces.append_bytes(b"\x0a\x00" * (MAX_REQUEST_BYTES // 2))  # 8.4 million
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert violations(error)[0][0] == "events"


def test_a_scalar_repeated_past_reason_is_refused(surfaces: Surfaces) -> None:
    # allow_gaps (field 2) sent again and again: legal protobuf, never a real client's
    error = surfaces.append_bytes(b"\x10\x01" * (OTHER_FIELDS + 1))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert violations(error)[0][0] == "request"


def test_over_http_json_and_binary(surfaces: Surfaces) -> None:
    events = [{"conversationId": "limits", "speaker": "user", "text": "hi"}] * MAX_EVENTS_PER_CALL
    events += [{"turnId": "not a number"}]  # would fail to parse, were it parsed first
    reply = httpx2.post(surfaces.http, json={"events": events}, timeout=120)
    assert reply.status_code == 400, reply.text
    assert reply.json()["code"] == "invalid_argument"
    assert reply.json()["message"].startswith("events: at most 10,000")
    assert reply.json()["details"][0]["type"] == "google.rpc.BadRequest"
    binary = httpx2.post(
        surfaces.http,
        content=b"\x0a\x00" * (MAX_EVENTS_PER_CALL + 1),
        headers={"Content-Type": "application/proto"},
        timeout=120,
    )
    assert binary.status_code == 400
    assert binary.json()["message"].startswith("events: at most 10,000")
    repeated = httpx2.post(
        surfaces.http,
        content=b'{"events": [], "events": []}',
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    assert repeated.status_code == 400 and "repeats a key" in repeated.json()["message"]


def test_compare_and_append_expectations_are_counted_as_theirs(surfaces: Surfaces) -> None:
    # AppendEventsRequest.expected_last_turn is a map: each entry is a top-level field. Past
    # OTHER_FIELDS of them a call is ordinary (one per conversation written), past the event
    # limit it is refused naming that field, before anything is decoded
    count = OTHER_FIELDS * 2
    events = [
        pb.MemoryEvent(conversation_id=f"cas-{i}", speaker="user", text="hi") for i in range(count)
    ]
    request = pb.AppendEventsRequest(
        events=events,
        assign_turn_ids=True,
        expected_last_turn={f"cas-{i}": -1 for i in range(count)},
    )
    stub = surfaces.channel.unary_unary(
        APPEND,
        request_serializer=pb.AppendEventsRequest.SerializeToString,
        response_deserializer=pb.AppendEventsResponse.FromString,
    )
    reply = stub(request, timeout=120)
    assert reply.accepted == count and not reply.errors
    entry = pb.AppendEventsRequest(expected_last_turn={"x": -1}).SerializeToString()
    error = surfaces.append_bytes(entry * (MAX_EVENTS_PER_CALL + 1) + UNDECODABLE_EVENT)
    assert violations(error)[0][0] == "expected_last_turn"
    many = {"expectedLastTurn": {f"c{i}": -1 for i in range(MAX_EVENTS_PER_CALL + 1)}}
    json_reply = httpx2.post(surfaces.http, json={"events": [], **many}, timeout=120)
    assert json_reply.json()["message"].startswith("expected_last_turn: at most 10,000")
