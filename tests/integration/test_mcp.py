"""MCP (issue 26): the SDK's own client against `memsvc mcp` in a child process, over stdio
and over streamable HTTP, in front of a real memsvc with tokens."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CallToolResult, TextContent

from memsvc.app import Services
from memsvc.domain.access import Role
from memsvc.transports.grpc.auth import TokenTable
from memsvc.transports.grpc.server import start_server
from tests.integration.test_security import TOKENS, write_tokens
from tests.support.launch import free_port

TOOLS = {"add_turns", "search_memory", "delete_turns", "memory_status"}
TURNS = [
    {
        "turn_id": 0,
        "speaker": "user",
        "text": "My sister Ana moved to Lisbon last spring and teaches surfing there.",
        "timestamp": "2026-03-02T09:00:00+01:00",
        "speaker_name": "Rui",
    },
    {
        "turn_id": 1,
        "speaker": "assistant",
        "text": "That sounds lovely. Does she enjoy the Atlantic waves?",
        "timestamp": "2026-03-02T09:00:30+01:00",
    },
]


@pytest.fixture()
def target(services: Services, tmp_path: Path) -> Iterator[str]:
    """A memsvc with reader, writer and admin tokens, in process on port 0."""
    running = start_server("127.0.0.1:0", tokens=TokenTable(write_tokens(tmp_path / "t", TOKENS)))
    running.mark_ready(services)
    yield f"127.0.0.1:{running.port}"
    running.stop(0)


def mcp_env() -> dict[str, str]:
    return {"PYTHONPATH": os.getcwd(), "MEMSVC_TOKEN": ""}


def documented_host_config() -> dict[str, Any]:
    """The `mcpServers` entry the MCP page shows a desktop agent."""
    page = (Path(__file__).parents[2] / "docs" / "surfaces" / "mcp.md").read_text()
    blocks = re.findall(r"```json\n(.*?)```", page, re.S)
    config = next(json.loads(b) for b in blocks if "mcpServers" in b)
    entry: dict[str, Any] = config["mcpServers"]["memory"]
    return entry


def stdio(target: str, token: str) -> Client:
    """Started as an agent host does from `memsvc mcp --print-config` (the MCP page's
    entry): its command and arguments exactly, without the venv on PATH."""
    printed = subprocess.run(
        [sys.executable, "-m", "memsvc", "mcp", "--print-config", "--target", target],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    entry = json.loads(printed.stdout)["mcpServers"]["memory"]
    documented = documented_host_config()
    assert set(entry) | {"env"} == set(documented) and set(documented["env"]) == {"MEMSVC_TOKEN"}
    assert entry["args"] == [target if a == "127.0.0.1:50051" else a for a in documented["args"]]
    assert Path(entry["command"]).is_absolute() and documented["command"].endswith(
        "/.venv/bin/python"
    )
    return Client(
        StdioServerParameters(
            command=entry["command"],
            args=entry["args"],
            env={"PATH": "/usr/bin:/bin", "MEMSVC_TOKEN": token},
        )
    )


@pytest.fixture()
def http_gateway(target: str) -> Iterator[str]:
    """`memsvc mcp --listen` in a child process; yields its /mcp URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "memsvc", "mcp", "--target", target],
        env={**os.environ, **mcp_env(), "MEMSVC_MCP_LISTEN": f"127.0.0.1:{port}"},
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx2.get(url, timeout=2)
            break
        except httpx2.TransportError:
            assert proc.poll() is None, "memsvc mcp exited"
            assert time.monotonic() < deadline, "memsvc mcp never listened"
            time.sleep(0.2)
    yield url
    proc.terminate()
    assert proc.wait(timeout=30) is not None


def http(url: str, token: str) -> Client:
    headers = {"Authorization": f"Bearer {token}"}
    return Client(streamable_http_client(url, http_client=create_mcp_http_client(headers=headers)))


