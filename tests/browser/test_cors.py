"""Browsers on another origin call the HTTP surface only where MEMSVC_HTTP_CORS_ORIGINS lets
them (issue 40): a real Chromium page on an allowed origin appends, waits and searches with
its bearer token and reads error bodies; a page on another origin is refused by the browser
itself (its preflight gets no allowance), and no call reaches memsvc."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from memsvc.transports.grpc.auth import Role
from tests.browser.conftest import PageServer
from tests.integration.test_security import TOKENS, write_tokens
from tests.support.launch import free_port, start_child, wait_serving

pytestmark = pytest.mark.browser

WRITER = TOKENS[Role.WRITER]

# What a web app does: fetch() with the token in a header and a JSON body.
CALL = """async ([url, token, body]) => {
  try {
    const reply = await fetch(url, {
      method: "POST",
      headers: {"Content-Type": "application/json", "Authorization": "Bearer " + token,
                "Connect-Protocol-Version": "1", "Connect-Timeout-Ms": "60000"},
      body: JSON.stringify(body),
    });
    return {status: reply.status, body: await reply.json()};
  } catch (error) {
    return {status: 0, error: String(error)};
  }
}"""


@pytest.fixture(scope="module")
def pages() -> Iterator[tuple[PageServer, PageServer]]:
    allowed, other = PageServer("<h1>app</h1>"), PageServer("<h1>elsewhere</h1>")
    yield allowed, other
    allowed.close()
    other.close()


@pytest.fixture(scope="module")
def memsvc_http(
    tmp_path_factory: pytest.TempPathFactory, pages: tuple[PageServer, PageServer]
) -> Iterator[str]:
    root = tmp_path_factory.mktemp("cors")
    tokens = write_tokens(root / "tokens", TOKENS)
    port, http_port = free_port(), free_port()
    proc = start_child(
        root / "data",
        port,
        "--auth-tokens-file",
        str(tokens),
        "--http-listen",
        f"127.0.0.1:{http_port}",
        env={"MEMSVC_HTTP_CORS_ORIGINS": f"{pages[0].origin}, https://app.example.com"},
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, proc)
        yield f"http://127.0.0.1:{http_port}/memsvc.v1.MemoryService"
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def _call(page: Any, url: str, body: dict[str, Any], token: str = WRITER) -> dict[str, Any]:
    result: dict[str, Any] = page.evaluate(CALL, [url, token, body])
    return result


def _event(conv: str, text: str) -> dict[str, Any]:
    return {
        "conversation_id": conv,
        "turn_id": 0,
        "speaker": "user",
        "text": text,
        "timestamp": "2026-02-02T10:15:30+08:00",
    }


def test_an_allowed_origin_writes_and_finds(
    browser: Any, pages: tuple[PageServer, PageServer], memsvc_http: str
) -> None:
    page = browser.new_page()
    page.goto(pages[0].origin)
    events = [_event("b1", "My bike is locked in the courtyard behind the bakery.")]
    appended = _call(page, f"{memsvc_http}/AppendEvents", {"events": events})
    assert appended["status"] == 200 and appended["body"]["accepted"] == 1, appended
    waited = _call(
        page,
        f"{memsvc_http}/WaitForIndexed",
        {"conversationId": "b1", "turnId": 0, "timeoutMs": 60000},
    )
    assert waited["status"] == 200 and waited["body"].get("indexed") is True, waited
    found = _call(
        page,
        f"{memsvc_http}/EmbedDb",
        {"queryText": "where is the bike?", "filters": {"conversationIds": ["b1"]}},
    )
    assert found["status"] == 200, found
    assert "courtyard" in found["body"]["hits"][0]["text"]
    # errors are readable from the page too: code, message
    refused = _call(page, f"{memsvc_http}/EmbedDb", {"queryText": "x"}, token="wrong")
    assert refused["status"] == 401 and refused["body"]["code"] == "unauthenticated", refused
    scope = {"conversationIds": ["b1"]}
    bad = _call(
        page, f"{memsvc_http}/EmbedDb", {"queryText": "x", "topK": 100000, "filters": scope}
    )
    assert bad["status"] == 400 and "top_k" in bad["body"]["message"], bad
    page.close()


def test_another_origin_is_refused_by_the_browser(
    browser: Any, pages: tuple[PageServer, PageServer], memsvc_http: str
) -> None:
    page = browser.new_page()
    page.goto(pages[1].origin)
    events = [_event("b2", "written from a page that may not")]
    refused = _call(page, f"{memsvc_http}/AppendEvents", {"events": events})
    assert refused["status"] == 0 and "Failed to fetch" in refused["error"], refused
    page.close()
    # nothing reached memsvc: nothing was ever appended to b2
    allowed = browser.new_page()
    allowed.goto(pages[0].origin)
    never = _call(allowed, f"{memsvc_http}/WaitForIndexed", {"conversationId": "b2"})
    assert never["status"] == 404 and never["body"]["code"] == "not_found", never
    allowed.close()
