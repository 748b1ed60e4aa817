"""The README's quick start, run as written against a real server in a child process (issue
27: its first call sequence once returned zero hits). The CLI lines run as commands; the
grpcurl lines' requests are sent in order over gRPC (grpcurl itself is not installable
here); the Python block runs as is. The curl block runs in tests/integration/test_http.py,
the MCP host configuration in tests/integration/test_mcp.py."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from memsvc.v1 import memory_pb2 as pb
from tests.support.launch import free_port, start_child, wait_serving

# the module's shared fixture starts once: every test of it on one worker (make test: loadgroup)
pytestmark = pytest.mark.xdist_group("readme-server")

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
DOCUMENTED = "127.0.0.1:50051"


def section(title: str) -> str:
    return README.split(f"### {title}\n", 1)[1].split("\n### ", 1)[0]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    proc = start_child(tmp_path_factory.mktemp("readme") / "data", port)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, proc)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_the_quick_start_cli_lines(target: str) -> None:
    lines = [line for line in blocks(section("Calling it"), "sh")[0].splitlines() if line.strip()]
    assert lines and all(line.startswith(".venv/bin/memsvc ") for line in lines)
    outputs = []
    for line in lines:
        argv = shlex.split(line)
        command = [sys.executable, "-m", "memsvc", *argv[1:], "--target", target]
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
        )
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    assert "accepted 10, duplicates 0, errors 0" in outputs[0]
    assert "sister" in outputs[1]  # who looks after the dog: the turn about Biscuit
    assert "idle" in outputs[2]


def test_the_quick_start_grpcurl_sequence_finds_what_it_wrote(target: str) -> None:
    block = blocks(section("Calling it"), "sh")[1]
    calls: list[tuple[str, str]] = re.findall(
        r"-d '(.*?)' \\\n\s*127\.0\.0\.1:50051 ([\w./]+)", block, re.S
    )
    assert [m.rpartition("/")[2] for _, m in calls] == [
        "AppendEvents",
        "WaitForIndexed",
        "EmbedDb",
    ]
    replies: list[dict[str, Any]] = []
    with grpc.insecure_channel(target) as channel:
        for body, method in calls:
            name = method.rpartition("/")[2]
            request = getattr(pb, f"{name}Request")
            response = getattr(pb, f"{name}Response")
            call = channel.unary_unary(
                f"/{method}",
                request_serializer=request.SerializeToString,
                response_deserializer=response.FromString,
            )
            reply = call(json_format.Parse(body, request()), timeout=300)
            replies.append(json_format.MessageToDict(reply))
    assert replies[0] == {"accepted": 2}
    assert replies[1]["indexed"] is True
    assert "抽屉" in replies[2]["hits"][0]["text"]


def test_the_python_example(target: str) -> None:
    code = blocks(section("Calling it"), "python")[0]
    assert DOCUMENTED in code
    scope: dict[str, Any] = {}
    exec(compile(code.replace(DOCUMENTED, target), "README.md", "exec"), scope)
    assert "Biscuit" in scope["hits"][0].text
