"""ADK adds as a user's memory grows (issue 83, item 6): `add_session_to_memory` of a
session one event longer, against memsvc holding 100, 1,000 and 10,000 of that user's
events; before, each add read the user's whole memory (67 ms, 473 ms, 1,250 ms at 100,
1,000 and 3,000 events).

Three figures per size, medians of `--repeats`: an add of one new event by a service that
has added before (what an app's long-lived service does, waiting until the event is
searchable, as ADK's own in-memory service shows it at once), the same add without the
wait, a re-add with nothing new, and the first add of a new service (a new process: it
reads the memory once). Runs in the client's venv (`make bench-adk`), against
`memsvc serve` from the server's venv with the bundled MiniLM."""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import tempfile
import time
from pathlib import Path

from google.adk.events import Event
from google.adk.sessions import Session
from google.genai import types
from memsvc_client import MemoryClient
from memsvc_client.integrations.google_adk import MemsvcMemoryService, conversation_of
from session_pop import cpu, start_server


def said(i: int) -> Event:
    author = "user" if i % 2 == 0 else "coach"
    text = f"Event {i}: the climbing session on day {i // 8} went well."
    return Event(author=author, content=types.Content(parts=[types.Part(text=text)]))


async def grown(target: str, user: str, n: int) -> list[Event]:
    """The user's memory filled with n events (without waiting), then indexed."""
    events = [said(i) for i in range(n)]
    memory = MemsvcMemoryService(target, wait=False)
    for start in range(0, n, 500):
        await memory.add_events_to_memory(
            app_name="bench", user_id=user, events=events[start : start + 500]
        )
    await memory.close()
    conversation = conversation_of("bench", user)
    with MemoryClient(target) as client:
        client.wait_for_indexed(conversation, client.last_turn(conversation), timeout_s=1800)
    return events


async def ms(call: object) -> float:
    start = time.perf_counter()
    await call  # type: ignore[misc]
    return (time.perf_counter() - start) * 1000


async def measure(target: str, n: int, repeats: int) -> dict[str, float]:
    user = f"u{n}"
    events = await grown(target, user, n)

    def session() -> Session:
        return Session(id="s", app_name="bench", user_id=user, events=list(events))

    warm = MemsvcMemoryService(target)
    await warm.add_session_to_memory(session())  # its one read of the whole memory
    nowait = MemsvcMemoryService(target, wait=False)
    await nowait.add_session_to_memory(session())
    times: dict[str, list[float]] = {"add": [], "add_nowait": [], "readd": [], "first": []}
    for _ in range(repeats):
        events.append(said(len(events)))
        times["add"].append(await ms(warm.add_session_to_memory(session())))
        times["readd"].append(await ms(warm.add_session_to_memory(session())))
        events.append(said(len(events)))
        times["add_nowait"].append(await ms(nowait.add_session_to_memory(session())))
        events.append(said(len(events)))
        fresh = MemsvcMemoryService(target)
        times["first"].append(await ms(fresh.add_session_to_memory(session())))
        await fresh.close()
    await warm.close()
    await nowait.close()
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="memsvc-bench-adk-") as tmp:
        proc, target = start_server(Path(tmp) / "data")
        try:
            for n in (int(s) for s in args.sizes.split(",")):
                rows.append((n, asyncio.run(measure(target, n, args.repeats))))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(f"CPU: {cpu()}; Python {platform.python_version()}; ms, medians of {args.repeats}")
    print()
    print(
        "| stored events | add one (waits until searchable) | add one (no wait) |"
        " re-add, nothing new | a new service's first add |"
    )
    print("|---:|---:|---:|---:|---:|")
    for n, t in rows:
        print(
            f"| {n:,} | {t['add']:.1f} | {t['add_nowait']:.1f} | {t['readd']:.1f} |"
            f" {t['first']:.1f} |"
        )


if __name__ == "__main__":
    main()
