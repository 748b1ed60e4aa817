"""Latency under faults and load (issue 11), server in a child process:

1. health checks and AppendEvents while 20 WaitForIndexed calls are abandoned at 200 ms;
2. AppendEvents of small conversations while the worker indexes one ~300,000-character turn;
3. chunking time (BuildIncrementalChunks) by turn size.
Prints a markdown table; run with `make bench-resilience`."""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks._common import machine, percentile, scratch_dir
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.support.launch import free_port, start_child, wait_serving

WORDS = "the ferry to the island leaves at noon and we bring lunch.".split()


def event(conv: str, turn: int, text: str) -> pb.MemoryEvent:
    return pb.MemoryEvent(
        conversation_id=conv,
        turn_id=turn,
        speaker="user" if turn % 2 == 0 else "assistant",
        text=text,
        timestamp=f"2026-02-02T10:{turn % 60:02d}:00+08:00",
    )


def timed(fn: object, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter() - t) * 1000)
    return out


def row(name: str, ms: list[float]) -> str:
    return f"| {name} | {percentile(ms, 50):.1f} | {percentile(ms, 99):.1f} | {len(ms)} |"


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    data = scratch_dir("memsvc-resilience-") / "data"
    port = free_port()
    proc = start_child(data, port, "--max-turn-chars", "1024000")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    rows = []
    try:
        wait_serving(channel, proc)
        stub = pb_grpc.MemoryServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        check = lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=30)  # noqa: E731
        counter = iter(range(10**6))

        def append(conv: str = "small") -> None:
            stub.AppendEvents(
                pb.AppendEventsRequest(events=[event(conv, next(counter), "a short turn")]),
                timeout=60,
            )

        rows.append(row("health, idle", timed(check, 50)))
        rows.append(row("AppendEvents, idle", timed(append, 50)))

        stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=True))
        stub.AppendEvents(pb.AppendEventsRequest(events=[event("wait", 0, "x")]))
        wait = pb.WaitForIndexedRequest(conversation_id="wait", turn_id=0, timeout_ms=300_000)

        def abandon() -> None:
            # Cancelled after 200 ms (a deadline would now be answered before it passes).
            call = stub.WaitForIndexed.future(wait)
            time.sleep(0.2)
            call.cancel()
            with contextlib.suppress(grpc.RpcError, grpc.FutureCancelledError):
                call.result()

        stop = threading.Event()

        def abandon_forever() -> None:
            while not stop.is_set():
                abandon()

        with ThreadPoolExecutor(20) as pool:
            for _ in range(20):
                pool.submit(abandon_forever)
            time.sleep(1)
            rows.append(row("health, 20 callers abandoning waits", timed(check, 50)))
            rows.append(row("AppendEvents, 20 callers abandoning waits", timed(append, 50)))
            stop.set()
        stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=False))

        huge = " ".join(WORDS[i % len(WORDS)] for i in range(60_000))
        stub.AppendEvents(pb.AppendEventsRequest(events=[event("huge", 0, huge)]))
        time.sleep(1)
        rows.append(
            row(
                "AppendEvents, worker indexing a 300,000-char turn", timed(lambda: append("s2"), 50)
            )
        )
        stub.WaitForIndexed(
            pb.WaitForIndexedRequest(conversation_id="huge", turn_id=0, timeout_ms=300_000),
            timeout=310,
        )

        chunking = []
        for size in (10_000, 100_000, 300_000, 1_000_000):
            text = " ".join(WORDS[i % len(WORDS)] for i in range(size // 4))[:size]
            t = time.perf_counter()
            built = stub.BuildIncrementalChunks(
                pb.BuildIncrementalChunksRequest(events=[event(f"size{size}", 0, text)]),
                timeout=600,
            )
            chunking.append(f"| {size:,} | {(time.perf_counter() - t):.2f} | {len(built.chunks)} |")
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=60)
    print(f"{time.strftime('%Y-%m-%d')}, {machine()}\n")
    print("| call | p50 ms | p99 ms | n |\n|---|---|---|---|")
    print("\n".join(rows))
    print("\n| turn characters | BuildIncrementalChunks s | chunks |\n|---|---|---|")
    print("\n".join(chunking))


if __name__ == "__main__":
    main()
