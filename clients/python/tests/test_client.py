"""memsvc-client in a venv of its own (make test-clients): no torch, no server package,
against a real memsvc started from the server's venv (MEMSVC_PYTHON)."""

from __future__ import annotations

import atexit
import importlib.util
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from memsvc_client import MemoryClient, MemsvcError, pb

ROOT = Path(__file__).resolve().parents[3]
WRITER = "writer-token-for-the-python-client"
READER = "reader-token-for-the-python-client"
ADMIN = "admin-token-for-the-python-client"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def turn(conversation: str, turn_id: int, text: str) -> pb.MemoryEvent:
    return pb.MemoryEvent(
        conversation_id=conversation,
        turn_id=turn_id,
        speaker="user" if turn_id % 2 == 0 else "assistant",
        text=text,
        timestamp=f"2026-02-02T10:0{turn_id}:00+08:00",
    )


def readme_snippet(marker: str) -> str:
    """The README's Integrations snippet that imports `marker`."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    return next(b for b in blocks if marker in b)


def run_readme_snippet(
    marker: str, target: str, token: str, scope: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Run that snippet as printed, against `target` with `token`; its variables."""
    code = readme_snippet(marker).replace('"127.0.0.1:50051"', repr(target))
    code = code.replace("token=None", f"token={token!r}")
    scope = {} if scope is None else scope
    exec(compile(code, "README.md", "exec"), scope)
    return scope


def run_writers(code: str, target: str, names: Sequence[str] = ("left", "right")) -> None:
    """Run `code` in one process per name at once (argv: target, a writer token, the name)."""
    procs = [subprocess.Popen([sys.executable, "-c", code, target, WRITER, n]) for n in names]
    codes = [p.wait(timeout=300) for p in procs]
    if codes != [0] * len(procs):
        raise AssertionError(f"writer processes exited with {codes}")


def check_writers_kept(
    case: unittest.TestCase, said: list[str], count: int, names: Sequence[str] = ("left", "right")
) -> None:
    """Each writer of `run_writers` wrote `count` pairs ("NAME i", "NAME ok i"): all of them
    are in `said`, each writer's in its order, each pair together."""
    case.assertEqual(len(said), 2 * count * len(names))
    for name in names:
        mine = [s for s in said if s.startswith(f"{name} ")]
        case.assertEqual(mine, [t for k in range(count) for t in (f"{name} {k}", f"{name} ok {k}")])
    pairs = [(said[k], said[k + 1]) for k in range(0, len(said), 2)]
    case.assertTrue(all(b == a.replace(" ", " ok ", 1) for a, b in pairs))


class Server:
    """A real memsvc (the server's venv) with writer, reader and admin tokens."""

    def __init__(self, env: dict[str, str] | None = None, stdout: Any = None) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        tokens = Path(self.tmp.name) / "tokens"
        tokens.write_text(f"writer {WRITER}\nreader {READER}\nadmin {ADMIN}\n")
        self.target = f"127.0.0.1:{free_port()}"
        python = os.environ.get("MEMSVC_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
        data = str(Path(self.tmp.name) / "data")
        self.process = subprocess.Popen(
            [
                *(python, "-m", "memsvc", "serve", "--listen", self.target),
                *("--log-level", "WARNING", "--data-dir", data),
                *("--auth-tokens-file", str(tokens)),
            ],
            cwd=ROOT,
            env={
                **os.environ,
                "MEMSVC_EMBED_MODEL": "sentence-transformers/all-MiniLM-L6-v2",
                "MEMSVC_METRICS_LISTEN": "",
                "TQDM_DISABLE": "1",
                **(env or {}),
            },
            stdout=stdout,
        )
        deadline = time.monotonic() + 180
        with MemoryClient(self.target, token=READER, attempts=2) as probe:
            while True:
                try:
                    probe.call("EmbedChunk", pb.EmbedChunkRequest(query="ready?"), timeout_s=5)
                    return
                except MemsvcError:
                    if time.monotonic() > deadline or self.process.poll() is not None:
                        raise
                    time.sleep(0.5)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)
        self.tmp.cleanup()


_shared: list[Server] = []


def shared_server() -> Server:
    """One server for every test class of this process: they use conversations of their
    own, and a server start is most of a class's time."""
    if not _shared or _shared[0].process.poll() is not None:
        _shared[:] = [Server()]
        atexit.register(_shared[0].stop)
    return _shared[0]


class ServerTestCase(unittest.TestCase):
    """Tests against a real memsvc: the process's shared one (conversations of their own)."""

    target: str

    @classmethod
    def setUpClass(cls) -> None:
        cls.target = shared_server().target


class MemoryClientTest(ServerTestCase):
    def test_installs_without_torch_or_the_server(self) -> None:
        self.assertIsNone(importlib.util.find_spec("torch"))
        self.assertIsNone(importlib.util.find_spec("memsvc"))

    def test_append_wait_search_delete(self) -> None:
        with MemoryClient(self.target, token=WRITER) as memory:
            events = [
                turn("py-1", 0, "I just adopted a puppy named Biscuit."),
                turn("py-1", 1, "Congratulations! What breed is Biscuit?"),
            ]
            reply = memory.append(events, wait=True)
            self.assertEqual(reply.accepted, 2)
            hits = memory.search("what is the dog called?", conversation_ids=["py-1"])
            self.assertIn("Biscuit", hits[0].text)
            self.assertEqual(hits[0].metadata.turn_range.end, 1)
            self.assertEqual(memory.status(["py-1"]).conversations[0].state, "idle")
            self.assertEqual([e.turn_id for e in memory.export("py-1")], [0, 1])
            self.assertEqual([e.turn_id for e in memory.export("py-1", last=1)], [1])
            self.assertEqual(memory.delete("py-1").events_deleted, 2)
            self.assertEqual(memory.search("Biscuit", conversation_ids=["py-1"]), [])

    def test_the_documented_example(self) -> None:
        page = (ROOT / "docs" / "surfaces" / "clients.md").read_text()
        blocks = re.findall(r"```python\n(.*?)```", page, re.S)
        code = next(b for b in blocks if "from memsvc_client import" in b)
        code = code.replace('"127.0.0.1:50051"', repr(self.target))
        code = code.replace("token=None", f"token={WRITER!r}")
        scope: dict[str, object] = {}
        exec(compile(code, "docs/surfaces/clients.md", "exec"), scope)
        hits = scope["hits"]
        assert isinstance(hits, list)
        self.assertIn("Biscuit", hits[0].text)

    def test_errors_carry_reason_and_fields(self) -> None:
        with MemoryClient(self.target, token=READER) as memory:
            with self.assertRaises(MemsvcError) as denied:
                memory.append([turn("py-2", 0, "hello")])
            self.assertEqual(denied.exception.code, grpc.StatusCode.PERMISSION_DENIED)
            self.assertEqual(denied.exception.reason, "ROLE_TOO_LOW")
            with self.assertRaises(MemsvcError) as bad:
                memory.search("x", conversation_ids=["py-2"], top_k=1000)
            self.assertEqual(bad.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertEqual([f for f, _ in bad.exception.field_violations], ["top_k"])
        with MemoryClient(f"127.0.0.1:{free_port()}", attempts=2, timeout_s=5) as nowhere:
            with self.assertRaises(MemsvcError) as down:
                nowhere.status(["py-2"])
            self.assertEqual(down.exception.code, grpc.StatusCode.UNAVAILABLE)


if __name__ == "__main__":
    unittest.main()
