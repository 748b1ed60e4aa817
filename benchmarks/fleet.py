"""Replicas on one PostgreSQL log and one Milvus server: throughput, search latency, the
database's share of a turn, and LISTEN/NOTIFY against polling.

    python benchmarks/fleet.py [--eval FILE] [--replicas 1,2,3] [--clients 4] [--searches 300]

For each replica count, a fresh database and collection: `--clients` threads append the LoCoMo
dev conversations (2 turns per call, each call to the next replica in turn) while the
replicas' index workers embed; then hybrid searches scoped to one conversation, spread over
the replicas the same way. PostgreSQL runs durable (fsync on) with pg_stat_statements, which
counts the statements and their server time per appended turn. Last, one new turn's
append -> searchable time through a replica without index workers, so a worker on the other
replica must be woken: by NOTIFY, or by its 0.5 s poll with MEMSVC_DATABASE_LISTEN=false.

All replicas share this machine's cores: more replicas add model throughput only where
cores were idle. The per-replica efficiency column says how much.
"""

from __future__ import annotations

import argparse
import itertools
import threading
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import psycopg
from _common import DEFAULT_EVAL, machine, percentile, scratch_dir, to_pb

from evals.locomo import Conversation, load_locomo
from memsvc.v1 import memory_pb2 as pb
from tests.support.fleet import MilvusServer, Replica, start_fleet
from tests.support.postgres import PostgresCluster


@dataclass
class Run:
    replicas: int
    turns: int
    chunks: int
    appended_s: float
    searchable_s: float
    append_ms: list[float]
    search_ms: list[float]
    search_s: float
    statements: int
    statement_ms: float
    commits: int
    store_writes: float  # chunks upserted or updated in Milvus
    passages: float  # texts through the model
    model_s: float  # time in the model for them
    search_statements: int  # PostgreSQL statements during the measured searches


def round_robin(replicas: list[Replica]) -> itertools.cycle[Replica]:
    return itertools.cycle(replicas)


def ingest(
    replicas: list[Replica], convs: list[Conversation], clients: int, batch_turns: int
) -> tuple[list[float], float, float]:
    latencies: list[float] = []
    lock = threading.Lock()
    per_conv = [
        [
            [to_pb(e) for e in c.events[i : i + batch_turns]]
            for i in range(0, len(c.events), batch_turns)
        ]
        for c in convs
    ]
    shards = [per_conv[i::clients] for i in range(clients)]

    def client(k: int, mine: list[list[list[pb.MemoryEvent]]]) -> None:
        targets = itertools.cycle(replicas[k % len(replicas) :] + replicas[: k % len(replicas)])
        for calls in mine:
            for batch in calls:
                stub = next(targets).stub
                t = time.perf_counter()
                res = stub.AppendEvents(pb.AppendEventsRequest(events=batch))
                ms = (time.perf_counter() - t) * 1000
                assert not res.errors, res.errors
                with lock:
                    latencies.append(ms)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k, s)) for k, s in enumerate(shards)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    appended_s = time.perf_counter() - start
    targets = round_robin(replicas)
    for c in convs:
        res = next(targets).stub.WaitForIndexed(
            pb.WaitForIndexedRequest(
                conversation_id=c.conversation_id, turn_id=len(c.events) - 1, timeout_ms=300_000
            )
        )
        assert res.indexed, res.status
    return latencies, appended_s, time.perf_counter() - start


def search(
    replicas: list[Replica], convs: list[Conversation], clients: int, count: int
) -> tuple[list[float], float]:
    queries = [(c.conversation_id, q.question) for c in convs for q in c.questions][:count]
    latencies: list[float] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        targets = itertools.cycle(replicas[k % len(replicas) :] + replicas[: k % len(replicas)])
        for conversation_id, question in queries[k::clients]:
            t = time.perf_counter()
            next(targets).stub.EmbedDb(
                pb.EmbedDbRequest(
                    query_text=question,
                    top_k=10,
                    filters=pb.SearchFilters(conversation_ids=[conversation_id]),
                )
            )
            with lock:
                latencies.append((time.perf_counter() - t) * 1000)

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, time.perf_counter() - start


