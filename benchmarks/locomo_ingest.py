"""Ingest the LoCoMo dev conversations through the public RPCs; print counts and timings.

    python benchmarks/locomo_ingest.py [--eval FILE] [--batch-turns N]

Each conversation goes through BuildIncrementalChunks + UpsertVectorRecords in calls of
N turns (default 2: one exchange at a time, as agent-core sends them), then every stored
chunk is upserted again to time an identical replay.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import date
from pathlib import Path

from _common import DEFAULT_EVAL, machine, percentile, to_pb

from evals.locomo import load_locomo
from memsvc.v1 import memory_pb2 as pb
from tests.support.launch import list_all_chunks, running_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", type=Path, default=DEFAULT_EVAL)
    parser.add_argument("--batch-turns", type=int, default=2)
    args = parser.parse_args()
    convs = load_locomo(args.eval)
    build_ms: list[float] = []
    upsert_ms: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp)) as (stub, _pid):
        start = time.perf_counter()
        written = superseded = 0
        for conv in convs:
            for i in range(0, len(conv.events), args.batch_turns):
                batch = [to_pb(e) for e in conv.events[i : i + args.batch_turns]]
                t = time.perf_counter()
                built = stub.BuildIncrementalChunks(pb.BuildIncrementalChunksRequest(events=batch))
                build_ms.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                res = stub.UpsertVectorRecords(pb.UpsertVectorRecordsRequest(records=built.chunks))
                upsert_ms.append((time.perf_counter() - t) * 1000)
                assert not res.errors, res.errors
                written += res.upserted + res.updated
                superseded += len(built.superseded_chunk_ids)
        total_s = time.perf_counter() - start
        stored = [r for conv in convs for r in list_all_chunks(stub, conv.conversation_id)]
        t = time.perf_counter()
        replay = stub.UpsertVectorRecords(pb.UpsertVectorRecordsRequest(records=stored))
        replay_s = time.perf_counter() - t
    turns = sum(len(c.events) for c in convs)
    print(f"LoCoMo ingest, {args.eval.name}, {date.today()}, {machine()}")
    print("| conversations | turns | calls | chunks written | superseded tails | live chunks |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {len(convs)} | {turns} | {len(build_ms)} | {written} | {superseded} | {len(stored)} |"
    )
    print()
    print("| measure | value |")
    print("|---|---|")
    print(f"| total ingest | {total_s:.1f} s ({turns / total_s:.1f} turns/s) |")
    b50, b99 = percentile(build_ms, 50), percentile(build_ms, 99)
    print(f"| Build p50 / p99 | {b50:.1f} / {b99:.1f} ms |")
    u50, u99 = percentile(upsert_ms, 50), percentile(upsert_ms, 99)
    print(f"| Upsert p50 / p99 | {u50:.1f} / {u99:.1f} ms |")
    replay_ms = replay_s * 1000
    print(f"| replay of {len(stored)} chunks | {replay_ms:.0f} ms, unchanged={replay.unchanged} |")


if __name__ == "__main__":
    main()
