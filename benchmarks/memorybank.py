"""Chinese memory measured like English: MemoryBank dev (../shared/eval/memorybank-dev.json),
seven users' ten days of exchanges, in Chinese and in English, and across the two.

    python benchmarks/memorybank.py [--models e5,minilm] [--modes dense,keyword,hybrid]

For each model, a `memsvc serve` child with that model (MEMSVC_EMBED_MODEL) ingests every
user's history (one conversation a user, two turns an exchange) in both languages. Each
probing question is asked of its user's history in its own language (zh, en) and across
(en->zh: the English question of the Chinese history, zh->en the reverse; the same stories,
so the same evidence). A question is found within a budget of N turns when the turns of its
answer exchanges (any one, where any suffices) are among those returned; the share found
is reported for N = 10 and 20 (five and ten exchanges) beside two baselines:
- naive: one vector per exchange (its user and assistant text), the same model, in this
  process: the top N/2 exchanges by cosine;
- keyword: BM25 over the exchanges with memsvc's own analyser (jieba words for Chinese,
  stemmed English words), the top N/2 exchanges.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import date
from pathlib import Path

import numpy as np
from _common import ROOT, ingest, machine, percentile
from recall import memsvc  # the same EmbedDb call (it reads conversation_id and question)

from evals import memorybank
from memsvc.config import Settings
from memsvc.domain import bm25
from memsvc.embedding.e5 import E5_MODEL_NAME
from memsvc.embedding.loading import load_local_embedder
from memsvc.embedding.model import BUNDLED_MODEL_NAME
from memsvc.v1 import memory_pb2 as pb
from tests.support.launch import running_server

DEFAULT_FILE = ROOT.parent / "shared" / "eval" / "memorybank-dev.json"
MODELS = {"e5": E5_MODEL_NAME, "minilm": BUNDLED_MODEL_NAME}
MODES = {
    "dense": pb.SEARCH_MODE_DENSE,
    "keyword": pb.SEARCH_MODE_KEYWORD,
    "hybrid": pb.SEARCH_MODE_HYBRID,
}
BUDGETS = (10, 20)
# (conversation, question, budget) -> the turns returned
System = Callable[[memorybank.History, memorybank.Question, int], set[int]]


def query_embedding_ms(embedder: object, histories: Sequence[memorybank.History]) -> float:
    """The median time to embed one question (each question once, in this process)."""
    times = []
    for h in histories:
        for q in h.questions:
            began = time.perf_counter()
            embedder.encode_queries([q.question])  # type: ignore[attr-defined]
            times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def exchange_text(h: memorybank.History, k: int) -> str:
    u, a = h.exchanges[k]
    return f"{h.events[u].text}\n{h.events[a].text}"


def naive(embedder: object) -> System:
    vectors: dict[str, np.ndarray] = {}

    def turns(h: memorybank.History, q: memorybank.Question, budget: int) -> set[int]:
        if h.conversation_id not in vectors:
            texts = [exchange_text(h, k) for k in range(len(h.exchanges))]
            vectors[h.conversation_id] = embedder.encode_passages(texts)  # type: ignore[attr-defined]
        qv = embedder.encode_queries([q.question])[0]  # type: ignore[attr-defined]
        order = np.argsort(-(vectors[h.conversation_id] @ qv), kind="stable")[: budget // 2]
        return {t for k in order for t in h.exchanges[k]}

    return turns


def keyword() -> System:
    docs: dict[str, list[Counter[str]]] = {}

    def turns(h: memorybank.History, q: memorybank.Question, budget: int) -> set[int]:
        if h.conversation_id not in docs:
            docs[h.conversation_id] = [
                Counter(bm25.terms(exchange_text(h, k))) for k in range(len(h.exchanges))
            ]
        counted = docs[h.conversation_id]
        n = len(counted)
        average = sum(sum(c.values()) for c in counted) / n
        scores = []
        for c in counted:
            length = sum(c.values())
            score = 0.0
            for term in set(bm25.terms(q.question)):
                df = sum(1 for d in counted if term in d)
                if not df or not c[term]:
                    continue
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                tf = c[term]
                score += (
                    idf
                    * tf
                    * (bm25.K1 + 1)
                    / (tf + bm25.K1 * (1 - bm25.B + bm25.B * length / average))
                )
            scores.append(score)
        order = np.argsort(-np.array(scores), kind="stable")[: budget // 2]
        return {t for k in order for t in h.exchanges[k]}

    return turns


def share_found(histories: Sequence[memorybank.History], system: System, budget: int) -> float:
    results = []
    for h in histories:
        for q in h.questions:
            got = system(h, q, budget)
            assert len(got) <= budget, (q.question, len(got))
            results.append(memorybank.found(q, got))
    return statistics.mean(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=DEFAULT_FILE)
    parser.add_argument("--models", default="e5,minilm")
    parser.add_argument("--modes", default="dense,keyword,hybrid")
    args = parser.parse_args()
    if not args.file.is_file():
        parser.error(f"{args.file} not found (MemoryBank dev: --file FILE)")
    zh = memorybank.load(args.file, "zh")
    en = memorybank.load(args.file, "en")
    sets = {
        "zh": zh,
        "en": en,
        "en->zh": memorybank.asked_across(zh, en),
        "zh->en": memorybank.asked_across(en, zh),
    }
    print(f"# MemoryBank dev, found within 10 / 20 turns, {date.today()}, {machine()}")
    print(
        "# questions: "
        + ", ".join(f"{k} {sum(len(h.questions) for h in v)}" for k, v in sets.items())
    )
    columns = list(sets)
    for key in args.models.split(","):
        model = MODELS[key]
        with tempfile.TemporaryDirectory() as tmp:
            embedder = load_local_embedder(
                Settings(embed_model=model, data_dir=Path(tmp) / "naive")
            )
            env = {"MEMSVC_EMBED_MODEL": model, "MEMSVC_OVERSIZE": "truncate"}
            with running_server(Path(tmp) / "server", env=env) as (stub, _pid):
                started = time.perf_counter()
                for h in [*zh, *en]:
                    ingest(stub, h.events, 50)
                ingest_s = time.perf_counter() - started
                query_ms = query_embedding_ms(embedder, [*zh, *en])
                rows: dict[str, System] = {
                    "naive (exchange)": naive(embedder),
                    "keyword (BM25)": keyword(),
                }
                latency: dict[str, list[float]] = {}
                for mode in args.modes.split(","):
                    latency[mode] = []
                    rows[f"memsvc {mode}"] = memsvc(stub, MODES[mode], latency[mode])
                turns = sum(len(h.events) for h in [*zh, *en])
                print(
                    f"\n## {model} ({getattr(embedder, 'runtime_label', '?')}): ingest"
                    f" {ingest_s:.1f} s ({turns} turns), query embedding p50 {query_ms:.1f} ms\n"
                )
                print("| system | " + " | ".join(columns) + " | p50 ms |")
                print("|---|" + "---|" * (len(columns) + 1))
                for name, system in rows.items():
                    cells = [
                        " / ".join(f"{share_found(sets[c], system, b):.2f}" for b in BUDGETS)
                        for c in columns
                    ]
                    lat = latency.get(name.removeprefix("memsvc "))
                    p50 = f"{percentile(lat, 50):.1f}" if lat else "-"
                    print(f"| {name} | " + " | ".join(cells) + f" | {p50} |")


if __name__ == "__main__":
    main()
