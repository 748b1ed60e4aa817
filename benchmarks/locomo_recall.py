"""Recall of LoCoMo evidence turns through the public RPCs, per search mode.

    python benchmarks/locomo_recall.py [--eval FILE] [--modes dense,keyword,hybrid]

For every question of categories 1-4, search that question's conversation only. A hit
covers the turns of its turn_range. Reports recall@5, recall@10, recall within a budget of
20 turns (hits taken in rank order while their turns stay within 20; the first hit always
counts), turns per hit, ingest time and query latency p50/p99; then, per mode, the same
recalls per question category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop) and
recall within 20 turns per conversation (how stable a change is across conversations).
Method: shared/eval/README.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import defaultdict
from datetime import date
from pathlib import Path

from _common import DEFAULT_EVAL, ingest, machine, percentile

from evals.locomo import load_locomo
from memsvc.v1 import memory_pb2 as pb
from tests.support.launch import list_all_chunks, running_server

MODES = {
    "dense": pb.SEARCH_MODE_DENSE,
    "keyword": pb.SEARCH_MODE_KEYWORD,
    "hybrid": pb.SEARCH_MODE_HYBRID,
}
TURN_BUDGET = 20
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}


def covered(hits: list[pb.Hit]) -> list[set[int]]:
    return [set(range(h.metadata.turn_range.start, h.metadata.turn_range.end + 1)) for h in hits]


def within_budget(spans: list[set[int]], budget: int) -> set[int]:
    turns: set[int] = set()
    for i, span in enumerate(spans):
        if i and len(turns | span) > budget:
            break
        turns |= span
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", type=Path, default=DEFAULT_EVAL)
    parser.add_argument("--modes", default="dense,keyword,hybrid")
    parser.add_argument("--batch-turns", type=int, default=50, help="turns per Build call")
    parser.add_argument("--mmr", type=float, default=0.0, help="mmr_lambda for every query")
    args = parser.parse_args()
    convs = load_locomo(args.eval)
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp)) as (stub, _pid):
        t0 = time.perf_counter()
        chunks = 0
        for conv in convs:
            chunks += ingest(stub, conv.events, args.batch_turns)[0]
        ingest_s = time.perf_counter() - t0
        live = sum(len(list_all_chunks(stub, c.conversation_id)) for c in convs)
        turns = sum(len(c.events) for c in convs)
        print(
            f"ingested {turns} turns: {chunks} chunk writes, {live} live chunks, {ingest_s:.1f} s"
        )
        rows = []
        # mode -> group ("all", "category 1", conversation id) -> [r5, r10, r20t, questions]
        groups: dict[str, dict[str, list[float]]] = {}
        for mode_name in args.modes.split(","):
            by_group: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
            groups[mode_name] = by_group
            per_hit: list[int] = []
            lat: list[float] = []
            for conv in convs:
                for q in conv.questions:
                    if q.category > 4 or not q.evidence:
                        continue
                    req = pb.EmbedDbRequest(
                        query_text=q.question,
                        top_k=10,
                        mode=MODES[mode_name],
                        mmr_lambda=args.mmr,
                        filters=pb.SearchFilters(conversation_ids=[conv.conversation_id]),
                    )
                    s = time.perf_counter()
                    hits = list(stub.EmbedDb(req).hits)
                    lat.append((time.perf_counter() - s) * 1000)
                    spans = covered(hits)
                    per_hit += [len(x) for x in spans]
                    evidence = set(q.evidence)
                    top5 = set().union(*spans[:5]) if spans else set()
                    top10 = set().union(*spans) if spans else set()
                    q5 = len(evidence & top5) / len(evidence)
                    q10 = len(evidence & top10) / len(evidence)
                    qb = len(evidence & within_budget(spans, TURN_BUDGET)) / len(evidence)
                    for key in ("all", f"category {q.category}", conv.conversation_id):
                        g = by_group[key]
                        g[0], g[1], g[2], g[3] = g[0] + q5, g[1] + q10, g[2] + qb, g[3] + 1
            r5, r10, rb, n = by_group["all"]
            rows.append(
                (
                    mode_name,
                    r5 / n,
                    r10 / n,
                    rb / n,
                    sum(per_hit) / max(1, len(per_hit)),
                    percentile(lat, 50),
                    percentile(lat, 99),
                    int(n),
                )
            )
    head = f"LoCoMo recall, {args.eval.name}, {date.today()}, {machine()}"
    print(f"\n{head}, batch {args.batch_turns} turns, mmr {args.mmr}")
    print(f"ingest: {turns} turns -> {chunks} chunk writes, {live} live chunks, {ingest_s:.1f} s\n")
    print(
        "| mode | recall@5 | recall@10 | recall@20 turns | turns/hit"
        " | p50 ms | p99 ms | questions |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for m, a, b, c, t, p50, p99, n in rows:
        print(f"| {m} | {a:.3f} | {b:.3f} | {c:.3f} | {t:.2f} | {p50:.1f} | {p99:.1f} | {n} |")
    print("\nper category: recall@5 / recall@10 / recall@20 turns (questions)\n")
    print("| mode | " + " | ".join(f"{c} {name}" for c, name in CATEGORIES.items()) + " |")
    print("|---|" + "---|" * len(CATEGORIES))
    for m, by_group in groups.items():
        cells = []
        for c in CATEGORIES:
            g = by_group[f"category {c}"]
            k = max(1, int(g[3]))
            cells.append(f"{g[0] / k:.3f} / {g[1] / k:.3f} / {g[2] / k:.3f} ({int(g[3])})")
        print(f"| {m} | " + " | ".join(cells) + " |")
    conv_ids = [c.conversation_id for c in convs]
    print("\nper conversation: recall@20 turns\n")
    print("| mode | " + " | ".join(conv_ids) + " |")
    print("|---|" + "---|" * len(conv_ids))
    for m, by_group in groups.items():
        cells = [f"{by_group[c][2] / max(1, int(by_group[c][3])):.3f}" for c in conv_ids]
        print(f"| {m} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
