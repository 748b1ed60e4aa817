"""AppendEvents under load and time-to-searchable, through the public RPCs.

    python benchmarks/async_ingest.py [--eval FILE] [--clients 4] [--batch-turns 2]

`--clients` threads (a separate process from the server) append the LoCoMo dev
conversations, `--batch-turns` turns per call, as fast as the server answers, while the
index worker embeds in the background. Reports AppendEvents latency p50/p99 under that
load, the time from the last append until everything is searchable, and, with the system
idle, the time-to-searchable of one new turn (append -> WaitForIndexed) over 20 trials.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

from _common import DEFAULT_EVAL, machine, percentile, to_pb

from evals.locomo import load_locomo
from memsvc.v1 import memory_pb2 as pb
from tests.support.launch import running_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", type=Path, default=DEFAULT_EVAL)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batch-turns", type=int, default=2)
    args = parser.parse_args()
    convs = load_locomo(args.eval)
    latencies: list[float] = []
    lock = threading.Lock()
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp)) as (stub, _pid):
        work = [
            [to_pb(e) for e in c.events[i : i + args.batch_turns]]
            for c in convs
            for i in range(0, len(c.events), args.batch_turns)
        ]
        # Interleave conversations the way several agents would, keeping each in order.
        per_conv = {
            c.conversation_id: [w for w in work if w[0].conversation_id == c.conversation_id]
            for c in convs
        }
        queues = [list(v) for v in per_conv.values()]

        def client(mine: list[list[list[pb.MemoryEvent]]]) -> None:
            for calls in mine:
                for batch in calls:
                    t = time.perf_counter()
                    res = stub.AppendEvents(pb.AppendEventsRequest(events=batch))
                    ms = (time.perf_counter() - t) * 1000
                    assert not res.errors, res.errors
                    with lock:
                        latencies.append(ms)

        shards = [queues[i :: args.clients] for i in range(args.clients)]
        start = time.perf_counter()
        threads = [threading.Thread(target=client, args=(s,)) for s in shards]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        appended_s = time.perf_counter() - start
        for c in convs:
            res = stub.WaitForIndexed(
                pb.WaitForIndexedRequest(
                    conversation_id=c.conversation_id, turn_id=len(c.events) - 1, timeout_ms=300_000
                )
            )
            assert res.indexed, res.status
        searchable_s = time.perf_counter() - start
        status = stub.GetIndexStatus(pb.GetIndexStatusRequest())
        chunks = sum(
            len(
                stub.ListChunks(
                    pb.ListChunksRequest(conversation_id=c.conversation_id, page_size=1000)
                ).chunks
            )
            for c in convs
        )
        one_turn: list[float] = []
        conv = convs[0]
        for k in range(20):
            turn_id = len(conv.events) + k
            event = pb.MemoryEvent(
                conversation_id=conv.conversation_id,
                turn_id=turn_id,
                speaker="user" if k % 2 == 0 else "assistant",
                text=f"Follow-up number {k}: I booked the pottery class for next Saturday.",
                timestamp="2023-12-01T10:00:00+00:00",
            )
            t = time.perf_counter()
            stub.AppendEvents(pb.AppendEventsRequest(events=[event]))
            res = stub.WaitForIndexed(
                pb.WaitForIndexedRequest(
                    conversation_id=conv.conversation_id, turn_id=turn_id, timeout_ms=60_000
                )
            )
            assert res.indexed
            one_turn.append((time.perf_counter() - t) * 1000)
    turns = sum(len(c.events) for c in convs)
    print(f"Async ingest, {args.eval.name}, {date.today()}, {machine()}")
    print(
        f"{args.clients} clients, {args.batch_turns} turns per AppendEvents, {len(latencies)} calls\n"
    )
    print("| measure | value |")
    print("|---|---|")
    print(
        f"| AppendEvents p50 / p99 under load | {percentile(latencies, 50):.1f} / {percentile(latencies, 99):.1f} ms |"
    )
    print(f"| all {turns} turns appended | {appended_s:.1f} s |")
    print(
        f"| all searchable (first append -> last indexed) | {searchable_s:.1f} s, {chunks} live chunks |"
    )
    print(f"| indexing throughput | {chunks / searchable_s:.1f} live chunks/s |")
    print(
        f"| one new turn, idle: append -> searchable p50 / p99 | {percentile(one_turn, 50):.0f} / {percentile(one_turn, 99):.0f} ms |"
    )
    print(f"| worker state after | backlog {status.total_backlog}, failed {status.failed} |")


if __name__ == "__main__":
    main()
