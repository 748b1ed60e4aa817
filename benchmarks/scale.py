"""What one node holds: the log, the store and the service as conversations pile up.

    python benchmarks/scale.py [--stages 20,1000,10000,100000] [--turns 10]
        [--backend sqlite|postgres] [--searches 200] [--reindex-all-up-to 10000]
        [--beam DIR] [--json FILE] [--keep DIR | --reuse DIR] [--shards N] [--memory-mib M]

One `memsvc serve` (SQLite + Milvus Lite in its data dir, or PostgreSQL + the milvus-lite
TCP server) is grown stage by stage: at each, the conversations up to the stage's count
(benchmarks/scale_workload.py: LoCoMo and BEAM dev shapes) are appended through the
public API, `--turns` turns each, and indexed; then measured. Vectors come from
benchmarks/hash_embedder.py through the real remote-embedder path: the subject is the log,
the store and the service, not the model. The first stage's ~200 chunks are the reference
the others are compared with.

At each stage: load rate; scoped and unscoped hybrid p50/p99 (one client); a
GetIndexStatus page (1,000 conversations) and a walk of all; append-to-searchable of one
turn, with the index step's stages (the worker's per-step cost); export of one
conversation and of all; reindex of one, and of all up to `--reindex-all-up-to`
conversations (it re-embeds everything, as long as the load); delete + purge of one;
restart to SERVING (with the store audit); RSS of memsvc and its Milvus Lite; disk per
chunk.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from _common import (
    DEFAULT_EVAL,
    ROOT,
    ServerTimes,
    breakdown,
    children,
    machine,
    percentile,
    rss_kib,
    scratch_dir,
    to_pb,
)
from scale_workload import Pool, batches, conversation_id, load_pool

from memsvc.storage.milvus import lite
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.support.launch import free_port, wait_serving

DEFAULT_BEAM = ROOT / "data" / "beam" / "chats" / "100K"
WARMUP = 20
CALL_BYTES = 3 << 20  # text per AppendEvents call, well under the 16 MiB request limit


class Node:
    """One `memsvc serve` child on a data dir, restartable; its stub and metrics port."""

    def __init__(self, data: Path, env: dict[str, str]) -> None:
        self.data = data
        self.env = env
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.channel: grpc.Channel | None = None

    def start(self) -> float:
        """Seconds from the process's start to SERVING."""
        port = free_port()
        began = time.perf_counter()
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "memsvc", "serve", "--listen", f"127.0.0.1:{port}"),
                *("--data-dir", str(self.data), "--log-level", "WARNING"),
            ],
            cwd=ROOT,
            env={
                **os.environ,
                "MEMSVC_METRICS_LISTEN": f"127.0.0.1:{self.metrics_port}",
                "TQDM_DISABLE": "1",
                **self.env,
            },
        )
        self.channel = grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        wait_serving(self.channel, self.proc, timeout_s=3600)
        return time.perf_counter() - began

    @property
    def stub(self) -> pb_grpc.MemoryServiceStub:
        return pb_grpc.MemoryServiceStub(self.channel)  # type: ignore[no-untyped-call]

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=300)

    def rss_mib(self) -> tuple[float, float]:
        """memsvc's own resident memory and its children's (Milvus Lite; render processes
        and multiprocessing's resource tracker, ~70 MiB, where the node has them), MiB."""
        assert self.proc is not None
        own = rss_kib(self.proc.pid)
        return own / 1024, sum(rss_kib(c) for c in children(self.proc.pid)) / 1024

    def gauge(self, name: str) -> float | None:
        import urllib.request

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        for line in urllib.request.urlopen(url, timeout=30).read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
        return None

    def audited(self, timeout_s: float = 1800) -> None:
        """Wait for the store audit's first round since the start to finish."""
        deadline = time.perf_counter() + timeout_s
        while not self.gauge('memsvc_store_audit_seconds_count{outcome="ok"}'):
            if time.perf_counter() > deadline:
                raise TimeoutError("no store audit finished")
            time.sleep(0.5)

    def chunks(self) -> int:
        return int(self.gauge("memsvc_chunks_stored") or 0)

    def shards_loaded(self, budget: bool, timeout_s: float = 1800) -> float:
        """Seconds from now until a store in shards has loaded every one (0: one
        collection, loaded before SERVING); under a memory `budget`, until its loads
        stopped (as many as the budget holds: the count unchanged for 5 s, not counted)."""
        began = time.perf_counter()
        last, since = -1.0, began
        while self.gauge('memsvc_store_shards{state="unloaded"}') not in (None, 0.0):
            now = time.perf_counter()
            if now - began > timeout_s:
                raise TimeoutError("shards not loaded")
            loaded = self.gauge('memsvc_store_shards{state="loaded"}') or 0.0
            if loaded != last:
                last, since = loaded, now
            elif budget and now - since >= 5:
                return since - began
            time.sleep(0.2)
        return time.perf_counter() - began