def text_of(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


async def flow(writer: Client, reader: Client, conversation: str) -> None:
    """list tools → add (wait) → search finds → delete → search does not; a reader cannot
    add; a bad call is a tool error naming the field."""
    async with writer, reader:
        listed = (await writer.list_tools()).tools
        assert {t.name for t in listed} == TOOLS
        by_name = {t.name: t for t in listed}
        assert by_name["search_memory"].annotations is not None
        assert by_name["search_memory"].annotations.read_only_hint is True
        assert by_name["delete_turns"].annotations is not None
        assert by_name["delete_turns"].annotations.destructive_hint is True
        add_schema = by_name["add_turns"].input_schema
        assert set(add_schema["required"]) == {"conversation_id", "turns"}
        assert by_name["search_memory"].output_schema is not None

        added = await writer.call_tool(
            "add_turns", {"conversation_id": conversation, "turns": TURNS, "wait": True}
        )
        assert not added.is_error, text_of(added)
        assert added.structured_content == {
            "accepted": 2,
            "duplicates": 0,
            "turn_ids": [0, 1],
            "indexed": True,
            "backlog": 0,
        }
        assert "searchable now" in text_of(added)

        query = {"query": "where does Ana teach surfing", "conversation_ids": [conversation]}
        found = await reader.call_tool("search_memory", query)
        assert not found.is_error, text_of(found)
        assert found.structured_content is not None
        hits: list[dict[str, Any]] = found.structured_content["hits"]
        assert hits and "Lisbon" in hits[0]["text"]
        assert hits[0]["conversation_id"] == conversation
        assert (hits[0]["turn_start"], hits[0]["turn_end"]) == (0, 1)
        assert "Lisbon" in text_of(found) and f"{conversation} turns 0-1" in text_of(found)

        status = await reader.call_tool("memory_status", {"conversation_ids": [conversation]})
        assert status.structured_content is not None
        assert status.structured_content["conversations"][0]["last_indexed_turn"] == 1

        refused = await reader.call_tool(
            "add_turns", {"conversation_id": conversation, "turns": TURNS}
        )
        assert refused.is_error and "PERMISSION_DENIED (ROLE_TOO_LOW)" in text_of(refused)

        bad_turn = dict(TURNS[1], turn_id=2, timestamp="yesterday")
        bad = await writer.call_tool(
            "add_turns", {"conversation_id": conversation, "turns": [bad_turn]}
        )
        assert bad.is_error and "turns[0].timestamp" in text_of(bad), text_of(bad)
        bad = await reader.call_tool("search_memory", dict(query, time_from="soon"))
        assert bad.is_error and "INVALID_ARGUMENT: time_from" in text_of(bad), text_of(bad)

        deleted = await writer.call_tool("delete_turns", {"conversation_id": conversation})
        assert not deleted.is_error, text_of(deleted)
        assert deleted.structured_content is not None
        assert deleted.structured_content["turns_deleted"] == 2
        after = await reader.call_tool("search_memory", query)
        assert after.structured_content == {
            "query": query["query"],
            "mode": "hybrid",
            "hits": [],
            "standing": [],
        }


async def agent_flow(writer: Client, conversation: str) -> None:
    """What agents do: send turns without ids or timestamps, then more; memsvc numbers them
    after the last turn and stamps the time of receipt; the errors name only what the tool
    has (issue 40)."""
    async with writer:
        said = [
            {"speaker": "user", "text": "Please always answer me in French from now on."},
            {"speaker": "assistant", "text": "D'accord, je répondrai en français."},
        ]
        first = await writer.call_tool(
            "add_turns", {"conversation_id": conversation, "turns": said, "wait": True}
        )
        assert not first.is_error, text_of(first)
        assert first.structured_content is not None
        assert first.structured_content["turn_ids"] == [0, 1]
        assert first.structured_content["indexed"] is True
        assert "as turn(s) 0-1" in text_of(first)
        more = [{"speaker": "user", "text": "What did I ask about the language?"}]
        second = await writer.call_tool(
            "add_turns", {"conversation_id": conversation, "turns": more}
        )
        assert second.structured_content is not None
        assert second.structured_content["turn_ids"] == [2]
        mixed = await writer.call_tool(
            "add_turns",
            {"conversation_id": conversation, "turns": [dict(more[0], turn_id=3), more[0]]},
        )
        assert mixed.is_error and "give every turn an id, or none" in text_of(mixed)
        gap = dict(more[0], turn_id=9, timestamp="2026-03-02T09:00:00+01:00")
        refused = await writer.call_tool(
            "add_turns", {"conversation_id": conversation, "turns": [gap]}
        )
        assert refused.is_error and "omit turn_id" in text_of(refused), text_of(refused)
        assert "allow_gaps" not in text_of(refused)
        await writer.call_tool(
            "delete_turns", {"conversation_id": conversation, "turn_start": 2, "turn_end": 2}
        )
        again = dict(more[0], turn_id=2, timestamp="2026-03-02T09:00:00+01:00")
        deleted = await writer.call_tool(
            "add_turns", {"conversation_id": conversation, "turns": [again]}
        )
        assert deleted.is_error and "stay deleted" in text_of(deleted), text_of(deleted)
        assert "restore" not in text_of(deleted) and "Omit turn_id" in text_of(deleted)
        after = await writer.call_tool(
            "add_turns", {"conversation_id": conversation, "turns": more}
        )
        assert after.structured_content is not None
        assert after.structured_content["turn_ids"] == [3]  # a deleted id is never reused
        # issue 62, item 8: a call retried with its request_id is stored once
        keyed = {"conversation_id": conversation, "turns": more, "request_id": "r-7f3a"}
        once = await writer.call_tool("add_turns", keyed)
        twice = await writer.call_tool("add_turns", keyed)
        assert once.structured_content is not None and twice.structured_content is not None
        assert once.structured_content == twice.structured_content
        assert once.structured_content["turn_ids"] == [4]
        other = await writer.call_tool("add_turns", {**keyed, "turns": said[:1]})
        assert other.is_error and "request_id" in text_of(other), text_of(other)
        # issue 81, item 6: without request_id, the same call sent again at once (its
        # answer lost) is stored once; a real repeat ("ok", the reply, "ok") is stored
        ok = [{"speaker": "user", "text": "ok"}]
        reply = [{"speaker": "assistant", "text": "Glad to help."}]
        sent = [
            await writer.call_tool("add_turns", {"conversation_id": conversation, "turns": t})
            for t in (ok, ok, reply, ok)
        ]
        ids = [r.structured_content["turn_ids"] for r in sent if r.structured_content]
        assert ids == [[5], [5], [6], [7]], ids  # the second "ok" was the first again


def test_agents_add_turns_without_ids_or_times(target: str) -> None:
    asyncio.run(agent_flow(stdio(target, TOKENS[Role.WRITER]), "mcp-agent"))


def test_mcp_over_stdio(target: str) -> None:
    asyncio.run(
        flow(stdio(target, TOKENS[Role.WRITER]), stdio(target, TOKENS[Role.READER]), "mcp-io")
    )


def test_mcp_over_streamable_http(target: str, http_gateway: str) -> None:
    asyncio.run(
        flow(
            http(http_gateway, TOKENS[Role.WRITER]),
            http(http_gateway, TOKENS[Role.READER]),
            "mcp-http",
        )
    )


def test_mcp_http_needs_a_token_memsvc_accepts(target: str, http_gateway: str) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    for auth in ({}, {"Authorization": "Bearer not-a-token-0123456789"}, {"Authorization": "x"}):
        reply = httpx2.post(http_gateway, json=body, headers={**headers, **auth}, timeout=30)
        assert reply.status_code == 401
        assert reply.headers["www-authenticate"].startswith("Bearer")
        assert reply.json()["code"] == "unauthenticated"


def test_mcp_stdio_tool_errors_when_memsvc_is_down(tmp_path: Path) -> None:
    """A memsvc that is not there is a tool error with retry advice, not a dead session."""

    async def calls() -> tuple[CallToolResult, CallToolResult]:
        async with stdio(f"127.0.0.1:{free_port()}", "any") as client:
            first = await client.call_tool("memory_status", {})
            second = await client.call_tool("search_memory", {"query": "anything"})
            return first, second

    for result in asyncio.run(calls()):
        assert result.is_error
        assert "UNAVAILABLE (MEMSVC_UNREACHABLE): cannot reach memsvc at" in text_of(result)
        assert "retry the same call" in text_of(result)


def gateway(target: str, listen: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "memsvc", "mcp", "--target", target, "--listen", listen, *args],
        env={**os.environ, **mcp_env()},
        stderr=subprocess.PIPE,
    )