def database_counts(url: str) -> tuple[int, float, int]:
    """(statements, their server ms, commits) in this database since its last reset."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0)"
            " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = current_database()"
        ).fetchone()
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None and commits is not None
    return int(row[0]), float(row[1]), int(commits[0])


def reset_counts(url: str) -> tuple[int, float, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
    return database_counts(url)


def one_run(
    root: Path,
    cluster: PostgresCluster,
    milvus: MilvusServer,
    n: int,
    convs: list[Conversation],
    args: argparse.Namespace,
) -> Run:
    url = cluster.create_database()
    replicas = start_fleet(
        root / f"n{n}", n, url, milvus.uri, metrics=True, MEMSVC_COLLECTION=f"fleet_{n}"
    )
    try:
        base = reset_counts(url)
        append_ms, appended_s, searchable_s = ingest(replicas, convs, args.clients, 2)
        statements, statement_ms, commits = (
            a - b for a, b in zip(database_counts(url), base, strict=True)
        )
        chunks = sum(
            len(
                replicas[0]
                .stub.ListChunks(
                    pb.ListChunksRequest(conversation_id=c.conversation_id, page_size=1000)
                )
                .chunks
            )
            for c in convs
        )
        store_writes = sum(
            r.metric("memsvc_chunks_written_total", outcome=o)
            for r in replicas
            for o in ("upserted", "updated")
        )
        passages = sum(r.metric("memsvc_embedded_texts_total", kind="passage") for r in replicas)
        model_s = sum(
            r.metric("memsvc_embed_duration_seconds_sum", kind="passage") for r in replicas
        )
        search(replicas, convs, args.clients, 20)  # warm every replica's query path
        before = database_counts(url)[0]
        search_ms, search_s = search(replicas, convs, args.clients, args.searches)
        search_statements = database_counts(url)[0] - before - 2  # less the counting itself
    finally:
        for r in replicas:
            r.stop()
    return Run(
        n,
        sum(len(c.events) for c in convs),
        chunks,
        appended_s,
        searchable_s,
        append_ms,
        search_ms,
        search_s,
        int(statements),
        float(statement_ms),
        int(commits),
        store_writes,
        passages,
        model_s,
        search_statements,
    )


def wake_times(
    root: Path, cluster: PostgresCluster, milvus: MilvusServer, listen: bool, trials: int
) -> list[float]:
    """append -> searchable of one turn through a replica with no index worker: the other
    replica's worker must learn of it (NOTIFY, or its poll)."""
    url = cluster.create_database()
    env = {"MEMSVC_DATABASE_LISTEN": str(listen).lower(), "MEMSVC_COLLECTION": f"wake_{listen}"}
    front = start_fleet(
        root / f"wake-front-{listen}", 1, url, milvus.uri, **env, MEMSVC_INDEX_WORKERS="0"
    )
    back = start_fleet(root / f"wake-back-{listen}", 1, url, milvus.uri, **env)
    times: list[float] = []
    try:
        stub = front[0].stub
        for k in range(trials + 2):
            event = pb.MemoryEvent(
                conversation_id="wake",
                turn_id=k,
                speaker="user" if k % 2 == 0 else "assistant",
                text=f"Follow-up number {k}: I booked the pottery class for next Saturday.",
                timestamp="2023-12-01T10:00:00+00:00",
            )
            time.sleep(0.7)  # the worker idle in its wait, as between real turns
            t = time.perf_counter()
            stub.AppendEvents(pb.AppendEventsRequest(events=[event]))
            res = stub.WaitForIndexed(
                pb.WaitForIndexedRequest(conversation_id="wake", turn_id=k, timeout_ms=60_000)
            )
            assert res.indexed
            if k >= 2:  # the first two warm the model and the collection
                times.append((time.perf_counter() - t) * 1000)
    finally:
        for r in front + back:
            r.stop()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", type=Path, default=DEFAULT_EVAL)
    parser.add_argument("--replicas", default="1,2,3")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--searches", type=int, default=300)
    parser.add_argument("--wake-trials", type=int, default=20)
    args = parser.parse_args()
    convs = load_locomo(args.eval)
    root = scratch_dir("memsvc-fleet-bench-")
    cluster = PostgresCluster(
        durable=True, options="-c shared_preload_libraries=pg_stat_statements"
    )
    cluster.start()
    milvus = MilvusServer(root / "milvus.db")
    try:
        runs = [
            one_run(root, cluster, milvus, int(n), convs, args) for n in args.replicas.split(",")
        ]
        notify = wake_times(root, cluster, milvus, True, args.wake_trials)
        poll = wake_times(root, cluster, milvus, False, args.wake_trials)
    finally:
        milvus.stop()
        cluster.destroy()

    print(f"Fleet, {args.eval.name}, {date.today()}, {machine()}")
    print(
        f"PostgreSQL 15 (fsync on), milvus-lite TCP server, {args.clients} client threads,"
        " 2 turns per AppendEvents, calls round-robin over the replicas\n"
    )
    print(
        "| replicas | all searchable | chunks/s | per-replica efficiency | AppendEvents p50 / p99"
        " | hybrid EmbedDb p50 / p99 | searches/s | PG statements per turn | PG ms per turn"
        " | commits per turn |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = runs[0].chunks / runs[0].searchable_s / runs[0].replicas
    for r in runs:
        rate = r.chunks / r.searchable_s
        print(
            f"| {r.replicas} | {r.searchable_s:.1f} s ({r.turns} turns, {r.chunks} chunks)"
            f" | {rate:.1f} | {rate / r.replicas / base:.2f}"
            f" | {percentile(r.append_ms, 50):.1f} / {percentile(r.append_ms, 99):.1f} ms"
            f" | {percentile(r.search_ms, 50):.1f} / {percentile(r.search_ms, 99):.1f} ms"
            f" | {len(r.search_ms) / r.search_s:.1f}"
            f" | {r.statements / r.turns:.1f} | {r.statement_ms / r.turns:.2f}"
            f" | {r.commits / r.turns:.1f} |"
        )
    print(
        "\n| replicas | Milvus chunk writes per turn | texts embedded per turn"
        " | model ms per turn | PostgreSQL ms per turn | PostgreSQL statements per search |"
    )
    print("|---|---|---|---|---|---|")
    for r in runs:
        print(
            f"| {r.replicas} | {r.store_writes / r.turns:.2f} | {r.passages / r.turns:.2f}"
            f" | {r.model_s * 1000 / r.turns:.1f} | {r.statement_ms / r.turns:.2f}"
            f" | {r.search_statements / len(r.search_ms):.1f} |"
        )
    print("\n| one new turn, appended on a replica without workers | p50 / p99 |")
    print("|---|---|")
    print(f"| woken by NOTIFY | {percentile(notify, 50):.0f} / {percentile(notify, 99):.0f} ms |")
    print(
        f"| polling (MEMSVC_DATABASE_LISTEN=false) | {percentile(poll, 50):.0f}"
        f" / {percentile(poll, 99):.0f} ms |"
    )


if __name__ == "__main__":
    main()
