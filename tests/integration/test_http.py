"""HTTP/JSON (issue 26): every MemoryService RPC in the Connect protocol, from a real HTTP
client against `memsvc serve --http-listen` in a child process: the same auth, validation,
errors (Connect error JSON with the google.rpc details) and metrics as gRPC."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx2
import pytest
from google.rpc import error_details_pb2  # type: ignore[import-untyped]

from memsvc.domain.access import Role
from memsvc.v1 import memory_pb2 as pb
from tests.integration.test_security import TOKENS, write_tokens
from tests.support.launch import free_port, start_child, wait_serving

# the module's shared fixture starts once: every test of it on one worker (make test: loadgroup)
pytestmark = pytest.mark.xdist_group("http-server")

WRITER, READER, ADMIN = TOKENS[Role.WRITER], TOKENS[Role.READER], TOKENS[Role.ADMIN]


class Http:
    def __init__(self, base: str, metrics: str) -> None:
        self.base = base
        self.metrics = metrics

    def post(
        self, method: str, body: Any, token: str | None = WRITER, **headers: str
    ) -> httpx2.Response:
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if isinstance(body, bytes):
            headers.setdefault("Content-Type", "application/proto")
            return httpx2.post(
                f"{self.base}/memsvc.v1.MemoryService/{method}",
                content=body,
                headers=headers,
                timeout=120,
            )
        return httpx2.post(
            f"{self.base}/memsvc.v1.MemoryService/{method}", json=body, headers=headers, timeout=120
        )

    def ok(self, method: str, body: Any, token: str = WRITER) -> dict[str, Any]:
        reply = self.post(method, body, token)
        assert reply.status_code == 200, reply.text
        assert reply.headers["content-type"].startswith("application/json")
        value: dict[str, Any] = reply.json()
        return value


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Http]:
    yield from serving_http(tmp_path_factory.mktemp("http"))


def serving_http(root: Path) -> Iterator[Http]:
    """memsvc with tokens and an HTTP listener in a child process, until closed."""
    tokens = write_tokens(root / "tokens", TOKENS)
    port, http_port, metrics_port = free_port(), free_port(), free_port()
    proc = start_child(
        root / "data",
        port,
        "--auth-tokens-file",
        str(tokens),
        "--http-listen",
        f"127.0.0.1:{http_port}",
        "--metrics-listen",
        f"127.0.0.1:{metrics_port}",
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, proc)
        yield Http(f"http://127.0.0.1:{http_port}", f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


EVENTS = [
    {
        "conversationId": "h1",
        "turnId": "0",
        "speaker": "user",
        "text": "I keep my passport in the left drawer of the desk.",
        "timestamp": "2026-02-02T10:15:30+08:00",
    },
    {
        "conversation_id": "h1",  # the proto field name is accepted as well
        "turn_id": 1,
        "speaker": "assistant",
        "text": "Noted: passport, left desk drawer.",
        "timestamp": "2026-02-02T10:15:40+08:00",
    },
]


def details_of(reply: httpx2.Response) -> dict[str, bytes]:
    body = reply.json()
    return {
        d["type"]: base64.b64decode(d["value"] + "=" * (-len(d["value"]) % 4))
        for d in body.get("details", [])
    }


def test_every_rpc_family_over_json(http: Http) -> None:
    # asynchronous ingestion and read-your-writes
    appended = http.ok("AppendEvents", {"events": EVENTS})
    # every field, zeros and empty lists included (issue 66: a field at 0 was left out)
    assert appended == {
        "accepted": 2,
        "duplicates": 0,
        "errors": [],
        "truncated": [],
        "turnIds": [],
    }
    waited = http.ok(
        "WaitForIndexed", {"conversationId": "h1", "turnId": 1, "timeoutMs": 120000}, READER
    )
    assert waited["indexed"] is True and waited["status"]["lastIndexedTurn"] == "1"
    status = http.ok("GetIndexStatus", {"conversationIds": ["h1"]}, READER)
    assert status["conversations"][0]["state"] == "idle"
    # search
    found = http.ok(
        "EmbedDb",
        {"queryText": "where is my passport", "filters": {"conversationIds": ["h1"]}},
        READER,
    )
    assert found["mode"] == "SEARCH_MODE_HYBRID" and "left drawer" in found["hits"][0]["text"]
    assert http.ok("EmbedChunk", {"query": "passport"}, READER)["dim"] == 384
    assert len(http.ok("EmbedBatch", {"texts": ["a", "b"]}, READER)["vectors"]) == 2
    # synchronous build and upsert, then list
    built = http.ok(
        "BuildIncrementalChunks", {"events": [{**EVENTS[1], "conversation_id": "h2", "turn_id": 0}]}
    )
    upserted = http.ok("UpsertVectorRecords", {"records": built["chunks"]})
    assert upserted["upserted"] == len(built["chunks"]) >= 1
    listed = http.ok("ListChunks", {"conversationId": "h2"}, READER)
    assert [c["chunkId"] for c in listed["chunks"]] == [c["chunkId"] for c in built["chunks"]]
    # delete, then search finds nothing
    deleted = http.ok("LogicalDeleteBySource", {"conversationId": "h1"})
    assert deleted["eventsDeleted"] == 2
    gone = http.ok(
        "EmbedDb",
        {"queryText": "where is my passport", "filters": {"conversationIds": ["h1"]}},
        READER,
    )
    assert gone.get("hits", []) == []
    # administration
    assert http.ok("SetIndexingPaused", {"paused": True}, ADMIN) == {"paused": True}
    assert http.ok("SetIndexingPaused", {"paused": False}, ADMIN) == {"paused": False}
    http.ok("PurgeDeleted", {"conversationId": "h1"}, ADMIN)


def test_binary_protobuf_too(http: Http) -> None:
    request = pb.EmbedChunkRequest(query="binary")
    reply = http.post("EmbedChunk", request.SerializeToString(), READER)
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "application/proto"
    assert len(pb.EmbedChunkResponse.FromString(reply.content).vector) == 384


ERRORS = [
    # (method, body, token, HTTP status, Connect code)
    (
        "EmbedDb",
        {"queryText": "x", "filters": {"conversationIds": ["h1"]}},
        None,
        401,
        "unauthenticated",
    ),
    (
        "EmbedDb",
        {"queryText": "x", "filters": {"conversationIds": ["h1"]}},
        "wrong-token-0123456789",
        401,
        "unauthenticated",
    ),
    ("AppendEvents", {"events": EVENTS}, READER, 403, "permission_denied"),
    ("SetIndexingPaused", {"paused": True}, WRITER, 403, "permission_denied"),
    (
        "EmbedDb",
        {"queryText": "", "filters": {"conversationIds": ["h1"]}},
        READER,
        400,
        "invalid_argument",
    ),
    # (an unknown conversation is waited for to the time-out: its first append may be on
    # its way; 0.2 s, not the default 10)
    (
        "WaitForIndexed",
        {"conversationId": "never-seen", "turnId": 0, "timeoutMs": 200},
        READER,
        404,
        "not_found",
    ),
    ("NoSuchMethod", {}, READER, 501, "unimplemented"),
]


@pytest.mark.parametrize(("method", "body", "token", "status", "code"), ERRORS)
def test_error_mapping(
    http: Http, method: str, body: Any, token: str | None, status: int, code: str
) -> None:
    reply = http.post(method, body, token)
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.json()["code"] == code and reply.json()["message"]


def test_field_violations_and_reasons_travel_as_details(http: Http) -> None:
    reply = http.post(
        "EmbedDb",
        {
            "queryText": "x",
            "filters": {"conversationIds": ["h1"], "timestampRange": {"start": "soon"}},
        },
        READER,
    )
    assert reply.status_code == 400
    violations = error_details_pb2.BadRequest.FromString(
        details_of(reply)["google.rpc.BadRequest"]
    ).field_violations
    assert [v.field for v in violations] == ["filters.timestamp_range.start"]
    denied = http.post("AppendEvents", {"events": EVENTS}, READER)
    info = error_details_pb2.ErrorInfo.FromString(details_of(denied)["google.rpc.ErrorInfo"])
    assert (info.reason, info.domain) == ("ROLE_TOO_LOW", "memsvc.v1")
    # a body that is not the message, and a content type that is not Connect's
    broken = http.post("EmbedDb", b"{not json", READER, **{"Content-Type": "application/json"})
    assert broken.status_code == 400 and broken.json()["code"] == "invalid_argument"
    assert broken.json()["message"].startswith("request:")
    assert http.post("EmbedDb", b"x", READER, **{"Content-Type": "text/plain"}).status_code == 415


def test_metrics_say_which_transport(http: Http) -> None:
    http.ok("GetIndexStatus", {"conversationIds": ["h1"]}, READER)
    deadline = time.monotonic() + 10
    while True:
        text = httpx2.get(http.metrics, timeout=10).text
        if 'method="GetIndexStatus",transport="http"' in text.replace('code="OK",', ""):
            break
        assert time.monotonic() < deadline, "no http series"
        time.sleep(0.2)


def test_the_documented_curl_examples(http: Http) -> None:
    """The HTTP page's curl block, sent as written (the test server's port and a token added)."""
    page = (Path(__file__).parents[2] / "docs" / "surfaces" / "http.md").read_text()
    block = page.split("```sh\n", 1)[1].split("```", 1)[0]
    calls = re.findall(
        r"curl -s http://127\.0\.0\.1:8080/memsvc\.v1\.MemoryService/(\w+) "
        r"-H 'Content-Type: application/json' -d '(.*)'",
        block,
    )
    assert [m for m, _ in calls] == ["AppendEvents", "WaitForIndexed", "EmbedDb"]
    replies = [http.ok(method, json.loads(body)) for method, body in calls]
    assert replies[0]["accepted"] == 2 and replies[1]["indexed"] is True
    assert "抽屉" in replies[2]["hits"][0]["text"]
    # issue 66: the JSON kept Chinese as \u escapes and left out a turn range's start of 0
    raw = http.post("EmbedDb", json.loads(calls[2][1])).text
    assert "抽屉" in raw and "\\u" not in raw
    assert replies[2]["hits"][0]["metadata"]["turnRange"]["start"] == "0"


def test_the_root_leads_to_the_console_and_the_icon_is_empty(http: Http) -> None:
    # issue 66: `/` on the HTTP port was a 404, and every page logged a 404 for the icon
    root = httpx2.get(f"{http.base}/", follow_redirects=False, timeout=30)
    assert root.status_code in (302, 307) and root.headers["location"] == "/console/"
    icon = httpx2.get(f"{http.base}/favicon.ico", timeout=30)
    assert icon.status_code == 204


@pytest.mark.parametrize("address", ["0.0.0.0", "127.0.0.1:notaport"])
def test_http_listen_is_checked_before_anything_starts(tmp_path: Path, address: str) -> None:
    listen = address if ":" in address else f"{address}:{free_port()}"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "memsvc", "serve", "--listen", f"127.0.0.1:{free_port()}"),
            *("--http-listen", listen, "--data-dir", str(tmp_path / "data")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert listen in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "data" / "events.db").exists()  # refused before the log opened


def test_refused_from_headers_before_the_body_is_read(http: Http) -> None:
    """As over gRPC: a call without a valid token is refused before its body is parsed
    (an unparsable body from nobody is 401, not 400), two tokens are ambiguous, and a body
    over MEMSVC_MAX_REQUEST_MB (16 MiB) is refused without reading it whole."""
    unparsable = b"{not json" + b" " * 1_000_000
    for token in (None, "wrong-token-0123456789"):
        reply = http.post("EmbedDb", unparsable, token, **{"Content-Type": "application/json"})
        assert reply.status_code == 401, reply.text
        info = error_details_pb2.ErrorInfo.FromString(details_of(reply)["google.rpc.ErrorInfo"])
        assert info.reason in ("TOKEN_MISSING", "TOKEN_UNKNOWN")
    twice = httpx2.post(
        f"{http.base}/memsvc.v1.MemoryService/EmbedChunk",
        content=b'{"query": "x"}',
        headers=[
            ("Content-Type", "application/json"),
            ("Authorization", f"Bearer {READER}"),
            ("Authorization", f"Bearer {ADMIN}"),
        ],
        timeout=60,
    )
    assert twice.status_code == 401
    assert "google.rpc.ErrorInfo" in details_of(twice)
    info = error_details_pb2.ErrorInfo.FromString(details_of(twice)["google.rpc.ErrorInfo"])
    assert info.reason == "TOKEN_AMBIGUOUS"
    huge = http.post(
        "EmbedBatch", b"x" * (16 * 1024 * 1024 + 1), READER, **{"Content-Type": "application/proto"}
    )
    assert huge.status_code == 429 and huge.json()["code"] == "resource_exhausted"


@pytest.mark.parametrize("value", [b"\xb2", "١٢".encode(), b"12x", b"-5", b"12345678901", b""])
def test_a_malformed_timeout_header_is_a_connect_error(http: Http, value: bytes) -> None:
    """Regression (issue 37, 11): Connect-Timeout-Ms of non-ASCII digits ("²" passes
    str.isdigit) was a plain-text 500."""
    reply = httpx2.post(
        f"{http.base}/memsvc.v1.MemoryService/GetIndexStatus",
        content=b"{}",
        headers=[
            (b"Content-Type", b"application/json"),
            (b"Authorization", f"Bearer {READER}".encode()),
            (b"Connect-Timeout-Ms", value),
        ],
        timeout=30,
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["code"] == "invalid_argument"
    assert "connect-timeout-ms" in reply.json()["message"]


def test_no_cors_by_default(http: Http) -> None:
    # MEMSVC_HTTP_CORS_ORIGINS unset: a browser's preflight gets no allowance and responses
    # name no origin, so pages on other origins cannot call (tests/browser: when set)
    origin = {"Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"}
    preflight = httpx2.options(f"{http.base}/memsvc.v1.MemoryService/EmbedDb", headers=origin)
    assert preflight.status_code >= 400
    assert "access-control-allow-origin" not in preflight.headers
    # and a call that a page on another origin sends without preflight is refused outright,
    # token or not (tests/integration/test_dns_rebinding.py: the Host and Origin policy)
    reply = http.post("GetIndexStatus", {"conversationIds": ["h1"]}, Origin=origin["Origin"])
    assert reply.status_code == 403 and "access-control-allow-origin" not in reply.headers


def test_openapi_describes_every_rpc_and_is_valid(http: Http) -> None:
    # /openapi.json: generated from the proto and its comments (make proto), an OpenAPI 3.1
    # document that validates, one POST per RPC, the comments as descriptions (issue 40)
    from openapi_spec_validator import validate

    from memsvc.v1 import memory_pb2 as pb

    served = httpx2.get(f"{http.base}/openapi.json", timeout=30)
    assert served.status_code == 200
    document = served.json()
    validate(document)
    service = pb.DESCRIPTOR.services_by_name["MemoryService"]
    assert set(document["paths"]) == {f"/memsvc.v1.MemoryService/{m.name}" for m in service.methods}
    schemas = document["components"]["schemas"]
    append = schemas["AppendEventsRequest"]["properties"]
    assert (
        "assignTurnIds" in append and "numbers the events" in append["assignTurnIds"]["description"]
    )
    assert schemas["MemoryEvent"]["properties"]["turnId"]["type"] == ["string", "integer"]
    assert schemas["SearchMode"]["enum"][0] == "SEARCH_MODE_UNSPECIFIED"


def test_explain_and_caller_over_http(http: Http) -> None:
    """The console's calls (issue 41) in the JSON mapping: a search's explanation, and who
    the token makes its caller."""
    http.ok("AppendEvents", {"events": [{**EVENTS[0], "conversationId": "hx"}]})
    http.ok("WaitForIndexed", {"conversationId": "hx", "turnId": 0, "timeoutMs": 120000})
    found = http.ok(
        "EmbedDb",
        {"queryText": "passport drawer", "filters": {"conversationIds": ["hx"]}, "explain": True},
        READER,
    )
    why = found["hits"][0]["explanation"]
    assert why["denseRank"] == 1 and why["keywordRank"] == 1
    assert why["fusedScore"] == found["hits"][0]["score"]
    assert why["matchedTerms"] == ["passport", "drawer"]
    status = http.ok("GetIndexStatus", {"conversationIds": ["hx"]}, READER)
    assert status["caller"] == {
        "role": "reader",
        "authenticated": True,
        "conversationPrefixes": [],
    }
    assert status["conversations"][0]["lastTimestamp"] == EVENTS[0]["timestamp"]
    assert int(status["figures"]["searches"]) >= 1
    assert http.ok("GetIndexStatus", {}, ADMIN)["caller"]["role"] == "admin"