def wait_listening(url: str, proc: subprocess.Popen[bytes]) -> None:
    port = int(url.split(":")[2].split("/")[0])
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return
        except OSError:
            assert proc.poll() is None, "memsvc mcp exited"
            assert time.monotonic() < deadline, "memsvc mcp never listened"
            time.sleep(0.2)


LIST_TOOLS = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
ACCEPT = {"Accept": "application/json, text/event-stream"}


def test_9_a_foreign_origin_is_refused(target: str) -> None:
    """Regression (issue 37, 9): the HTTP gateway served any Origin: a page on another
    site read and deleted data through a user's browser."""
    port = free_port()
    proc = gateway(target, f"127.0.0.1:{port}", "--allowed-origins", "https://app.example.com")
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        wait_listening(url, proc)
        auth = {"Authorization": f"Bearer {TOKENS[Role.READER]}", **ACCEPT}
        for origin in ("https://evil.example", "null", "http://localhost.evil.example"):
            reply = httpx2.post(url, json=LIST_TOOLS, headers={**auth, "Origin": origin})
            assert reply.status_code == 403, origin
            assert reply.json()["code"] == "permission_denied"
        for origin in ("http://localhost:5173", "http://127.0.0.1:8080", "https://app.example.com"):
            reply = httpx2.post(url, json=LIST_TOOLS, headers={**auth, "Origin": origin})
            assert reply.status_code == 200, (origin, reply.text)
        assert httpx2.post(url, json=LIST_TOOLS, headers=auth).status_code == 200  # no Origin
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_9_a_non_loopback_gateway_before_a_tokenless_memsvc_is_refused(
    services: Services,
) -> None:
    """Regression (issue 37, 9): `memsvc mcp --listen 0.0.0.0:…` in front of a memsvc
    without tokens served any network client. memsvc itself refuses such a listen."""
    running = start_server("127.0.0.1:0")  # no tokens
    running.mark_ready(services)
    target = f"127.0.0.1:{running.port}"
    try:
        refused = gateway(target, f"0.0.0.0:{free_port()}")
        assert refused.wait(timeout=60) == 2
        assert b"without a token" in (refused.stderr.read() if refused.stderr else b"")
        port = free_port()
        allowed = gateway(target, f"0.0.0.0:{port}", "--allow-insecure")
        try:
            wait_listening(f"http://127.0.0.1:{port}/mcp", allowed)
            reply = httpx2.post(f"http://127.0.0.1:{port}/mcp", json=LIST_TOOLS, headers=ACCEPT)
            assert reply.status_code == 200
        finally:
            allowed.terminate()
            allowed.wait(timeout=30)
    finally:
        running.stop(0)
