"""Backups of long conversations (issue 62, item 2): `memsvc export` of 1,200 turns of 5,000
characters exited 1 (a 5 MB page over gRPC's default 4 MiB receive limit), and `memsvc
append` of 450 turns of 40,000 characters exited 1 (500 events per call, over the 16 MiB
request limit; the test sends a tenth past that limit, 148 such turns). Pages and batches
are now cut by bytes, and memsvc's own clients receive what the server may send: the
largest allowed turn and payload, and long conversations, round-trip through export and
append byte for byte. Indexing is paused: the subject is the log's round trip, not the
model. The CLI runs as a child process, the server in this one."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from memsvc.app import Services, build_services
from memsvc.domain.access import FULL
from memsvc.domain.limits import MAX_PAYLOAD_CHARS, MAX_REQUEST_BYTES, MAX_TURN_CHARS
from memsvc.domain.pages import PAGE_BYTES
from memsvc.domain.types import MemoryEvent
from memsvc.embedding.model import Embedder
from memsvc.transports.grpc.server import start_server
from tests.conftest import make_settings, turn


@pytest.fixture()
def target(tmp_path: Path, embedder: Embedder) -> Iterator[tuple[str, Services]]:
    services = build_services(
        make_settings(tmp_path / "data", max_turn_chars=MAX_TURN_CHARS), embedder=embedder
    )
    services.control.set_paused(True, FULL)
    running = start_server("127.0.0.1:0")
    running.mark_ready(services)
    try:
        yield f"127.0.0.1:{running.port}", services
    finally:
        running.stop(0)
        services.close()


def memsvc(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "memsvc", *args, "--target", target],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def exported(target: str, conversation: str, path: Path) -> list[dict[str, object]]:
    memsvc(target, "export", "--conversation", conversation, "--output", str(path))
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def long_turns(conversation: str, count: int, chars: int) -> list[MemoryEvent]:
    # mixed scripts (CJK takes 3 bytes a character in UTF-8, emoji 4), mostly emoji: the
    # limits are in bytes, and 3.1 bytes a character (not 1.6) reach them with half the
    # characters to clean and count tokens of, at half the tokenizer's cost a byte
    unit = "🧠" * 20 + "記憶 memory "
    text = (unit * (chars // len(unit) + 1))[:chars]
    return [turn(conversation, i, f"{i} {text}"[:chars]) for i in range(count)]


def round_trip(target: str, services: Services, events: list[MemoryEvent], tmp: Path) -> None:
    conversation = events[0].conversation_id
    for start in range(0, len(events), 100):  # in calls within the request limit
        assert services.ingest.append(events[start : start + 100]).accepted == min(
            100, len(events) - start
        )
    backup = exported(target, conversation, tmp / "backup.jsonl")
    assert len(backup) == len(events)
    # restored into another conversation through `memsvc append`, then exported again
    moved = tmp / "moved.jsonl"
    moved.write_text(
        "".join(json.dumps({**e, "conversation_id": "restored"}) + "\n" for e in backup),
        encoding="utf-8",
    )
    appended = memsvc(target, "append", str(moved))
    assert f"accepted {len(events)}, duplicates 0, errors 0" in appended.stdout
    again = exported(target, "restored", tmp / "again.jsonl")
    assert again == [{**e, "conversation_id": "restored"} for e in backup]
    assert [e["text"] for e in again] == [e.text for e in events]


def test_a_conversation_of_many_long_turns(target: tuple[str, Services], tmp_path: Path) -> None:
    # 700 turns of 5,000 characters: about 11 MB, more than three pages of PAGE_BYTES (the
    # red team's 1,200 turns made 8 MB; before the byte cut, one page of them was past
    # gRPC's 4 MiB receive limit, as one of these is)
    events = long_turns("many", 700, 5000)
    assert sum(len(e.text.encode()) for e in events) > 3 * PAGE_BYTES
    round_trip(*target, events, tmp_path)


def test_turns_of_forty_thousand_characters(target: tuple[str, Services], tmp_path: Path) -> None:
    # turns of 40,000 characters (about 125 KB) a tenth past the 16 MiB request limit: more
    # than one request, and fewer than the 500 events one call took before the byte cut
    turn_bytes = len(long_turns("wide", 1, 40_000)[0].text.encode())
    events = long_turns("wide", int(1.1 * MAX_REQUEST_BYTES / turn_bytes) + 1, 40_000)
    assert sum(len(e.text.encode()) for e in events) > MAX_REQUEST_BYTES and len(events) < 500
    round_trip(*target, events, tmp_path)


def test_the_largest_turn_and_payload(target: tuple[str, Services], tmp_path: Path) -> None:
    # the largest turn the server takes (MEMSVC_MAX_TURN_CHARS at its ceiling) and the
    # largest payload, in 4-byte characters: one event of about 7 MB, past every page and
    # batch size, which must come and go alone
    largest = long_turns("largest", 2, MAX_TURN_CHARS)
    largest[1] = dataclasses.replace(largest[1], payload="🧠" * MAX_PAYLOAD_CHARS)
    round_trip(*target, largest, tmp_path)
