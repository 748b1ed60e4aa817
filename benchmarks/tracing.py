"""What traces cost: scoped hybrid search latency with tracing off, and on at 100 % sampling.

    python benchmarks/tracing.py [--conversations 2] [--queries 200] [--rounds 3]
        [--baseline DIR]

LoCoMo conversations are ingested once (the bundled model); then `memsvc serve` restarts on
that data dir, alternating off / on for `--rounds` rounds (the machine's drift falls on both
alike). Each start asks the same LoCoMo questions, scoped to their conversation, at one
client, after a warm-up. "On" exports every span over OTLP/HTTP to a receiver in this
process (decoding each request, as a collector would). `--baseline DIR` adds a third
start per round, served from another checkout (e.g. the commit before tracing): what "off"
costs against code without tracing at all.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc
from _common import DEFAULT_EVAL, ROOT, machine, percentile, scratch_dir, to_pb

from evals.locomo import load_locomo
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.support.launch import free_port, wait_serving
from tests.support.otlp import OtlpReceiver

WARMUP = 20


def serve(
    data: Path, code: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], grpc.Channel]:
    """`memsvc serve` from the checkout `code` (its directory first on the path)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "memsvc", "serve", "--listen", f"127.0.0.1:{port}"),
            *("--data-dir", str(data), "--log-level", "WARNING"),
        ],
        cwd=code,
        env={
            **os.environ,
            "MEMSVC_EMBED_MODEL": "sentence-transformers/all-MiniLM-L6-v2",
            "MEMSVC_METRICS_LISTEN": "",
            "TQDM_DISABLE": "1",
            **env,
        },
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    wait_serving(channel, proc)
    return proc, channel


def stop(proc: subprocess.Popen[bytes], channel: grpc.Channel) -> None:
    channel.close()
    proc.terminate()
    proc.wait(timeout=60)


def timed_searches(stub: pb_grpc.MemoryServiceStub, asks: list[pb.EmbedDbRequest]) -> list[float]:
    for request in asks[:WARMUP]:
        stub.EmbedDb(request)
    times = []
    for request in asks[WARMUP:]:
        start = time.perf_counter()
        stub.EmbedDb(request)
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", type=Path, default=DEFAULT_EVAL)
    parser.add_argument("--conversations", type=int, default=2)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="a checkout without tracing, compared")
    args = parser.parse_args()

    conversations = load_locomo(args.eval)[: args.conversations]
    data = scratch_dir("memsvc-bench-tracing-") / "data"
    # the baseline ingests (an older memsvc cannot open a log this one has migrated), and
    # keeps a copy of its own
    proc, channel = serve(data, args.baseline or ROOT, {})
    try:
        stub = pb_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]
        for conv in conversations:
            events = [to_pb(e) for e in conv.events]
            for i in range(0, len(events), 200):
                stub.AppendEvents(pb.AppendEventsRequest(events=events[i : i + 200]))
            wait = pb.WaitForIndexedRequest(
                conversation_id=conv.conversation_id,
                turn_id=events[-1].turn_id,
                timeout_ms=300_000,
            )
            while not stub.WaitForIndexed(wait, timeout=330).indexed:
                pass
    finally:
        stop(proc, channel)

    asks = [
        pb.EmbedDbRequest(
            query_text=q.question,
            top_k=10,
            mode=pb.SEARCH_MODE_HYBRID,
            filters=pb.SearchFilters(conversation_ids=[conv.conversation_id]),
        )
        for conv in conversations
        for q in conv.questions
    ][: args.queries + WARMUP]

    receiver = OtlpReceiver()
    tracing_on = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_SERVICE_NAME": "memsvc-bench",
    }
    configs = [("off", data, ROOT, {}), ("on", data, ROOT, tracing_on)]
    if args.baseline:
        shutil.copytree(data, data.with_name("baseline"))
        configs.append(("baseline", data.with_name("baseline"), args.baseline, {}))
    p50: dict[str, list[float]] = {label: [] for label, *_ in configs}
    p99: dict[str, list[float]] = {label: [] for label, *_ in configs}
    for _ in range(args.rounds):
        for label, data_dir, code, env in configs:
            proc, channel = serve(data_dir, code, env)
            try:
                stub = pb_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]
                times = timed_searches(stub, asks)
            finally:
                stop(proc, channel)
            p50[label].append(percentile(times, 50))
            p99[label].append(percentile(times, 99))
    spans = len(receiver.spans)
    receiver.close()

    median50 = {k: statistics.median(v) for k, v in p50.items()}
    result: dict[str, object] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "baseline": str(args.baseline or ""),
        "queries": len(asks) - WARMUP,
        "rounds": args.rounds,
        "hybrid_p50_ms": {k: round(v, 2) for k, v in median50.items()},
        "hybrid_p99_ms": {k: round(statistics.median(v), 2) for k, v in p99.items()},
        "p50_per_round_ms": {k: [round(x, 2) for x in v] for k, v in p50.items()},
        "on_over_off_p50": round(median50["on"] / median50["off"], 3),
        "spans_exported": spans,
    }
    if args.baseline:
        result["off_over_baseline_p50"] = round(median50["off"] / median50["baseline"], 3)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
