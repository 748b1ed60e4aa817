"""Evidence recall within a turn budget, per conversation shape, beside a naive baseline.

    python benchmarks/recall.py [--shapes locomo,facts,beam] [--eval FILE] [--beam DIR]
                                [--modes dense,keyword,hybrid] [--chats 1-10] [--remote]
                                [--model minilm|e5]

Three shapes of conversation:
- locomo: LoCoMo dev (`--eval`, default ../shared/eval/locomo-dev.json): short chat turns
  between two people; categories 1-4 (multi-hop, temporal, open-domain, single-hop).
- facts: the same samples' session observations, one fact a turn (evals.locomo.
  load_facts): turns that are independent facts, where windows of several turns could
  dilute each one and search must still find what one vector per turn finds.
- beam: BEAM 100K chats (`--beam`, default data/beam/chats/100K; fetch the repository
  mohammadtavakoli78/BEAM into a git-ignored folder, its data has no license to commit):
  long agent turns (code, logs, standing instructions). Chats 1-10 are the dev split;
  11-20 and the larger splits are held out (`--chats 11-20 --held-out`, for a final
  measurement only, never for tuning).

Each conversation is ingested through BuildIncrementalChunks + UpsertVectorRecords into a
`memsvc serve` child (MEMSVC_OVERSIZE=truncate: BEAM holds a 349,000-character turn). For
every question with evidence turns, each system returns turns within a budget of 10 and
of 5, 10 and 20 turns, and recall = evidence turns returned / evidence turns:
- naive: one vector per turn (its first 512 tokens, the model's limit) with the same
  bundled model, in this process; the top 5 / 10 / 20 turns by cosine;
- memsvc in each mode: EmbedDb with `turn_budget` 5 / 10 / 20 (the turns of the standing
  instructions and of the hits, each turn counted once).
LoCoMo also reports recall@10 hits (top_k 10, no budget), the figure `make eval` floors.

With `--remote` (`make bench-recall` passes it), the same model (MiniLM) also runs behind Infinity
(.venv-infinity, an OpenAI-compatible server) for a second memsvc, and the table gains its
rows: the remote path returns one vector per text, so a long turn's head and gist and the
pooled turn vectors are not the token-level ones (docs/embedders.md). Also printed: the
mean top-10 overlap of the two paths' hybrid hits (chunk ids, equal across paths).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np
from _common import DEFAULT_EVAL, ROOT, ingest, machine, percentile

from evals import beam, locomo
from memsvc.config import Settings
from memsvc.domain.types import MemoryEvent
from memsvc.embedding.e5 import E5_MODEL_NAME
from memsvc.embedding.loading import load_local_embedder
from memsvc.embedding.model import BUNDLED_MODEL_NAME
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc
from tests.support.embedding_server import REMOTE_MODEL_NAME, InfinityServer, bundled_model_dir
from tests.support.launch import running_server

MODES = {
    "dense": pb.SEARCH_MODE_DENSE,
    "keyword": pb.SEARCH_MODE_KEYWORD,
    "hybrid": pb.SEARCH_MODE_HYBRID,
}
BUDGETS = (5, 10, 20)
DEFAULT_BEAM = ROOT / "data" / "beam" / "chats" / "100K"
MODELS = {"minilm": BUNDLED_MODEL_NAME, "e5": E5_MODEL_NAME}


@dataclass(frozen=True)
class Question:
    question: str
    group: str  # category group reported
    category: str
    evidence: tuple[int, ...]


@dataclass(frozen=True)
class Conversation:
    conversation_id: str
    events: list[MemoryEvent]
    questions: list[Question]


def locomo_shape(path: Path) -> list[Conversation]:
    return [
        Conversation(c.conversation_id, c.events, locomo_shape_questions(c))
        for c in locomo.load_locomo(path)
    ]


def facts_shape(path: Path) -> list[Conversation]:
    return [
        Conversation(c.conversation_id, c.events, locomo_shape_questions(c))
        for c in locomo.load_facts(path)
    ]


def locomo_shape_questions(c: locomo.Conversation) -> list[Question]:
    names = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
    return [
        Question(q.question, "all", names[q.category], q.evidence)
        for q in c.questions
        if q.category in names and q.evidence
    ]


def beam_shape(path: Path, chats: Sequence[int]) -> list[Conversation]:
    return [
        Conversation(
            c.conversation_id,
            c.events,
            [
                Question(q.question, beam.group_of(q.category), q.category, q.evidence)
                for q in c.questions
            ],
        )
        for c in beam.load_beam(path, list(chats))
    ]


# A system: (conversation, question, budget) -> turns returned within the budget.
System = Callable[[Conversation, Question, int], set[int]]


def naive(embedder: object) -> System:
    """One vector per turn (the model reads its first 512 tokens), top turns by cosine."""
    vectors: dict[str, np.ndarray] = {}

    def turns(conv: Conversation, q: Question, budget: int) -> set[int]:
        if conv.conversation_id not in vectors:
            vectors[conv.conversation_id] = embedder.encode_passages(  # type: ignore[attr-defined]
                [e.text for e in conv.events]
            )
        qv = embedder.encode_queries([q.question])[0]  # type: ignore[attr-defined]
        order = np.argsort(-(vectors[conv.conversation_id] @ qv), kind="stable")[:budget]
        return {conv.events[i].turn_id for i in order}

    return turns


def memsvc(stub: pb_grpc.MemoryServiceStub, mode: int, latencies: list[float]) -> System:
    def turns(conv: Conversation, q: Question, budget: int) -> set[int]:
        started = time.perf_counter()
        found = stub.EmbedDb(
            pb.EmbedDbRequest(
                query_text=q.question,
                mode=mode,
                turn_budget=budget,
                filters=pb.SearchFilters(conversation_ids=[conv.conversation_id]),
            )
        )
        latencies.append((time.perf_counter() - started) * 1000)
        out: set[int] = set()
        for h in [*found.standing, *found.hits]:
            # a narrowed hit names the turns it returns
            out.update(h.turns or range(h.metadata.turn_range.start, h.metadata.turn_range.end + 1))
        return out

    return turns


def measure(convs: Sequence[Conversation], system: System) -> dict[str, dict[int, list[float]]]:
    """key (group or category) -> budget -> recalls per question."""
    out: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for conv in convs:
        for q in conv.questions:
            evidence = set(q.evidence)
            for budget in BUDGETS:
                got = system(conv, q, budget)
                assert len(got) <= budget, (q.question, len(got))
                r = len(evidence & got) / len(evidence)
                for key in (q.group, q.category):
                    out[key][budget].append(r)
    return out


def recall_at_10_hits(stub: pb_grpc.MemoryServiceStub, convs: Sequence[Conversation]) -> float:
    values = []
    for conv in convs:
        for q in conv.questions:
            hits = stub.EmbedDb(
                pb.EmbedDbRequest(
                    query_text=q.question,
                    top_k=10,
                    filters=pb.SearchFilters(conversation_ids=[conv.conversation_id]),
                )
            ).hits
            got = {
                t
                for h in hits
                for t in range(h.metadata.turn_range.start, h.metadata.turn_range.end + 1)
            }
            values.append(len(set(q.evidence) & got) / len(q.evidence))
    return statistics.mean(values)


def chats_arg(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="locomo,facts,beam")
    parser.add_argument("--model", choices=sorted(MODELS), default="minilm")
    parser.add_argument("--eval", type=Path, default=DEFAULT_EVAL)
    parser.add_argument("--beam", type=Path, default=DEFAULT_BEAM)
    parser.add_argument("--chats", type=chats_arg, default=list(beam.DEV_CHATS))
    parser.add_argument("--held-out", action="store_true", help="allow chats beyond 1-10")
    parser.add_argument("--modes", default="dense,keyword,hybrid")
    parser.add_argument("--batch-turns", type=int, default=50, help="turns per Build call")
    parser.add_argument(
        "--remote", action="store_true", help="also through Infinity (make infinity-venv)"
    )
    args = parser.parse_args()
    if args.remote and args.model != "minilm":
        parser.error("--remote runs MiniLM behind Infinity: beside --model minilm only")
    if set(args.chats) - set(beam.DEV_CHATS) and not args.held_out:
        parser.error("BEAM chats beyond 1-10 are held out: pass --held-out for a final measurement")
    shapes: dict[str, list[Conversation]] = {}
    for shape in args.shapes.split(","):
        if shape in ("locomo", "facts"):
            if not args.eval.is_file():
                parser.error(f"{args.eval} not found (LoCoMo dev: --eval FILE)")
            shapes[shape] = (locomo_shape if shape == "locomo" else facts_shape)(args.eval)
        elif shape == "beam":
            if not args.beam.is_dir():
                parser.error(
                    f"{args.beam} not found: fetch github.com/mohammadtavakoli78/BEAM and point"
                    " --beam at its chats/100K"
                )
            shapes[shape] = beam_shape(args.beam, args.chats)
        else:
            parser.error(f"unknown shape {shape!r} (locomo, facts, beam)")
    model_name = MODELS[args.model]
    with tempfile.TemporaryDirectory() as tmp:
        embedder = load_local_embedder(
            Settings(embed_model=model_name, data_dir=Path(tmp) / "naive")
        )
        os.environ["MEMSVC_OVERSIZE"] = "truncate"
        with contextlib.ExitStack() as servers:
            stub, _pid = servers.enter_context(
                running_server(Path(tmp) / "server", env={"MEMSVC_EMBED_MODEL": model_name})
            )
            remote = None
            if args.remote:
                model = bundled_model_dir()
                infinity = InfinityServer(model, REMOTE_MODEL_NAME).start()
                servers.callback(infinity.stop)
                remote, _ = servers.enter_context(
                    running_server(
                        Path(tmp) / "remote",
                        env={
                            "MEMSVC_EMBED_PROVIDER": "openai",
                            "MEMSVC_EMBED_URL": infinity.url,
                            "MEMSVC_EMBED_MODEL": REMOTE_MODEL_NAME,
                            "MEMSVC_EMBED_TOKENIZER": str(model),
                        },
                    )
                )
            print(f"# Recall within a turn budget, {date.today()}, {machine()}")
            print(
                f"# model {model_name}; memsvc ingest in calls of {args.batch_turns} turns"
                + ("; remote: the same model behind Infinity" if remote else "")
            )
            for shape, convs in shapes.items():
                report_shape(shape, convs, stub, embedder, args, remote)


def report_shape(
    shape: str,
    convs: list[Conversation],
    stub: pb_grpc.MemoryServiceStub,
    embedder: object,
    args: argparse.Namespace,
    remote: pb_grpc.MemoryServiceStub | None = None,
) -> None:
    t0 = time.perf_counter()
    for conv in convs:
        ingest(stub, conv.events, args.batch_turns)
    ingest_s = time.perf_counter() - t0
    if remote is not None:
        for conv in convs:
            ingest(remote, conv.events, args.batch_turns)
    turns = sum(len(c.events) for c in convs)
    questions = sum(len(c.questions) for c in convs)
    print(
        f"\n## {shape}: {len(convs)} conversations, {turns} turns, {questions} questions;"
        f" ingest {ingest_s:.1f} s"
    )
    rows: dict[str, dict[str, dict[int, list[float]]]] = {"naive": measure(convs, naive(embedder))}
    latency: dict[str, list[float]] = {}
    for mode in args.modes.split(","):
        latency[mode] = []
        rows[f"memsvc {mode}"] = measure(convs, memsvc(stub, MODES[mode], latency[mode]))
    if remote is not None:
        for mode in args.modes.split(","):
            latency[f"{mode}, remote"] = []
            rows[f"memsvc {mode}, remote"] = measure(
                convs, memsvc(remote, MODES[mode], latency[f"{mode}, remote"])
            )
    groups = sorted(
        {q.group for c in convs for q in c.questions},
        key=["main", "all", "standing", "ordering"].index,
    )
    cats = sorted({q.category for c in convs for q in c.questions})
    print("\nrecall within 5 / 10 / 20 turns\n")
    print("| system | " + " | ".join(groups) + " | p50 ms |")
    print("|---|" + "---|" * (len(groups) + 1))
    for name, by in rows.items():
        cells = [" / ".join(f"{statistics.mean(by[g][b]):.3f}" for b in BUDGETS) for g in groups]
        lat = latency.get(name.removeprefix("memsvc "))
        p50 = f"{percentile(lat, 50):.1f}" if lat else "-"
        print(f"| {name} | " + " | ".join(cells) + f" | {p50} |")
    print("\nper category, recall within 20 turns (questions)\n")
    print("| system | " + " | ".join(f"{c} ({len(rows['naive'][c][20])})" for c in cats) + " |")
    print("|---|" + "---|" * len(cats))
    for name, by in rows.items():
        print(f"| {name} | " + " | ".join(f"{statistics.mean(by[c][20]):.3f}" for c in cats) + " |")
    if shape == "locomo":
        print(
            f"\nhybrid recall@10 hits (top_k 10, no budget): {recall_at_10_hits(stub, convs):.3f}"
        )
        if remote is not None:
            print(f"remote: {recall_at_10_hits(remote, convs):.3f}")
    if remote is not None:
        print(f"\nhybrid top-10 overlap, local and remote: {overlap(stub, remote, convs):.3f}")


def overlap(
    local: pb_grpc.MemoryServiceStub,
    remote: pb_grpc.MemoryServiceStub,
    convs: Sequence[Conversation],
) -> float:
    """Mean share of the local path's top-10 hybrid hits the remote path also returns."""
    shares = []
    for conv in convs:
        for q in conv.questions:
            request = pb.EmbedDbRequest(
                query_text=q.question,
                top_k=10,
                filters=pb.SearchFilters(conversation_ids=[conv.conversation_id]),
            )
            ours = {h.chunk_id for h in local.EmbedDb(request).hits}
            theirs = {h.chunk_id for h in remote.EmbedDb(request).hits}
            if ours:
                shares.append(len(ours & theirs) / len(ours))
    return statistics.mean(shares)


if __name__ == "__main__":
    main()