def settled(stub: pb_grpc.MemoryServiceStub, timeout_s: float = 24 * 3600) -> None:
    """Until nothing is pending or indexing anywhere."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = stub.GetIndexStatus(pb.GetIndexStatusRequest(page_size=1), timeout=120)
        if s.total_backlog == 0 and s.pending == 0 and s.indexing == 0:
            return
        time.sleep(0.5)
    raise TimeoutError("indexing did not settle")


def load(
    node: Node, pool: Pool, numbers: range, turns: int, beam_share: float, paused: bool = False
) -> tuple[float, str]:
    """Append conversations `numbers` from two client threads, then wait until indexed;
    returns the seconds, and where the server's time went (ms per 1,000 turns). `paused`:
    indexing is paused while the appends run, then resumed (a backfill: the worker then
    has the cores to itself)."""
    times = ServerTimes(node.metrics_port)
    began = time.perf_counter()
    if paused:
        node.stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=True), timeout=120)
    calls = batches(pool, numbers, turns, beam_share, CALL_BYTES)
    lock = threading.Lock()
    failures: list[str] = []

    def client() -> None:
        stub = node.stub
        while True:
            with lock:
                batch = next(calls, None)
            if batch is None:
                return
            reply = stub.AppendEvents(
                pb.AppendEventsRequest(events=[to_pb(e) for e in batch]), timeout=600
            )
            if reply.errors:
                failures.append(str(reply.errors[0]))

    threads = [threading.Thread(target=client) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError(f"{len(failures)} calls had refused events: {failures[0]}")
    if paused:
        node.stub.SetIndexingPaused(pb.SetIndexingPausedRequest(paused=False), timeout=120)
    settled(node.stub)
    elapsed = time.perf_counter() - began
    return elapsed, breakdown([times.since(len(numbers) * turns / 1000, "write", ["AppendEvents"])])


def timed(fn: Callable[..., Any], *args: Any, repeats: int = 1) -> list[float]:
    """Milliseconds of each of `repeats` calls of `fn(*args)`."""
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        out.append((time.perf_counter() - start) * 1000)
    return out


def searches(
    stub: pb_grpc.MemoryServiceStub, pool: Pool, loaded: int, n: int, scoped: bool
) -> list[float]:
    rng = random.Random(1)
    asks = [
        pb.EmbedDbRequest(
            query_text=rng.choice(pool.questions),
            top_k=10,
            mode=pb.SEARCH_MODE_HYBRID,
            filters=pb.SearchFilters(conversation_ids=[conversation_id(rng.randrange(loaded))])
            if scoped
            else None,
        )
        for _ in range(n + WARMUP)
    ]
    for request in asks[:WARMUP]:
        stub.EmbedDb(request, timeout=120)
    return [t for request in asks[WARMUP:] for t in timed(stub.EmbedDb, request)]


def status_pages(stub: pb_grpc.MemoryServiceStub) -> tuple[list[float], float, int]:
    """The first page's milliseconds (20 calls), the seconds of a walk over every page,
    and the conversations the walk saw."""
    first = timed(stub.GetIndexStatus, pb.GetIndexStatusRequest(), repeats=20)
    began, seen, token = time.perf_counter(), 0, ""
    while True:
        page = stub.GetIndexStatus(pb.GetIndexStatusRequest(page_token=token), timeout=120)
        seen += len(page.conversations)
        token = page.next_page_token
        if not token:
            return first, time.perf_counter() - began, seen


def export(stub: pb_grpc.MemoryServiceStub, cid: str) -> int:
    events, token = 0, ""
    while True:
        page = stub.ExportEvents(
            pb.ExportEventsRequest(conversation_id=cid, page_token=token), timeout=120
        )
        events += len(page.events)
        token = page.next_page_token
        if not token:
            return events


def export_all(stub: pb_grpc.MemoryServiceStub) -> tuple[float, int]:
    """Every conversation's events, as a backup would read them: seconds, events."""
    began, events, token = time.perf_counter(), 0, ""
    while True:
        page = stub.GetIndexStatus(pb.GetIndexStatusRequest(page_token=token), timeout=120)
        events += sum(export(stub, c.conversation_id) for c in page.conversations)
        token = page.next_page_token
        if not token:
            return time.perf_counter() - began, events


