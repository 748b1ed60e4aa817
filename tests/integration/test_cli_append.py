"""`memsvc append` against a server: --wait returns when part of the file was refused, and
each conversation is sent in turn order (issue 24)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from memsvc.app import Services
from memsvc.transports.grpc.server import RunningServer, start_server


@pytest.fixture()
def plain_server(services: Services) -> Iterator[tuple[RunningServer, str]]:
    running = start_server("127.0.0.1:0")
    running.mark_ready(services)
    yield running, f"127.0.0.1:{running.port}"
    running.stop(0)


def cli(target: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memsvc", *args, "--target", target],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def lines(events: list[object]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def event_json(conv: str, turn_id: int, text: str) -> dict[str, object]:
    return {
        "conversation_id": conv,
        "turn_id": turn_id,
        "speaker": "user" if turn_id % 2 == 0 else "assistant",
        "text": text,
        "timestamp": f"2026-02-02T10:{turn_id % 60:02d}:00+08:00",
    }


def test_append_wait_returns_when_part_of_the_file_was_refused(
    plain_server: tuple[RunningServer, str], tmp_path: Path
) -> None:
    _, target = plain_server
    file = tmp_path / "mixed.jsonl"
    good = [event_json("cli-good", i, f"turn {i} about gardening") for i in range(4)]
    bad = [
        event_json("cli-bad", 0, "fine"),
        {**event_json("cli-bad", 1, "broken"), "timestamp": "yesterday"},
    ]
    file.write_text(lines([*good, *bad]) + "5\n" + '"just a string"\n')
    done = cli(target, "append", str(file), "--wait", "--wait-timeout", "120")
    assert done.returncode == 1  # it reports the refused lines, and returns
    assert "accepted 4" in done.stdout
    assert "line 7: expected a JSON object" in done.stderr and "line 8:" in done.stderr
    # the bad field named on its own line (not as the request's events[1]), and the other
    # line of its conversation said to be refused with it
    assert "line 6: timestamp: not an RFC 3339" in done.stderr
    assert "line 5: not written: line 6 of its conversation was refused" in done.stderr
    assert "Traceback" not in done.stderr


def test_append_sends_each_conversation_in_turn_order(
    plain_server: tuple[RunningServer, str], services: Services, tmp_path: Path
) -> None:
    _, target = plain_server
    file = tmp_path / "reversed.jsonl"
    events = [event_json("cli-order", i, f"note {i}") for i in range(520)]
    file.write_text(lines(list(reversed(events))))  # turn 519 first: batch 1 ends at 20
    done = cli(target, "append", str(file))
    assert done.returncode == 0, done.stderr
    assert "accepted 520, duplicates 0, errors 0" in done.stdout
    assert services.queue.status(["cli-order"])[0].last_appended_turn == 519


def test_a_conversation_refused_whole_is_said_once_with_its_lines(
    plain_server: tuple[RunningServer, str], tmp_path: Path, services: Services
) -> None:
    # issue 66: restoring without --restore printed the same long error 12 times
    _, target = plain_server
    file = tmp_path / "backup.jsonl"
    file.write_text(lines([event_json("cli-restore", i, f"turn {i}") for i in range(12)]))
    assert cli(target, "append", str(file)).returncode == 0
    services.deletion.delete("cli-restore", None, [])
    again = cli(target, "append", str(file))
    assert again.returncode == 1
    assert "errors 12" in again.stdout  # each refused turn counted
    said = again.stderr.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("lines 1-12: "), said
    assert "--restore" in said[0]
