"""A model move, said where a user looks (issue 82): a memsvc that served all-MiniLM-L6-v2
restarts on multilingual-e5-small, and while its vectors are rebuilt from the log (held
open here: indexing paused before the restart) the console's banner says so and counts the
conversations, `memsvc status` says the same, /metrics has the move's gauge, and a search
from the CLI still finds the turns; resumed, the move ends and the banner goes. Child
processes of `memsvc serve`, the CLI, the console in Chromium."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from playwright.sync_api import expect

from tests.support.launch import free_port, start_child, wait_serving

pytestmark = pytest.mark.browser
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "chat.json"


def cli(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memsvc", *args, "--target", target],
        capture_output=True,
        text=True,
        timeout=180,
    )


def serve(data: Path, model: str, *extra: str, metrics: str = "") -> tuple[Any, str]:
    port = free_port()
    env = {"MEMSVC_EMBED_MODEL": model, "MEMSVC_METRICS_LISTEN": metrics}
    proc = start_child(data, port, *extra, env=env)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        wait_serving(channel, proc)
    return proc, f"127.0.0.1:{port}"


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=60)


@pytest.fixture(scope="module")
def moving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, int]]:
    data = tmp_path_factory.mktemp("move") / "data"
    proc, target = serve(data, "sentence-transformers/all-MiniLM-L6-v2")
    try:
        for conv in ("move-a", "move-b"):
            done = cli(target, "append", str(EXAMPLE), "--messages", conv, "--wait")
            assert done.returncode == 0, done.stderr
        assert cli(target, "pause").returncode == 0
    finally:
        stop(proc)
    http_port, metrics_port = free_port(), free_port()
    proc, target = serve(
        data,
        "multilingual-e5-small",
        "--http-listen",
        f"127.0.0.1:{http_port}",
        metrics=f"127.0.0.1:{metrics_port}",
    )
    try:
        yield target, http_port, metrics_port
    finally:
        stop(proc)


def test_the_console_status_and_metrics_show_the_move_and_searches_answer(
    browser: Any, moving: tuple[str, int, int]
) -> None:
    target, http_port, metrics_port = moving
    status = cli(target, "status")
    assert "Rebuilding the vectors" in status.stdout and "0 of 2" in status.stdout, status.stdout
    found = cli(target, "search", "where am I staying in Lisbon?", "--conversation", "move-a")
    assert found.returncode == 0 and "Alfama" in found.stdout, found.stdout + found.stderr
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10)
    text = metrics.read().decode()
    assert 'memsvc_model_move_conversations{state="left"} 2.0' in text
    page = browser.new_page()
    try:
        page.goto(f"http://127.0.0.1:{http_port}/console/")
        page.fill("#token", "no-token-needed-here")
        page.click("#sign-in-form button[type=submit]")
        banner = page.locator("#model-warning")
        expect(banner).to_be_visible()
        expect(banner).to_contain_text("Model move:")
        expect(banner).to_contain_text("sentence-transformers/all-MiniLM-L6-v2")
        expect(page.locator("#server")).to_contain_text("0 of 2 conversations")
        assert cli(target, "resume").returncode == 0
        # the console refreshes its status: the banner goes once every conversation is rebuilt
        expect(page.locator("#model-warning")).to_be_hidden(timeout=120_000)
    finally:
        page.close()
    found = cli(target, "search", "where am I staying in Lisbon?", "--conversation", "move-a")
    assert "Alfama" in found.stdout, found.stdout + found.stderr
