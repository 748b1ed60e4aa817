"""The model fallback, said where a user looks (issue 66): offline, memsvc serves a bundled
model instead of the configured one, and only its log said so. Now the console shows a
warning banner saying what it means (since issue 82 the multilingual-e5-small serves, its
vectors not comparable with the configured model's) and how to fix it, and `/readyz`'s body
and `memsvc status` say the same. A memsvc whose configured model cannot be loaded (a
directory that does not exist), in a child process; the console in Chromium."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from playwright.sync_api import expect

from tests.support.launch import free_port, start_child, wait_serving

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def fallback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, int]]:
    root = tmp_path_factory.mktemp("fallback")
    port, http_port, metrics_port = free_port(), free_port(), free_port()
    proc = start_child(
        root / "data",
        port,
        "--http-listen",
        f"127.0.0.1:{http_port}",
        env={
            "MEMSVC_EMBED_MODEL": str(root / "bge-small-zh-v1.5-not-copied"),
            "MEMSVC_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
        },
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, proc)
        yield port, http_port, metrics_port
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_the_console_warns_and_says_how_to_fix_it(
    browser: Any, fallback: tuple[int, int, int]
) -> None:
    _, http_port, _ = fallback
    page = browser.new_page()
    try:
        page.goto(f"http://127.0.0.1:{http_port}/console/")
        page.fill("#token", "no-token-needed-here")
        page.click("#sign-in-form button[type=submit]")
        banner = page.locator("#model-warning")
        expect(banner).to_be_visible()
        expect(banner).to_contain_text("multilingual-e5-small")
        expect(banner).to_contain_text("not comparable")
        expect(banner).to_contain_text("MEMSVC_EMBED_MODEL")
    finally:
        page.close()


def test_readyz_and_status_say_it_too(fallback: tuple[int, int, int]) -> None:
    port, _, metrics_port = fallback
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=10).read()
    lines = body.decode().splitlines()
    assert lines[0] == "ready" and "multilingual" in lines[1]
    status = subprocess.run(
        [sys.executable, "-m", "memsvc", "status", "--target", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "WARNING: " in status.stdout and "multilingual" in status.stdout, status.stdout