def searchable(node: Node, loaded: int, turns: int, trials: int) -> tuple[list[float], str]:
    """Milliseconds from one appended turn to its being indexed, in `trials` conversations
    (each its own step), and where the steps' time went (ms per step, by stage)."""
    stub, rng = node.stub, random.Random(2)
    times = ServerTimes(node.metrics_port)
    # Past the conversation's own turns, and past those of any run before on a kept node
    # (`--reuse`): a turn appended again is a no-op, indexed before it was asked for.
    first = turns + int(time.time()) % 1_000_000_000
    out = []
    for trial in range(trials):
        cid = conversation_id(rng.randrange(loaded))
        turn = first + trial
        event = pb.MemoryEvent(
            conversation_id=cid,
            turn_id=turn,
            speaker="user",
            text=f"A new note {trial}: the meeting moved to Thursday.",
            timestamp="2026-11-29T10:00:00+00:00",
        )
        start = time.perf_counter()
        stub.AppendEvents(pb.AppendEventsRequest(events=[event], allow_gaps=True), timeout=60)
        wait = pb.WaitForIndexedRequest(conversation_id=cid, turn_id=turn, timeout_ms=60_000)
        if not stub.WaitForIndexed(wait, timeout=70).indexed:
            raise TimeoutError(f"{cid} turn {turn} not indexed in 60 s")
        out.append((time.perf_counter() - start) * 1000)
    return out, breakdown([times.since(trials, "write", [])])


def reindex_one(stub: pb_grpc.MemoryServiceStub, cid: str) -> float:
    start = time.perf_counter()
    stub.Reindex(pb.ReindexRequest(conversation_ids=[cid]), timeout=60)
    while True:
        (row,) = stub.GetIndexStatus(
            pb.GetIndexStatusRequest(conversation_ids=[cid]), timeout=60
        ).conversations
        if row.state == "idle" and not row.reindexing:
            return (time.perf_counter() - start) * 1000
        time.sleep(0.02)


def purge_one(stub: pb_grpc.MemoryServiceStub, cid: str) -> float:
    start = time.perf_counter()
    stub.LogicalDeleteBySource(pb.LogicalDeleteBySourceRequest(conversation_id=cid), timeout=120)
    stub.PurgeDeleted(pb.PurgeDeletedRequest(conversation_id=cid), timeout=120)
    return (time.perf_counter() - start) * 1000


def disk_bytes(paths: Sequence[Path]) -> int:
    return sum(f.stat().st_size for p in paths for f in p.rglob("*") if f.is_file())


