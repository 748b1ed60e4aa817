"""DNS rebinding (issue 62, item 1): a web page whose name is re-pointed at 127.0.0.1 reaches
a tokenless loopback HTTP listener as a same-origin page, `Host: attacker.example`. It must
get nothing: no export, no status, no delete, not the console; the listener's own names,
loopback origins and the allow-listed names still work. The listener and the gRPC server
run in this process (the subject is the HTTP front, not process life)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx2
import pytest

from memsvc.app import Services
from memsvc.transports.console import console_routes
from memsvc.transports.grpc.server import RunningServer, start_server
from memsvc.transports.http.hosts import HostPolicy
from memsvc.transports.http.server import HttpServer, bind
from tests.conftest import turn

SECRET = "the vault code is 7391"
API = "/memsvc.v1.MemoryService"


@dataclass
class Listener:
    base: str
    port: int

    def post(self, method: str, body: object, **headers: str) -> httpx2.Response:
        return httpx2.post(f"{self.base}{API}/{method}", json=body, headers=headers, timeout=60)


def listening(running: RunningServer, policy: HostPolicy) -> HttpServer:
    return HttpServer(
        bind("127.0.0.1:0"), running.bridge_target, None, None, hosts=policy, pages=console_routes()
    ).start()


@pytest.fixture()
def tokenless(services: Services) -> Iterator[Listener]:
    """A tokenless gRPC server and its loopback HTTP listener, as `memsvc serve
    --http-listen 127.0.0.1:PORT` without a tokens file builds them."""
    services.ingest.append([turn("victim", 0, SECRET)])
    running = start_server("127.0.0.1:0", bridge=True)
    running.mark_ready(services)
    http = listening(running, HostPolicy(allowed_hosts=frozenset({"memsvc.internal"})))
    try:
        yield Listener(f"http://127.0.0.1:{http.port}", http.port)
    finally:
        http.stop(0)
        running.stop(0)


def rebound(listener: Listener) -> dict[str, str]:
    """The headers a browser sends from the attacker's page once its name points here."""
    origin = f"http://attacker.example:{listener.port}"
    return {"Host": f"attacker.example:{listener.port}", "Origin": origin}


def test_a_rebound_page_reads_lists_and_deletes_nothing(tokenless: Listener) -> None:
    headers = rebound(tokenless)
    calls = [
        ("ExportEvents", {"conversationId": "victim"}),
        ("GetIndexStatus", {}),
        ("LogicalDeleteBySource", {"conversationId": "victim"}),
    ]
    for method, body in calls:
        reply = tokenless.post(method, body, **headers)
        assert reply.status_code == 403, (method, reply.text)
        assert reply.json()["code"] == "permission_denied"
        assert "attacker.example" in reply.json()["message"]
        assert SECRET not in reply.text
    # the Host alone tells: a page that sends no Origin (a GET of the console) is refused too
    page = httpx2.get(f"{tokenless.base}/console/", headers={"Host": headers["Host"]})
    assert page.status_code == 403
    # nothing was deleted: the listener's own name still exports the turn
    kept = tokenless.post("ExportEvents", {"conversationId": "victim"})
    assert kept.status_code == 200 and SECRET in kept.text


@pytest.mark.parametrize(
    "headers",
    [
        {},  # httpx sends Host: 127.0.0.1:PORT
        {"Host": "localhost:{port}", "Origin": "http://localhost:{port}"},
        {"Host": "[::1]:{port}"},
        {"Host": "memsvc.internal:{port}", "Origin": "http://memsvc.internal:{port}"},
        {"Origin": "http://127.0.0.1:5173"},  # a local dev page on another loopback port
    ],
)
def test_the_listeners_own_names_and_loopback_origins_still_work(
    tokenless: Listener, headers: dict[str, str]
) -> None:
    sent = {k: v.format(port=tokenless.port) for k, v in headers.items()}
    reply = tokenless.post("ExportEvents", {"conversationId": "victim"}, **sent)
    assert reply.status_code == 200, reply.text
    assert SECRET in reply.text


def test_a_foreign_origin_is_refused_even_with_a_loopback_host(tokenless: Listener) -> None:
    reply = tokenless.post(
        "ExportEvents", {"conversationId": "victim"}, Origin="https://attacker.example"
    )
    assert reply.status_code == 403
    assert SECRET not in reply.text


@pytest.mark.parametrize(
    ("host", "refused"),
    [
        ("127.0.0.1:8080", False),
        ("localhost", False),
        ("LOCALHOST:1", False),
        ("[::1]:8080", False),
        ("10.1.2.3:8080", False),  # an address: no page can be served from it but its own
        ("[fe80::1]", False),
        ("memsvc.internal:8080", False),
        ("attacker.example:8080", True),
        ("localhost.attacker.example", True),
        ("127.0.0.1.nip.io:8080", True),
        ("localhost:abc", True),
        ("user@localhost", True),
        ("localhost/x", True),
        ("", True),
    ],
)
def test_host_policy(host: str, refused: bool) -> None:
    policy = HostPolicy(allowed_hosts=frozenset({"memsvc.internal"}))
    assert (policy.host_refusal(host) is not None) is refused
    # beyond loopback with tokens, names are the operator's
    assert HostPolicy(check_host=False).host_refusal(host) is None
    assert HostPolicy(allowed_hosts=frozenset({"*"})).host_refusal(host) is None


@pytest.mark.parametrize(
    ("origin", "host", "refused"),
    [
        (None, "attacker.example", False),  # not a browser
        ("http://memsvc.example:8080", "memsvc.example:8080", False),  # the console's own
        ("http://localhost:3000", "memsvc.example:8080", False),
        ("https://app.example", "memsvc.example:8080", False),  # a CORS origin
        ("https://memsvc.internal", "10.0.0.1:8080", False),  # allow-listed name
        ("https://evil.example", "memsvc.example:8080", True),
        ("null", "127.0.0.1:8080", True),  # a sandboxed frame or file://
        ("ftp://localhost", "127.0.0.1:8080", True),
    ],
)
def test_origin_policy(origin: str | None, host: str, refused: bool) -> None:
    policy = HostPolicy(
        allowed_hosts=frozenset({"memsvc.internal"}), cors_origins=("https://app.example",)
    )
    assert (policy.origin_refusal(origin, host) is not None) is refused
    assert HostPolicy(cors_origins=("*",)).origin_refusal(origin, host) is None
