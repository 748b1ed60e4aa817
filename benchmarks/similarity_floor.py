"""Where a similarity floor for "related" lies, per model (ADK's `min_similarity`, issue
83): LoCoMo dev questions (60 per conversation) against every turn of the other
conversations (unrelated by construction) and against their evidence turns that share no
word with the question; beside the model's cosine of unrelated texts
(`memsvc.services.fusion.unrelated_similarity`, what the server reports). Prints, per
floor, the share of each that reaches it.

    PYTHONPATH=. .venv/bin/python benchmarks/similarity_floor.py [--model multilingual-e5-small]
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

import numpy as np

from benchmarks._common import machine
from evals.locomo import load_locomo
from memsvc.config import Settings
from memsvc.embedding.providers import load_embedder
from memsvc.services.fusion import UNRELATED_TEXTS, unrelated_similarity

ROOT = Path(__file__).resolve().parents[1]
WORD = re.compile(r"\w+")
COMMON = set(
    "the a an of to in on and or is are was were what when where who how did do does i you"
    " my your it for with at by from that this".split()
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    parser.add_argument("--eval", type=Path, default=ROOT.parent / "shared/eval/locomo-dev.json")
    args = parser.parse_args()
    conversations = load_locomo(args.eval)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(  # type: ignore[call-arg]
            listen="127.0.0.1:0", data_dir=Path(tmp), embed_model=args.model, log_format="json"
        )
        model = load_embedder(settings)
    texts = list(UNRELATED_TEXTS)
    unrelated = unrelated_similarity(model.encode_queries(texts), model.probe(texts))
    turns = [np.asarray(model.probe([e.text for e in c.events])) for c in conversations]
    others: list[np.ndarray] = []
    apart: list[float] = []  # evidence turns sharing no word with their question
    for i, c in enumerate(conversations):
        questions = [q for q in c.questions if q.evidence][:60]
        vectors = np.asarray(model.encode_queries([q.question for q in questions]))
        others += [(vectors @ v.T).ravel() for j, v in enumerate(turns) if j != i]
        for q, row in zip(questions, vectors @ turns[i].T, strict=True):
            asked = {w.lower() for w in WORD.findall(q.question)} - COMMON
            for t in (t for t in q.evidence if t < len(c.events)):
                if not asked & {w.lower() for w in WORD.findall(c.events[t].text)}:
                    apart.append(float(row[t]))
    unrelated_turns, evidence = np.concatenate(others), np.array(apart)
    print(f"# {args.model}, {machine()}; unrelated_similarity {unrelated:.3f}")
    print(f"# {len(unrelated_turns)} (question, other conversation's turn) pairs,")
    print(f"# {len(evidence)} evidence turns sharing no word with their question")
    print()
    print("| floor | other conversations' turns reaching it | evidence turns sharing no word |")
    print("|---:|---:|---:|")
    for floor in np.arange(0.30, 0.92, 0.02):
        print(
            f"| {floor:.2f} | {np.mean(unrelated_turns >= floor):.4f} |"
            f" {np.mean(evidence >= floor):.3f} |"
        )


if __name__ == "__main__":
    main()