def measure(node: Node, pool: Pool, loaded: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of one stage, on a node holding conversations 0..loaded-1."""
    stub = node.stub
    row: dict[str, Any] = {"conversations": loaded, "chunks": node.chunks()}
    own, milvus = node.rss_mib()
    row |= {"rss_memsvc_mib": round(own), "rss_milvus_lite_mib": round(milvus)}
    row["disk_bytes_per_chunk"] = round(disk_bytes(args.data_paths) / max(1, row["chunks"]))
    for label, scoped in (("scoped", True), ("unscoped", False)):
        if args.memory_mib and not scoped:
            # under a budget that holds part of the shards, a search of every conversation
            # loads each shard in turn (memory bounded, seconds a search): not measured
            row[f"{label}_hybrid_p50_ms"] = None
            continue
        spent = ServerTimes(node.metrics_port)
        times = searches(stub, pool, loaded, args.searches, scoped)
        row[f"{label}_hybrid_p50_ms"] = round(percentile(times, 50), 2)
        row[f"{label}_hybrid_p99_ms"] = round(percentile(times, 99), 2)
        row[f"{label}_stages_ms"] = breakdown(
            [spent.since(args.searches + WARMUP, "search", ["EmbedDb"])]
        )
    first, walk_s, seen = status_pages(stub)
    row |= {"status_page_ms": round(statistics.median(first), 2), "status_walk_s": round(walk_s, 3)}
    assert seen >= loaded, (seen, loaded)
    ready, steps = searchable(node, loaded, args.turns, 10)
    row |= {"searchable_ms": round(statistics.median(ready), 1), "step_stages_ms": steps}
    rng = random.Random(3)
    picks = [conversation_id(rng.randrange(loaded)) for _ in range(10)]
    row["export_one_ms"] = round(
        statistics.median(t for cid in picks for t in timed(export, stub, cid)), 2
    )
    row["export_all_s"] = round(export_all(stub)[0], 3)
    row["reindex_one_ms"] = round(statistics.median(reindex_one(stub, cid) for cid in picks[:3]), 1)
    row["reindex_all_s"] = None
    if loaded <= args.reindex_all_up_to:
        start = time.perf_counter()
        stub.Reindex(pb.ReindexRequest(all=True), timeout=600)
        settled(stub)
        row["reindex_all_s"] = round(time.perf_counter() - start, 1)
    # appended for this only: the stage's conversations stay (a measure again of a kept
    # node takes a victim of its own: the first one's turns stay deleted)
    victim = 10_000_000 + loaded + (int(time.time()) % 100_000 * 1_000_000 if args.reuse else 0)
    load(node, pool, range(victim, victim + 1), args.turns, args.beam_share)
    row["purge_one_ms"] = round(purge_one(stub, conversation_id(victim)), 1)
    node.stop()
    row["start_to_serving_s"] = round(node.start(), 1)
    row["then_every_shard_loaded_s"] = round(node.shards_loaded(bool(args.memory_mib)), 1)
    own, milvus = node.rss_mib()
    row |= {"rss_after_start_memsvc_mib": round(own), "rss_after_start_milvus_mib": round(milvus)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", type=Path, default=DEFAULT_EVAL)
    parser.add_argument("--beam", type=Path, default=DEFAULT_BEAM)
    parser.add_argument("--beam-share", type=float, default=0.2)
    parser.add_argument(
        "--stages",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[20, 1000, 10_000, 100_000],
        help="conversations held at each stage (cumulative)",
    )
    # ~1.2 chunks per turn: 100,000 conversations of 8 turns are ~1M chunks
    parser.add_argument("--turns", type=int, default=8, help="turns per conversation")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--searches", type=int, default=200)
    parser.add_argument("--reindex-all-up-to", type=int, default=10_000)
    parser.add_argument(
        "--shards", type=int, default=1, help="MEMSVC_STORE_SHARDS of the node's new store"
    )
    parser.add_argument(
        "--memory-mib", type=int, default=0, help="MEMSVC_STORE_MEMORY_MIB (0: no budget)"
    )
    parser.add_argument(
        "--render-processes",
        type=int,
        default=1,
        help="MEMSVC_INDEX_RENDER_PROCESSES (0: chunks rendered in the server)",
    )
    parser.add_argument(
        "--index-workers", type=int, default=3, help="MEMSVC_INDEX_WORKERS of the node"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--backfill",
        action="store_true",
        help="append each stage with indexing paused, then index it (the load rate of a"
        " restore or backfill, not of live traffic)",
    )
    parser.add_argument(
        "--keep", type=Path, help="hold the node's data in this new directory, kept after the run"
    )
    parser.add_argument(
        "--reuse",
        type=Path,
        help="a directory --keep held: its node measured again (as its last stage, with this"
        " run's settings: --memory-mib), nothing loaded",
    )
    args = parser.parse_args()

    pool = load_pool(args.eval, args.beam)
    if args.reuse:
        root = args.reuse
    elif args.keep:
        args.keep.mkdir(parents=True)
        root = args.keep
    else:
        root = scratch_dir("memsvc-bench-scale-")
    embed_port = free_port()
    embedder = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "hash_embedder.py"), "--port", str(embed_port)]
    )
    env = {
        "MEMSVC_EMBED_PROVIDER": "openai",
        "MEMSVC_EMBED_URL": f"http://127.0.0.1:{embed_port}/v1",
        "MEMSVC_EMBED_MODEL": "hash-384",
        "MEMSVC_EMBED_FALLBACK": "false",
        "MEMSVC_OVERSIZE": "truncate",  # BEAM holds a 349,000-character turn
        "MEMSVC_STORE_SHARDS": str(args.shards),
        "MEMSVC_STORE_MEMORY_MIB": str(args.memory_mib),
        # the load's CPU is memsvc's one Python process: rendering goes to a second core
        "MEMSVC_INDEX_RENDER_PROCESSES": str(args.render_processes),
        "MEMSVC_INDEX_WORKERS": str(args.index_workers),
    }
    args.data_paths = [root / "data"]
    stop_backend: Callable[[], None] = lambda: None  # noqa: E731
    if args.backend == "postgres":
        from tests.support.fleet import MilvusServer
        from tests.support.postgres import PostgresCluster

        cluster = PostgresCluster(durable=True).start()
        (root / "milvus").mkdir()
        milvus = MilvusServer(root / "milvus" / "milvus.db")
        env |= {"MEMSVC_DATABASE_URL": cluster.create_database(), "MEMSVC_MILVUS_URI": milvus.uri}
        args.data_paths += [cluster.data, root / "milvus"]

        def stop_backend() -> None:
            milvus.stop()
            cluster.destroy()

    node = Node(root / "data", env)
    rows: list[dict[str, Any]] = []
    try:
        node.start()
        if args.backend == "postgres":
            # The milvus-lite TCP server stands in for a Milvus server, and keeps Milvus
            # Lite's SQLite table, whose key memsvc indexes only in files it serves itself
            # (a Milvus server finds rows by key without a scan): indexed here, as there.
            lite.index_primary_keys(str(root / "milvus" / "milvus.db"), "memsvc_chunks")
        loaded = args.stages[-1] if args.reuse else 0
        if args.reuse:
            # a kept node's shards load in the background after SERVING: measured once they
            # are (or, under a budget, once its loads stopped), as a loaded node is
            node.shards_loaded(bool(args.memory_mib))
            node.audited()  # its first round reads every shard: searches would queue behind
        for target in [loaded] if args.reuse else args.stages:
            row: dict[str, Any] = {}
            if not args.reuse:
                load_s, spent = load(
                    node, pool, range(loaded, target), args.turns, args.beam_share, args.backfill
                )
                added = (target - loaded) * args.turns
                row = {
                    "load_turns_per_s": round(added / load_s, 1),
                    "load_ms_per_1000_turns": spent,
                }
            loaded = target
            row |= measure(node, pool, loaded, args)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.json:
                args.json.write_text(
                    json.dumps(
                        {
                            "machine": machine(),
                            "backend": args.backend,
                            "shards": args.shards,
                            "memory_mib": args.memory_mib,
                            "render_processes": args.render_processes,
                            "index_workers": args.index_workers,
                            "rows": rows,
                        },
                        indent=2,
                    )
                )
    finally:
        node.stop()
        embedder.terminate()
        stop_backend()
    print(f"Scale, {args.backend}, {args.turns} turns per conversation, {machine()}")
    keys = list(dict.fromkeys(k for r in rows for k in r))
    print("| | " + " | ".join(f"{r['conversations']:,} conv." for r in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    for key in keys:
        print(f"| {key} | " + " | ".join(str(r.get(key, "")) for r in rows) + " |")


if __name__ == "__main__":
    main()
