"""The HTTP bridge answers every request it can read with a Connect error, never a 500
(issue 81, item 3): bodies of every JSON type, nesting to 10^5 levels, and copied headers
(traceparent, tracestate, baggage, Authorization) holding any byte 0x00-0xFF or 64 KiB.
Against `memsvc serve --http-listen` in a child process, with raw sockets where an HTTP
client would refuse to send the bytes."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memsvc.transports.http.json_body import MAX_JSON_DEPTH
from memsvc.v1 import memory_pb2 as pb
from tests.integration.test_http import READER, WRITER, Http, serving_http

pytestmark = pytest.mark.xdist_group("http-hostile")

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
STATUS = b'{"conversationIds": ["hostile"]}'
METHODS = [m.name for m in pb.DESCRIPTOR.services_by_name["MemoryService"].methods]


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Http]:
    yield from serving_http(tmp_path_factory.mktemp("http-hostile"))


def raw_post(base: str, method: str, headers: list[tuple[bytes, bytes]], body: bytes) -> int:
    """POST with these header bytes as they are; the status code (0: closed unanswered)."""
    host, port = re.fullmatch(r"http://([\d.]+):(\d+)", base).groups()  # type: ignore[union-attr]
    head = [
        f"POST /memsvc.v1.MemoryService/{method} HTTP/1.1".encode(),
        f"Host: {host}:{port}".encode(),
        b"Content-Type: application/json",
        f"Content-Length: {len(body)}".encode(),
        b"Connection: close",
        *(name + b": " + value for name, value in headers),
    ]
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        answer = b""
        while b"\r\n" not in answer:
            part = conn.recv(4096)
            if not part:
                break
            answer += part
    status = re.match(rb"HTTP/1\.1 (\d{3})", answer)
    return int(status.group(1)) if status else 0


def dropped(http: Http) -> dict[str, float]:
    text = httpx2.get(http.metrics, timeout=30).text
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'memsvc_http_headers_dropped_total\{header="(\w+)"\} (\S+)', text)
    }


@pytest.mark.parametrize(
    "body", [b"null", b"1", b"true", b"false", b"-0.5", b'"x"', b"[]", b"[{}]"]
)
def test_a_body_that_is_not_an_object_is_invalid_argument(http: Http, body: bytes) -> None:
    reply = http.post("GetIndexStatus", body, READER, **{"Content-Type": "application/json"})
    assert reply.status_code == 400, reply.text
    assert reply.json()["code"] == "invalid_argument"
    assert "JSON object" in reply.json()["message"]


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1_000, 100_000])
@pytest.mark.parametrize("bracket", ["[]", "{}"])
def test_nesting_past_the_limit_is_refused_before_decoding(
    http: Http, depth: int, bracket: str
) -> None:
    """Regression: 100,000 levels raised RecursionError in json.loads, a plain-text 500."""
    opening = '{"a":' if bracket == "{}" else "["
    body = ('{"query":' + opening * depth + "1" + bracket[1] * depth + "}").encode()
    reply = http.post("EmbedChunk", body, READER, **{"Content-Type": "application/json"})
    assert reply.status_code == 400, reply.text
    assert f"deeper than {MAX_JSON_DEPTH}" in reply.json()["message"]
    unbalanced = http.post(
        "EmbedChunk", b"[" * depth, READER, **{"Content-Type": "application/json"}
    )
    assert unbalanced.status_code == 400, unbalanced.text


def test_every_request_of_the_api_nests_within_the_limit() -> None:
    """The limit refuses no request the API defines: its deepest message, in JSON (each
    message an object, each repeated field an array, each map an object), is well within."""

    def depth(message: Any, seen: tuple[str, ...] = ()) -> int:
        if message.full_name in seen:
            raise AssertionError(f"recursive message {message.full_name}")
        deepest = 0
        for field in message.fields:
            inner = 0
            if field.message_type is not None:
                is_map = field.message_type.GetOptions().map_entry
                value = field.message_type.fields_by_name["value"] if is_map else None
                if is_map:
                    inner = depth(value.message_type, seen) if value.message_type else 0
                else:
                    inner = depth(field.message_type, (*seen, message.full_name))
            repeated = field.is_repeated
            deepest = max(deepest, inner + (1 if repeated else 0))
        return deepest + 1

    service = pb.DESCRIPTOR.services_by_name["MemoryService"]
    deepest = max(depth(m.input_type) for m in service.methods)
    assert deepest <= 6 < MAX_JSON_DEPTH  # the module's docstring says 6


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["events", "query", "conversationIds", "topK", "x"]), inner, max_size=4
        )
    ),
    max_leaves=20,
)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(method=st.sampled_from(METHODS), value=json_values)
def test_no_json_body_gets_a_5xx(http: Http, method: str, value: Any) -> None:
    body = json.dumps(value, allow_nan=True).encode()
    reply = http.post(method, body, READER, **{"Content-Type": "application/json"})
    assert reply.status_code < 500, (method, body, reply.text)


@pytest.mark.parametrize("header", [b"traceparent", b"tracestate", b"baggage", b"authorization"])
def test_no_header_byte_or_size_gets_a_5xx_and_bad_trace_headers_are_dropped(
    http: Http, header: bytes
) -> None:
    """Regression: a non-ASCII byte in a trace header was copied into gRPC metadata, a 500
    `Invalid metadata`; one over 16 KiB a 429 a client retries forever."""
    before = dropped(http)
    token = f"Bearer {WRITER}".encode()
    base = TRACEPARENT.encode() if header == b"traceparent" else b"k=v"
    statuses = {}
    for byte in range(256):
        value = base[:10] + bytes([byte]) + base[10:]
        headers = [(b"Authorization", token), (header, value)]
        if header == b"authorization":
            headers = [(header, token[:10] + bytes([byte]) + token[10:])]
        statuses[byte] = raw_post(http.base, "GetIndexStatus", headers, STATUS)
    assert all(0 < s < 500 for s in statuses.values()), statuses
    if header != b"authorization":
        # not printable ASCII: dropped, and the call answered (0x0a, 0x0d end the header,
        # which the HTTP parser itself refuses or reads as a new line)
        assert all(statuses[b] == 200 for b in range(0x80, 0x100)), statuses
        assert dropped(http).get(header.decode(), 0) >= before.get(header.decode(), 0) + 128
    else:
        assert all(statuses[b] == 401 for b in range(0x80, 0x100)), statuses
    huge = (base if header != b"authorization" else token) + b"x" * 65_536
    headers = [(b"Authorization", token), (header, huge)]
    if header == b"authorization":
        headers = [(header, huge)]
    status = raw_post(http.base, "GetIndexStatus", headers, STATUS)
    assert 0 < status < 500 and status != 429, status  # the HTTP parser's 400, or dropped


def test_a_valid_trace_context_still_passes_and_a_bad_one_is_ignored(http: Http) -> None:
    good = http.post(
        "GetIndexStatus", json.loads(STATUS), READER, traceparent=TRACEPARENT, tracestate="k=v"
    )
    assert good.status_code == 200
    before = dropped(http)
    for bad in (
        "00-" + "0" * 32 + "-b7ad6b7169203331-01",
        "ff" + TRACEPARENT[2:],
        "zz",
        TRACEPARENT + "-x",
    ):
        reply = http.post(
            "GetIndexStatus", json.loads(STATUS), READER, traceparent=bad, tracestate="k=v"
        )
        assert reply.status_code == 200, reply.text
    after = dropped(http)
    assert after["traceparent"] == before.get("traceparent", 0) + 4
    assert after["tracestate"] >= before.get("tracestate", 0) + 4  # dropped with it
