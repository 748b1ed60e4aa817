"""`make bench-embedders`: the local model against the same model behind an
OpenAI-compatible server (Infinity, started here from .venv-infinity), on this machine.

Per provider, on fresh data dirs: asynchronous ingest (AppendEvents of generated
conversations until every turn is indexed, chunks/s), passage embedding alone (the
chunk texts in the index worker's batches, texts/s), one query's embedding and one
scoped hybrid search (p50/p99 over the same questions). Runs are interleaved and
repeated (`--runs`, default 3); medians are printed, with remote/local ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks._common import machine, percentile, scratch_dir
from memsvc.app import Services, build_services
from memsvc.config import Settings
from memsvc.domain.types import SearchFilters, SearchRequest
from memsvc.embedding.model import BUNDLED_MODEL_NAME
from memsvc.embedding.providers import load_embedder
from memsvc.ports import Embedder
from tests.support.conversations import generate
from tests.support.embedding_server import REMOTE_MODEL_NAME, InfinityServer, bundled_model_dir

QUESTIONS = [
    "where did we go hiking?",
    "what is the dog called?",
    "which restaurant did they book?",
    "when is the trip to Tokyo?",
    "what did she paint last weekend?",
    "who is allergic to peanuts?",
    "what book is he reading?",
    "how was the concert?",
]


def settings_for(provider: str, data: Path, url: str) -> Settings:
    if provider == "local":
        return Settings(data_dir=data, embed_model=BUNDLED_MODEL_NAME, metrics_listen="")
    return Settings(
        data_dir=data,
        embed_provider="openai",
        embed_url=url,
        embed_model=REMOTE_MODEL_NAME,
        embed_tokenizer=str(bundled_model_dir()),
        metrics_listen="",
    )


def until_indexed(services: Services, conversations: list[str], timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        states = [s.state for s in services.queue.status(conversations)]
        if states and all(s == "idle" for s in states):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"not indexed in time: {states}")
        services.worker.notify()
        time.sleep(0.05)


def raw_post_ms(url: str) -> list[float]:
    """One question per bare POST: the server's own latency, without memsvc's client."""
    import httpx

    out = []
    with httpx.Client(base_url=url) as client:
        for _ in range(6):
            for q in QUESTIONS:
                t0 = time.perf_counter()
                client.post("/embeddings", json={"model": REMOTE_MODEL_NAME, "input": [q]})
                out.append((time.perf_counter() - t0) * 1000)
    return out


def one_run(
    provider: str, embedder: Embedder, root: Path, url: str, turns: int
) -> dict[str, float]:
    data = root / f"{provider}-{time.monotonic_ns()}"
    services = build_services(settings_for(provider, data, url), embedder=embedder)
    try:
        events, convs, seed = [], [], 0
        while len(events) < turns:
            conv = f"b{seed}"
            events += generate(conv, seed, sessions=3)
            convs.append(conv)
            seed += 1
        started = time.perf_counter()
        services.ingest.append(events)
        until_indexed(services, convs)
        ingest_s = time.perf_counter() - started
        chunks = services.store.count(deleted=False)
        texts = [c.record.text for c in services.store.chunks_of(convs[0])] * 4
        started = time.perf_counter()
        for i in range(0, len(texts), embedder.batch_size * 8):
            embedder.encode_passages(texts[i : i + embedder.batch_size * 8])
        passage_s = time.perf_counter() - started
        query_ms, search_ms = [], []
        for _ in range(6):
            for q in QUESTIONS:
                t0 = time.perf_counter()
                embedder.encode_queries([q])
                query_ms.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                services.search.search(SearchRequest(q, 6, SearchFilters((convs[0],))))
                search_ms.append((time.perf_counter() - t0) * 1000)
        raw_ms = raw_post_ms(url) if provider == "openai" else query_ms
        return {
            "server round trip p50 ms (bare httpx)": percentile(raw_ms, 50),
            "ingest chunks/s": chunks / ingest_s,
            "passages/s": len(texts) / passage_s,
            "query p50 ms": percentile(query_ms, 50),
            "query p99 ms": percentile(query_ms, 99),
            "hybrid search p50 ms": percentile(search_ms, 50),
            "hybrid search p99 ms": percentile(search_ms, 99),
        }
    finally:
        services.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--turns", type=int, default=300, help="turns ingested per run")
    args = parser.parse_args()
    root = scratch_dir("memsvc-bench-embedders-")
    server = InfinityServer(bundled_model_dir(), REMOTE_MODEL_NAME, log=root / "infinity.log")
    server.start()
    try:
        local = load_embedder(settings_for("local", root / "model", server.url))
        remote = load_embedder(settings_for("openai", root / "model", server.url))
        figures: dict[str, list[dict[str, float]]] = {"local": [], "openai": []}
        for run in range(args.runs):
            for provider, embedder in (("local", local), ("openai", remote)):
                figures[provider].append(one_run(provider, embedder, root, server.url, args.turns))
                print(f"run {run + 1} {provider}: {figures[provider][-1]}", flush=True)
    finally:
        server.stop()
    print(f"\n{machine()}; bundled all-MiniLM-L6-v2 in-process (ONNX) vs Infinity 0.0.78")
    print(f"(torch, CPU) on the same machine; medians of {args.runs} runs\n")
    print("| figure | local | openai (Infinity) | openai / local |")
    print("|---|---|---|---|")
    for key in figures["local"][0]:
        lo = statistics.median(r[key] for r in figures["local"])
        re = statistics.median(r[key] for r in figures["openai"])
        print(f"| {key} | {lo:.1f} | {re:.1f} | {re / lo:.2f} |")


if __name__ == "__main__":
    main()
