"""The command-line client's first hour (issue 27): --version, health --target, list
(paged), JSON arrays and OpenAI-style messages, one short error for a wrong file, a
confirmation before whole-conversation deletes and purges, retire."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.conftest import RUNTIME_LABEL
from tests.integration.test_operations import EXAMPLE, cli
from tests.support.launch import free_port, start_child, wait_serving
from tests.support.postgres import PostgresCluster

# the module's shared fixture starts once: every test of it on one worker (make test: loadgroup)
pytestmark = pytest.mark.xdist_group("cli-server")


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    proc = start_child(tmp_path_factory.mktemp("cli") / "data", port)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, proc)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def memsvc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memsvc", *args], capture_output=True, text=True, timeout=120
    )


def test_a_reader_that_goes_away_is_no_traceback(target: str) -> None:
    # issue 66: `memsvc mcp --print-config | head` ended in a BrokenPipeError traceback
    piped = subprocess.run(
        f"{sys.executable} -m memsvc mcp --print-config --target {target} | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.stdout == "{\n" and "Traceback" not in piped.stderr, piped.stderr


def test_version_and_health_of_a_named_target(target: str) -> None:
    version = memsvc("--version")
    assert version.returncode == 0 and version.stdout.startswith("memsvc 0.")
    assert memsvc("health", "--target", target).returncode == 0
    assert memsvc("health", "--target", f"127.0.0.1:{free_port()}").returncode == 1


def test_nothing_listening_is_named_as_such_not_as_tls() -> None:
    # issue 84: a refused connection was answered "is it serving TLS?", sending a new user
    # after certificates when the server was simply not running
    nobody = f"127.0.0.1:{free_port()}"
    refused = memsvc("status", "--target", nobody)
    assert refused.returncode == 1
    assert f"nothing listens on {nobody}" in refused.stderr, refused.stderr
    assert "TLS" not in refused.stderr


def test_status_says_which_model_serves(target: str) -> None:
    server = json.loads(cli(target, "status", "--json").stdout)["server"]
    assert server["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert server["model_fallback"] is False and server["dim"] == 384
    assert re.match(RUNTIME_LABEL, server["embed_backend"]) and server["log_backend"] == "sqlite"
    assert server["version"] == memsvc("--version").stdout.split()[1]
    table = cli(target, "status").stdout
    assert "model sentence-transformers/all-MiniLM-L6-v2 (dim 384" in table


def test_json_array_and_openai_messages(target: str, tmp_path: Path) -> None:
    events = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    array = tmp_path / "events.json"
    array.write_text(json.dumps([dict(e, conversation_id="arr") for e in events], indent=2))
    done = cli(target, "append", str(array), "--wait")
    assert done.returncode == 0, done.stderr
    assert "accepted 10, duplicates 0, errors 0" in done.stdout

    chat = tmp_path / "chat.json"
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "My bike is a red Brompton I bought in Porto."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t1"}]},
        {"role": "tool", "tool_call_id": "t1", "content": "{}"},
        {"role": "assistant", "content": [{"type": "text", "text": "A lovely folding bike!"}]},
    ]
    chat.write_text(json.dumps({"messages": messages}))
    first = cli(target, "append", str(chat), "--messages", "chat-1", "--wait")
    assert first.returncode == 0, first.stderr
    assert "accepted 3, duplicates 0, errors 0" in first.stdout  # system, user, assistant
    more = tmp_path / "more.json"
    more.write_text(json.dumps([{"role": "user", "content": "It has six gears."}]))
    second = cli(target, "append", str(more), "--messages", "chat-1", "--wait")
    assert "accepted 1," in second.stdout  # after the conversation's last turn
    found = json.loads(
        cli(target, "search", "which bike do I ride", "--conversation", "chat-1", "--json").stdout
    )
    assert any("Brompton" in h["text"] for h in found["hits"])
    status = json.loads(cli(target, "status", "--conversation", "chat-1", "--json").stdout)
    assert status["conversations"][0]["last_appended_turn"] == 3


def test_a_wrong_file_is_one_short_error(target: str, tmp_path: Path) -> None:
    prose = tmp_path / "notes.txt"
    prose.write_text("Dear diary,\n" * 5000)
    done = cli(target, "append", str(prose))
    assert done.returncode == 2
    assert "not JSON lines" in done.stderr and len(done.stderr) < 400
    many = tmp_path / "many.jsonl"
    many.write_text('{"conversation_id": "x"}\n' + "[1, 2]\n" * 500)
    done = cli(target, "append", str(many))
    assert done.returncode == 1 and "... and" in done.stderr and len(done.stderr) < 10_000


def test_list_pages_through_conversations(target: str, tmp_path: Path) -> None:
    events = tmp_path / "few.jsonl"
    events.write_text(
        "".join(
            json.dumps(
                {
                    "conversation_id": f"page-{n}",
                    "turn_id": 0,
                    "speaker": "user",
                    "text": f"Note number {n}.",
                    "timestamp": "2026-02-02T10:00:00+08:00",
                }
            )
            + "\n"
            for n in range(5)
        )
    )
    assert cli(target, "append", str(events)).returncode == 0
    seen: list[str] = []
    after = "page-"
    while True:
        page = json.loads(cli(target, "list", "--limit", "2", "--after", after, "--json").stdout)
        seen += [c["conversation_id"] for c in page["conversations"]]
        if not page["next_after"]:
            break
        after = page["next_after"]
    assert [s for s in seen if s.startswith("page-")] == [f"page-{n}" for n in range(5)]
    table = cli(target, "list", "--limit", "1")
    assert "more: --after" in table.stdout


def test_whole_conversation_erasure_needs_yes_and_retire(target: str, tmp_path: Path) -> None:
    events = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    file = tmp_path / "gone.jsonl"
    file.write_text("".join(json.dumps(dict(e, conversation_id="gone")) + "\n" for e in events))
    assert cli(target, "append", str(file), "--wait").returncode == 0
    refused = cli(target, "delete", "--conversation", "gone")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    still = json.loads(cli(target, "search", "dog", "--conversation", "gone", "--json").stdout)
    assert still["hits"]  # nothing was deleted
    assert cli(target, "purge", "--all-conversations").returncode == 2
    deleted = cli(target, "delete", "--conversation", "gone", "--yes")
    assert "turns deleted 10" in deleted.stdout
    assert "turns erased 10" in cli(target, "purge", "--conversation", "gone", "--yes").stdout
    retired = cli(target, "retire", "--conversation", "arr", "--chunk-version", "7")
    assert retired.returncode == 0 and "chunks removed 0" in retired.stdout, retired.stderr


def test_export_is_a_backup_that_append_takes_back(target: str, tmp_path: Path) -> None:
    """export → append on a fresh server: the same conversation, the same chunks; deleted
    turns stay out (re-imported with --allow-gaps). The conversation has a tenant of its own:
    keyword statistics are per tenant, and the module's server holds other tenants' turns."""
    conv = "exp/backup"
    events = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    source = tmp_path / "source.jsonl"
    source.write_text("".join(json.dumps(dict(e, conversation_id=conv)) + "\n" for e in events))
    assert cli(target, "append", str(source), "--wait").returncode == 0
    assert cli(target, "delete", "--conversation", conv, "--turns", "4-4").returncode == 0
    backup = tmp_path / "backup.jsonl"
    done = cli(target, "export", "--conversation", conv, "--output", str(backup))
    assert done.returncode == 0 and "exported 9 events" in done.stderr, done.stderr
    assert backup.stat().st_mode & 0o777 == 0o600  # personal data: the owner's alone
    exported = [json.loads(line) for line in backup.read_text().splitlines()]
    assert [e["turn_id"] for e in exported] == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert exported[0] == dict(events[0], conversation_id=conv)  # as appended
    newest = cli(target, "export", "--conversation", conv, "--last", "3")
    assert [json.loads(line)["turn_id"] for line in newest.stdout.splitlines()] == [7, 8, 9]

    port = free_port()
    fresh = start_child(tmp_path / "restored", port)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, fresh)
        restored = f"127.0.0.1:{port}"
        done = cli(restored, "append", str(backup), "--allow-gaps", "--wait")
        assert done.returncode == 0, done.stderr
        assert "accepted 9, duplicates 0, errors 0" in done.stdout
        for query in ("what is the dog called?", "peanut allergy"):
            before = json.loads(
                cli(target, "search", query, "--conversation", conv, "--json").stdout
            )
            after = json.loads(
                cli(restored, "search", query, "--conversation", conv, "--json").stdout
            )
            assert [h["text"] for h in after["hits"]] == [h["text"] for h in before["hits"]]
    finally:
        fresh.terminate()
        fresh.wait(timeout=60)


def test_export_into_a_closed_pipe_stops_quietly(target: str, tmp_path: Path) -> None:
    # `memsvc export | head`: the reader goes away; no "Broken pipe" traceback (issue 40)
    source = tmp_path / "pipe.jsonl"
    events = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    source.write_text("".join(json.dumps(dict(e, conversation_id="pipe")) + "\n" for e in events))
    assert cli(target, "append", str(source)).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "memsvc", "export", "--conversation", "pipe", "--target", target],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (0, 141), stderr
    assert "Broken pipe" not in stderr and "Traceback" not in stderr, stderr


def test_append_wait_says_at_once_that_indexing_is_paused(target: str, tmp_path: Path) -> None:
    source = tmp_path / "paused.jsonl"
    events = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    source.write_text("".join(json.dumps(dict(e, conversation_id="held")) + "\n" for e in events))
    assert cli(target, "pause").returncode == 0
    try:
        done = cli(target, "append", str(source), "--wait")
        assert done.returncode == 1
        assert "accepted 10, duplicates 0, errors 1" in done.stdout
        assert "indexing is paused (memsvc resume starts it)" in done.stderr, done.stderr
    finally:
        assert cli(target, "resume").returncode == 0


def test_reindex_wait_follows_the_rebuilds_to_their_end(target: str, tmp_path: Path) -> None:
    """`memsvc reindex --wait` (issue 40): returns once every conversation it queued is
    rebuilt and searchable, and says at once when indexing is paused."""
    source = tmp_path / "rebuild.jsonl"
    events = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    lines = [json.dumps(dict(e, conversation_id=conv)) for conv in ("rb1", "rb2") for e in events]
    source.write_text("\n".join(lines) + "\n")
    assert cli(target, "append", str(source), "--wait").returncode == 0
    done = cli(
        target,
        "reindex",
        "--conversation",
        "rb1",
        "--conversation",
        "rb2",
        "--chunk-version",
        "2",
        "--wait",
    )
    assert done.returncode == 0, done.stderr
    assert "queued 2" in done.stdout and "rebuilt 2, failed 0" in done.stdout
    status = json.loads(cli(target, "status", "--conversation", "rb1", "--json").stdout)
    entry = status["conversations"][0]
    assert entry["chunk_version"] == 2 and not entry.get("reindexing")
    found = json.loads(cli(target, "search", "dog", "--conversation", "rb1", "--json").stdout)
    assert all(h["metadata"]["chunk_version"] == 2 for h in found["hits"]) and found["hits"]
    assert cli(target, "pause").returncode == 0
    try:
        held = cli(target, "reindex", "--conversation", "rb2", "--wait")
        assert held.returncode == 1 and "indexing is paused" in held.stderr, held.stderr
    finally:
        assert cli(target, "resume").returncode == 0


def test_tables_off_a_terminal_are_plain_lines_and_nothing_indexed_is_no_turn(
    target: str, tmp_path: Path
) -> None:
    # issue 84: piped output drew rich's boxes (cli.md promises plain text), and a
    # conversation with nothing indexed yet showed `indexed -1`
    events = tmp_path / "unindexed.jsonl"
    events.write_text(
        json.dumps(
            {
                "conversation_id": "unindexed",
                "turn_id": 0,
                "speaker": "user",
                "text": "Nothing of this is searchable yet.",
                "timestamp": "2026-02-02T10:00:00Z",
            }
        )
        + "\n"
    )
    assert cli(target, "pause").returncode == 0
    try:
        assert cli(target, "append", str(events)).returncode == 0
        status = cli(target, "status", "--conversation", "unindexed").stdout.splitlines()
        listed = cli(target, "list", "--after", "unindexe", "--limit", "1").stdout.splitlines()
    finally:
        assert cli(target, "resume").returncode == 0
    assert status[0].split("\t") == [
        "conversation", "state", "appended", "indexed", "backlog", "attempts", "error"
    ]  # fmt: skip
    assert status[1].split("\t")[:5] == ["unindexed", "pending", "0", "-", "1"]
    assert listed[:2] == [
        "conversation\tstate\tturns\tsearchable to\tbacklog",
        "unindexed\tpending\t1\t-\t1",
    ]
    found = cli(target, "search", "Nothing searchable", "--conversation", "c-none").stdout
    assert found.splitlines() == ["score\tconversation\tturns\ttext"]
    boxes = set("─│┃━┏┓┗┛┡┩└┘├┤╇")
    assert not boxes & set("".join(status + listed) + found)


CLI_PAGE = Path(__file__).parents[2] / "docs" / "surfaces" / "cli.md"
# lines of the page's block another test runs as written (a server of their own)
RUN_ELSEWHERE = {
    "make run": "every test's server",
    "memsvc tune": "tests/test_tuning.py",
    "memsvc mcp": "tests/integration/test_mcp.py",
}


def test_the_cli_pages_lines_run_as_written(
    target: str, tmp_path: Path, postgres: PostgresCluster
) -> None:
    # issue 84: `memsvc append chat.json ...` named a file nobody had. Every line runs in
    # a clone's directory, the documented addresses standing for this test's server and
    # database, in the page's order
    block = re.findall(r"```sh\n(.*?)```", CLI_PAGE.read_text(), re.S)[0]
    addresses = {
        "10.0.0.5:50051": target,
        "postgresql://memsvc@db:5432/memsvc": postgres.create_database(),
    }
    (tmp_path / "examples").symlink_to(CLI_PAGE.parents[2] / "examples")
    ran: list[str] = []
    said: list[str] = []
    for line in block.splitlines():
        line = line.split("   #", 1)[0].split(" # ", 1)[0].strip()
        for command in line.split(" / "):  # "memsvc pause / memsvc resume"
            if not command or any(command.startswith(p) for p in RUN_ELSEWHERE):
                continue
            for documented, here in addresses.items():
                command = command.replace(documented, here)
            done = subprocess.run(
                [sys.executable, "-m", "memsvc", *shlex.split(command)[1:]],
                cwd=tmp_path,
                env={**os.environ, "MEMSVC_TARGET": target},
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
            ran.append(command.split()[1])
            said.append(done.stdout)
    assert "accepted 5, duplicates 0, errors 0" in said[ran.index("append", 1)]  # chat.json
    assert ran.count("append") == 2 and {"export", "reindex", "migrate", "health"} <= set(ran)
    exported = (tmp_path / "c1.jsonl").read_text().splitlines()
    assert len(exported) == 10 and json.loads(exported[0])["conversation_id"] == "c1"
