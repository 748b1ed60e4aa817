"""GetIndexStatus pages (issue 62, item 11): at 30,000 conversations one reply was 4 MiB, so
`memsvc list`, `memsvc status` and MCP `memory_status` failed and the console's poll took
3.3 s. Now a reply without conversation ids is one page (by id, keyset, at most 1,000 and
3 MiB) with the totals over every conversation apart; filters by state and prefix. Here 3,000
conversations (indexing paused: the subject is the list) through the service, gRPC and
the CLI, in this process but the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest

from memsvc.app import Services
from memsvc.domain.access import FULL
from memsvc.domain.errors import InvalidArgument
from memsvc.domain.types import MemoryEvent
from memsvc.transports.grpc.server import start_server
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc

COUNT = 3000


def conversation_id(i: int) -> str:
    return f"{'team-a' if i % 3 else 'team-b'}/user-{i:05d}"


@pytest.fixture()
def many(services: Services) -> Iterator[tuple[Services, str]]:
    services.control.set_paused(True, FULL)
    events = [
        MemoryEvent(conversation_id(i), 0, "user", f"hello {i}", "2026-02-02T10:00:00+00:00")
        for i in range(COUNT)
    ]
    assert services.ingest.append(events).accepted == COUNT
    running = start_server("127.0.0.1:0")
    running.mark_ready(services)
    try:
        yield services, f"127.0.0.1:{running.port}"
    finally:
        running.stop(0)


def test_pages_cover_every_conversation_once_with_the_totals_apart(
    many: tuple[Services, str],
) -> None:
    services, target = many
    stub = pb_grpc.MemoryServiceStub(grpc.insecure_channel(target))  # type: ignore[no-untyped-call]
    seen: list[str] = []
    token, pages = "", 0
    while True:
        reply = stub.GetIndexStatus(pb.GetIndexStatusRequest(page_token=token), timeout=60)
        assert reply.total_conversations == COUNT and reply.total_backlog == COUNT
        assert reply.pending == COUNT
        assert len(reply.conversations) <= 1000 and reply.ByteSize() < 4 * 1024 * 1024
        seen += [c.conversation_id for c in reply.conversations]
        pages += 1
        token = reply.next_page_token
        if not token:
            break
    assert pages == 3 and seen == sorted(conversation_id(i) for i in range(COUNT))
    # filters: a prefix, and states
    team_b = stub.GetIndexStatus(
        pb.GetIndexStatusRequest(conversation_prefix="team-b/", page_size=5000), timeout=60
    )
    assert len(team_b.conversations) == 1000 and not team_b.next_page_token
    assert all(c.conversation_id.startswith("team-b/") for c in team_b.conversations)
    idle = stub.GetIndexStatus(pb.GetIndexStatusRequest(states=["idle"]), timeout=60)
    assert list(idle.conversations) == [] and idle.total_conversations == COUNT
    # named conversations are answered as before, whatever the page size
    named = stub.GetIndexStatus(
        pb.GetIndexStatusRequest(conversation_ids=[conversation_id(7)]), timeout=60
    )
    assert [c.conversation_id for c in named.conversations] == [conversation_id(7)]
    with pytest.raises(InvalidArgument, match=r"states\[0\]"):
        services.control.status_page(0, "", ["sleeping"], "", FULL)
    with pytest.raises(InvalidArgument, match="page_token"):
        services.control.status_page(0, "not-a-token", [], "", FULL)


def test_the_cli_lists_and_summarises_many_conversations(many: tuple[Services, str]) -> None:
    _, target = many

    def memsvc(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "memsvc", *args, "--target", target],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done

    listed = json.loads(memsvc("list", "--limit", "50", "--json").stdout)
    assert len(listed["conversations"]) == 50
    after = listed["next_after"]
    more = json.loads(memsvc("list", "--limit", "1200", "--after", after, "--json").stdout)
    ids = [c["conversation_id"] for c in more["conversations"]]
    assert len(ids) == 1200 and ids[0] > after and ids == sorted(ids)
    status = memsvc("status").stdout
    assert f"{COUNT} conversations, backlog {COUNT} turns" in status
    assert "memsvc list for every conversation" in status
