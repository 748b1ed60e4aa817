"""Performance against the model's own speed: ingest, replay, query load, query embedding, RSS.

    python benchmarks/perf.py [--conversations 2] [--rows 100000] [--repeats 3]

The server runs as a child process (`memsvc serve`, loopback); load comes from this process.
Stages, each in a fresh data dir:
  1. ingest: LoCoMo conversations through Build+Upsert (50 turns a call), then through
     AppendEvents to indexed; live chunks per second, against
  2. raw model: FlagEmbedding encode_corpus of the same chunk texts in this process, best of
     several batch sizes (servers stopped, so nothing competes for the 2 cores);
  3. replay: the same records upserted into a fresh store, then upserted again;
  4. query load: `--rows` chunks over 1,000 conversations (texts and real vectors from stage
     1, cycled with a little noise, written straight into Milvus Lite), EmbedDb scoped to
     one conversation at 1/4/8 clients, and unscoped; server RSS;
  5. query embedding: EmbedChunk over gRPC and the lean in-process path.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import numpy as np
from _common import DEFAULT_EVAL, machine, percentile, to_pb

from evals.locomo import load_locomo
from memsvc.config import Settings
from memsvc.embedder import BUNDLED_MODEL_NAME, bundled_model_path, load_embedder
from memsvc.ids import chunk_id
from memsvc.store import ChunkStore, StoredChunk, content_hash
from memsvc.types import ChunkMetadata, ChunkRecord, TimestampRange, TurnRange
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.support.launch import list_all_chunks, running_server


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def load(
    stub: pb_grpc.MemoryServiceStub,
    clients: int,
    per_client: int,
    make: Callable[[int], pb.EmbedDbRequest],
) -> tuple[float, list[float]]:
    """`clients` threads, `per_client` queries each; returns (queries/s, latencies ms)."""
    lat: list[float] = []
    lock = threading.Lock()

    def run(c: int) -> None:
        mine = []
        for i in range(per_client):
            req = make(c * 100_000 + i)
            t = time.perf_counter()
            stub.EmbedDb(req)
            mine.append((time.perf_counter() - t) * 1000)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=run, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return clients * per_client / (time.perf_counter() - start), lat


def populate(tmp_root: Path, data: Path, serialized: list[bytes], rows: int) -> None:
    """`rows` chunks over 1,000 conversations: texts of the LoCoMo chunks, their real
    vectors (from the Build+Upsert store) with a little noise."""
    records = [pb.ChunkRecord.FromString(b) for b in serialized]
    live = len(records)
    name, dim = BUNDLED_MODEL_NAME, 384
    source = ChunkStore(
        str((tmp_root / "sync" / "milvus.db").resolve()), "memsvc_chunks", name, dim
    )
    vectors = {c.record.chunk_id: c.vector for c in source.query("", with_vectors=True)}
    source.close()
    pool_vecs = np.stack([vectors[r.chunk_id] for r in records if r.chunk_id in vectors])
    data.mkdir(parents=True)
    store = ChunkStore(str((data / "milvus.db").resolve()), "memsvc_chunks", name, dim)
    rng = np.random.default_rng(0)
    batch: list[StoredChunk] = []
    for n in range(rows):
        conv, k = f"conv-{n % 1000:04d}", n // 1000
        src = records[n % live]
        vec = pool_vecs[n % len(pool_vecs)] + rng.normal(0, 0.02, dim).astype(np.float32)
        meta = ChunkMetadata(
            conversation_id=conv,
            turn_range=TurnRange(2 * k, 2 * k + 3),
            timestamp_range=TimestampRange(
                src.metadata.timestamp_range.start, src.metadata.timestamp_range.end
            ),
            participants=tuple(src.metadata.participants),
            speakers=tuple(src.metadata.speakers),
            intent_tag=src.metadata.intent_tag,
            chunk_version=1,
        )
        rec = ChunkRecord(chunk_id(conv, 2 * k, 2 * k + 3, 1), src.text, meta)
        batch.append(StoredChunk(rec, content_hash(rec), vec / np.linalg.norm(vec)))
        if len(batch) == 2000:
            store.upsert(batch)
            batch = []
    store.upsert(batch)
    store._client.flush(store.collection)
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", type=Path, default=DEFAULT_EVAL)
    parser.add_argument("--conversations", type=int, default=2)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--no-query", dest="query", action="store_false", help="skip the query-load stage"
    )
    args = parser.parse_args()
    convs = load_locomo(args.eval)[: args.conversations]
    questions = [q.question for c in load_locomo(args.eval) for q in c.questions][:500]
    report: list[tuple[str, str, str, str]] = []
    tmp_root = Path(tempfile.mkdtemp(prefix="memsvc-perf-"))

    # 1a. Build + Upsert
    with running_server(tmp_root / "sync") as (stub, _pid):
        t = time.perf_counter()
        for conv in convs:
            for i in range(0, len(conv.events), 50):
                built = stub.BuildIncrementalChunks(
                    pb.BuildIncrementalChunksRequest(
                        events=[to_pb(e) for e in conv.events[i : i + 50]]
                    )
                )
                stub.UpsertVectorRecords(pb.UpsertVectorRecordsRequest(records=built.chunks))
        sync_s = time.perf_counter() - t
        records = [r for conv in convs for r in list_all_chunks(stub, conv.conversation_id)]
    texts = [r.text for r in records]
    live = len(records)
    print(f"sync ingest: {live} live chunks in {sync_s:.1f} s", flush=True)

    # 1b. AppendEvents -> indexed
    with running_server(tmp_root / "async") as (stub, _pid):
        t = time.perf_counter()
        for conv in convs:
            for i in range(0, len(conv.events), 50):
                stub.AppendEvents(
                    pb.AppendEventsRequest(events=[to_pb(e) for e in conv.events[i : i + 50]])
                )
        for conv in convs:
            res = stub.WaitForIndexed(
                pb.WaitForIndexedRequest(
                    conversation_id=conv.conversation_id,
                    turn_id=len(conv.events) - 1,
                    timeout_ms=300_000,
                )
            )
            assert res.indexed
        async_s = time.perf_counter() - t
    print(f"async ingest: {async_s:.1f} s", flush=True)

    # 2. raw model on the same texts, best batch size
    from FlagEmbedding import FlagModel

    raw = FlagModel(str(bundled_model_path()), pooling_method="mean", use_fp16=False, devices="cpu")
    raw_s = {}
    for batch in (16, 32, 64):
        t = time.perf_counter()
        raw.encode_corpus(texts, batch_size=batch, max_length=512)
        raw_s[batch] = time.perf_counter() - t
    best_batch = min(raw_s, key=lambda b: raw_s[b])
    raw_rate = live / raw_s[best_batch]
    print(f"raw model: {raw_rate:.1f} chunks/s at batch {best_batch} ({raw_s})", flush=True)
    del raw
    report.append(
        (
            "ingest Build+Upsert vs raw model",
            ">= 0.9x",
            f"{live / sync_s:.1f} vs {raw_rate:.1f} chunks/s = {raw_s[best_batch] / sync_s:.2f}x",
            "",
        )
    )
    report.append(
        (
            "ingest Append->indexed vs raw model",
            ">= 0.9x",
            f"{live / async_s:.1f} vs {raw_rate:.1f} chunks/s = {raw_s[best_batch] / async_s:.2f}x",
            "",
        )
    )

    # 3. replay
    with running_server(tmp_root / "replay") as (stub, _pid):
        batches = [records[i : i + 100] for i in range(0, live, 100)]
        t = time.perf_counter()
        for b in batches:
            stub.UpsertVectorRecords(pb.UpsertVectorRecordsRequest(records=b))
        first_s = time.perf_counter() - t
        replays = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            unchanged = 0
            for b in batches:
                unchanged += stub.UpsertVectorRecords(
                    pb.UpsertVectorRecordsRequest(records=b)
                ).unchanged
            replays.append(time.perf_counter() - t)
            assert unchanged == live
    replay_s = statistics.median(replays)
    report.append(
        (
            "replay vs first upsert",
            ">= 50x",
            f"{first_s:.2f} s / {replay_s:.3f} s = {first_s / replay_s:.0f}x",
            f"median of {args.repeats}",
        )
    )

    if args.query:
        # 4. query load over --rows chunks in 1,000 conversations. Written from a child process:
        # Milvus Lite keeps its file locked until the process that opened it exits.
        data = tmp_root / "query"
        t = time.perf_counter()
        child = mp.get_context("spawn").Process(
            target=populate,
            args=(tmp_root, data, [r.SerializeToString() for r in records], args.rows),
        )
        child.start()
        child.join()
        assert child.exitcode == 0, "populating the query store failed"
        print(f"wrote {args.rows} rows in {time.perf_counter() - t:.0f} s", flush=True)

        def scoped(i: int) -> pb.EmbedDbRequest:
            return pb.EmbedDbRequest(
                query_text=questions[i % len(questions)],
                filters=pb.SearchFilters(conversation_ids=[f"conv-{(i * 7919) % 1000:04d}"]),
            )

        def scoped_dense(i: int) -> pb.EmbedDbRequest:
            req = scoped(i)
            req.mode = pb.SEARCH_MODE_DENSE
            return req

        def unscoped(i: int) -> pb.EmbedDbRequest:
            return pb.EmbedDbRequest(query_text=questions[i % len(questions)])

        with running_server(data) as (stub, pid):
            load(stub, 1, 20, scoped)  # warm-up
            results: dict[str, list[tuple[float, list[float]]]] = {}
            for _ in range(args.repeats):
                for name, clients, per, make in (
                    ("scoped hybrid, 1 client", 1, 100, scoped),
                    ("scoped dense, 1 client", 1, 100, scoped_dense),
                    ("scoped hybrid, 4 clients", 4, 50, scoped),
                    ("scoped hybrid, 8 clients", 8, 30, scoped),
                    ("unscoped hybrid, 1 client", 1, 50, unscoped),
                ):
                    results.setdefault(name, []).append(load(stub, clients, per, make))
            lat_embed = []
            for i in range(200):
                t = time.perf_counter()
                stub.EmbedChunk(pb.EmbedChunkRequest(query=questions[i % len(questions)]))
                lat_embed.append((time.perf_counter() - t) * 1000)
            server_rss = rss_kib(pid)
            milvus_rss = sum(rss_kib(c) for c in children(pid))
        for name, runs in results.items():
            qps = statistics.median(r[0] for r in runs)
            p50 = statistics.median(percentile(r[1], 50) for r in runs)
            p99 = statistics.median(percentile(r[1], 99) for r in runs)
            target = ""
            if name.startswith("scoped hybrid, 1"):
                target = "p50 <= 15 ms, p99 <= 40 ms"
            report.append(
                (
                    name,
                    target,
                    f"{qps:.1f} q/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms",
                    f"median of {args.repeats}",
                )
            )
        one = statistics.median(r[0] for r in results["scoped hybrid, 1 client"])
        four = statistics.median(r[0] for r in results["scoped hybrid, 4 clients"])
        report.append(("throughput 4 clients / 1 client", ">= 1.6x", f"{four / one:.2f}x", ""))
        report.append(
            (
                "EmbedChunk over gRPC, one short query",
                "p50 <= 8 ms",
                f"p50 {percentile(lat_embed, 50):.1f} ms, p99 {percentile(lat_embed, 99):.1f} ms",
                "200 calls",
            )
        )
        report.append(
            (
                f"server RSS with {args.rows} chunks",
                "report",
                f"{server_rss / 1024:.0f} MiB server + {milvus_rss / 1024:.0f} MiB milvus-lite",
                "",
            )
        )

    # 5. the lean in-process query path
    emb = load_embedder(Settings(embed_model=BUNDLED_MODEL_NAME, data_dir=tmp_root / "model"))
    lean = []
    for i in range(200):
        t = time.perf_counter()
        emb.encode_queries([questions[i % len(questions)]])
        lean.append((time.perf_counter() - t) * 1000)
    flag = []
    for i in range(50):
        t = time.perf_counter()
        emb._flag.encode_queries([questions[i % len(questions)]])
        flag.append((time.perf_counter() - t) * 1000)
    report.append(
        (
            "query embedding in-process: lean path / FlagEmbedding",
            "p50 <= 8 ms",
            f"{percentile(lean, 50):.1f} / {percentile(flag, 50):.1f} ms",
            "",
        )
    )

    print(
        f"\nmemsvc perf, {date.today()}, {machine()}, {BUNDLED_MODEL_NAME}, {live} LoCoMo chunks from {len(convs)} conversations\n"
    )
    print("| measure | target | measured | note |")
    print("|---|---|---|---|")
    for row in report:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
