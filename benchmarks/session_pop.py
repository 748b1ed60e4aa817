"""Agents SDK session deletes (issue 63, item 3): `pop_item` and `clear_session` of
`MemsvcSession` against the SDK's own `SQLiteSession`, at 100, 1,000 and 3,000 items, right
after the items were added (the index worker busy with them) and once they are indexed.

Runs in the client's venv (`make bench-session`: openai-agents installed there), against
`memsvc serve` started from the server's venv (MEMSVC_PYTHON) with the bundled model.
Prints a markdown table: medians of `--pops` pops and of three clears."""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents.memory import SQLiteSession
from memsvc_client import MemoryClient, MemsvcError, pb
from memsvc_client.integrations.openai_agents import MemsvcSession

ROOT = Path(__file__).resolve().parents[1]


def cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return platform.processor() or platform.machine()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(data: Path) -> tuple[subprocess.Popen[bytes], str]:
    target = f"127.0.0.1:{free_port()}"
    python = os.environ.get("MEMSVC_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
    env = {**os.environ, "MEMSVC_METRICS_LISTEN": "", "TQDM_DISABLE": "1"}
    env.setdefault("MEMSVC_EMBED_MODEL", "sentence-transformers/all-MiniLM-L6-v2")
    proc = subprocess.Popen(
        [python, "-m", "memsvc", "serve", "--listen", target, "--data-dir", str(data)],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    with MemoryClient(target, attempts=2) as probe:
        while True:
            try:
                probe.call("EmbedChunk", pb.EmbedChunkRequest(query="ready?"), timeout_s=5)
                return proc, target
            except MemsvcError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.5)


def items(n: int) -> list[Any]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Message {i} about the trip"}
        for i in range(n)
    ]


async def timed_ms(call: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await call()
    return (time.perf_counter() - start) * 1000


async def add(session: Any, n: int) -> None:
    for start in range(0, n, 500):
        await session.add_items(items(n)[start : start + 500])


async def measure(
    session: Any, n: int, pops: int, settle: Callable[[], None] | None
) -> dict[str, float]:
    """Pops right after adding n items, pops once settled (indexed); clears of n items
    just added (median of three)."""
    await add(session, n)
    fresh = [await timed_ms(session.pop_item) for _ in range(pops)]
    if settle is not None:
        settle()
    settled = [await timed_ms(session.pop_item) for _ in range(pops)]
    clears = [await timed_ms(session.clear_session)]
    for _ in range(2):
        await add(session, n)
        clears.append(await timed_ms(session.clear_session))
    return {
        "pop_fresh": statistics.median(fresh),
        "pop_settled": statistics.median(settled),
        "clear": statistics.median(clears),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100,1000,3000")
    parser.add_argument("--pops", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="memsvc-bench-session-") as tmp:
        proc, target = start_server(Path(tmp) / "data")
        rows = []
        try:
            for n in sizes:
                conversation = f"bench-pop-{n}"

                def settle(conversation: str = conversation) -> None:
                    with MemoryClient(target) as client:
                        last = client.export(conversation, last=1)[-1].turn_id
                        client.wait_for_indexed(conversation, last, timeout_s=600)

                ours = MemsvcSession(conversation, target)
                memsvc = asyncio.run(measure(ours, n, args.pops, settle))
                sqlite = asyncio.run(
                    measure(SQLiteSession(f"s{n}", str(Path(tmp) / "s.db")), n, args.pops, None)
                )
                rows.append((n, memsvc, sqlite))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(
        f"CPU: {cpu()}; Python {platform.python_version()}; ms, medians of {args.pops} pops, 3 clears"
    )
    print()
    print(
        "| items | memsvc pop (just added) | memsvc pop (indexed) | SQLiteSession pop |"
        " memsvc clear | SQLiteSession clear | pop ratio | clear ratio |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, m, s in rows:
        print(
            f"| {n:,} | {m['pop_fresh']:.1f} | {m['pop_settled']:.1f} | {s['pop_fresh']:.2f} |"
            f" {m['clear']:.1f} | {s['clear']:.2f} |"
            f" {max(m['pop_fresh'], m['pop_settled']) / s['pop_fresh']:.1f}x |"
            f" {m['clear'] / s['clear']:.1f}x |"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
