"""The configured embedder (MEMSVC_EMBED_PROVIDER), with its identity fingerprinted: the
vectors it writes for fixed probe texts, recorded beside what it stores so a different
model cannot silently join them (memsvc.domain.model_identity)."""

from __future__ import annotations

import dataclasses
import time

import structlog

from memsvc.config import Settings
from memsvc.domain.errors import EmbedderError, EmbedderUnavailable
from memsvc.domain.model_identity import (
    PROBE_TEXTS,
    ModelIdentity,
    encode_fingerprint,
    mismatch,
)
from memsvc.embedding import e5
from memsvc.ports import Embedder

log = structlog.get_logger(__name__)

# Waiting for a remote server at start: retries back off to this.
START_RETRY_MAX_S = 5.0


def load_embedder(settings: Settings) -> Embedder:
    """The local model, or a client of an OpenAI-compatible server (which must answer
    before the service serves: start-up waits for it, logging why)."""
    if settings.embed_provider == "openai":
        embedder: Embedder = _remote(settings)
    else:
        try:
            from memsvc.embedding.loading import load_local_embedder
        except ImportError as exc:  # pragma: no cover - the slim install
            raise RuntimeError(_SLIM_INSTALL) from exc
        try:
            embedder = load_local_embedder(settings)
        except ImportError as exc:
            raise RuntimeError(f"{_SLIM_INSTALL} ({exc})") from exc
    embedder.identity = fingerprinted(embedder)
    return embedder


def load_previous_embedder(
    settings: Settings, embedder: Embedder, model: ModelIdentity
) -> Embedder | None:
    """The model that wrote the collection before a model move, for its searches while
    the move lasts (memsvc.services.model_move): the one serving if its vectors are the
    same, else loaded (a bundled model, a local directory, the hub's cache); None if it
    cannot be (its collection then answers by keywords)."""
    if mismatch(model, embedder.identity) is None:
        return embedder
    if model.provider != "local":
        return None
    try:
        previous = load_embedder(
            settings.model_copy(update={"embed_model": model.model, "embed_fallback": False})
        )
    except Exception as exc:
        log.warning("previous_model_unavailable", model=model.describe(), error=str(exc)[:300])
        return None
    why = mismatch(model, previous.identity)
    if why is not None:
        log.warning("previous_model_unavailable", model=model.describe(), error=why)
        return None
    return previous


_SLIM_INSTALL = (
    "MEMSVC_EMBED_PROVIDER=local needs the local model's packages (torch, FlagEmbedding,"
    " ONNX Runtime): pip install 'memsvc[local]', or serve with MEMSVC_EMBED_PROVIDER=openai"
)


def fingerprinted(embedder: Embedder) -> ModelIdentity:
    vectors = embedder.probe(list(PROBE_TEXTS))
    return dataclasses.replace(embedder.identity, fingerprint=encode_fingerprint(vectors.tolist()))


def _remote(settings: Settings) -> Embedder:
    from memsvc.embedding.loading import query_instruction
    from memsvc.embedding.remote import RemoteConfig, RemoteEmbedder, headers
    from memsvc.embedding.tokens import RemoteTokenizer

    key = ""
    if settings.embed_api_key_file is not None:
        try:
            key = settings.embed_api_key_file.read_text().strip()
        except OSError as exc:
            raise RuntimeError(
                f"MEMSVC_EMBED_API_KEY_FILE {settings.embed_api_key_file}: {exc.strerror}"
            ) from None
    config = RemoteConfig(
        url=settings.embed_url,
        model=settings.embed_model,
        api_key=key,
        dimensions=settings.embed_dimensions,
        timeout_s=settings.embed_timeout_s,
        max_retries=settings.embed_max_retries,
        concurrency=settings.embed_concurrency,
        batch_size=settings.embed_batch_size,
        batch_tokens=settings.embed_batch_tokens,
        max_tokens=settings.embed_max_tokens,
        query_instruction=_role_prefix(settings, settings.query_instruction, e5.QUERY_PREFIX)
        or query_instruction(settings.embed_model, settings.query_instruction),
        passage_instruction=_role_prefix(settings, settings.passage_instruction, e5.PASSAGE_PREFIX)
        or "",
        input_type=settings.embed_input_type,
    )
    tokens = RemoteTokenizer.load(settings.embed_tokenizer)
    # The dimension: as configured, else what the server answers for one probe.
    dim = settings.embed_dimensions or _wait_for_dimension(settings, headers(key))
    embedder = RemoteEmbedder(config, tokens, dim)
    log.info(
        "embedder_remote",
        url=settings.embed_url,
        model=settings.embed_model,
        dim=dim,
        tokenizer=tokens.id,
        key="set" if key else "none",
    )
    return embedder


def _role_prefix(settings: Settings, configured: str | None, e5_prefix: str) -> str | None:
    """A remote text's prefix for its role: as configured ("" for none), else an e5 model's
    own unless the server is told the role (embed_input_type) and prefixes it itself."""
    if configured is not None:
        return configured
    if e5.named(settings.embed_model) and not settings.embed_input_type:
        return e5_prefix
    return None


def _wait_for_dimension(settings: Settings, request_headers: dict[str, str]) -> int:
    """Ask the server until it answers: a server still starting (connection refused,
    503) is waited for; one that refuses the request (a wrong key or model) is an error."""
    import httpx

    pause = 0.5
    while True:
        try:
            reply = httpx.post(
                settings.embed_url.rstrip("/") + "/embeddings",
                json={"model": settings.embed_model, "input": [PROBE_TEXTS[0]]},
                headers=request_headers,
                timeout=settings.embed_timeout_s,
            )
        except httpx.TransportError as exc:
            reason = f"{type(exc).__name__}: {exc}"
        else:
            if reply.status_code == 200:
                try:
                    return len(reply.json()["data"][0]["embedding"])
                except (ValueError, KeyError, IndexError, TypeError) as exc:
                    raise EmbedderError(
                        f"{settings.embed_url}/embeddings answered without an embedding: {exc}"
                    ) from None
            if reply.status_code not in (429, 500, 502, 503, 504):
                raise EmbedderUnavailable(
                    f"{settings.embed_url}/embeddings refused model {settings.embed_model!r}:"
                    f" HTTP {reply.status_code} {' '.join(reply.text.split())[:200]}"
                )
            reason = f"HTTP {reply.status_code}"
        log.warning(
            "embedder_waiting",
            url=settings.embed_url,
            reason=reason[:200],
            retry_in_s=pause,
        )
        time.sleep(pause)
        pause = min(START_RETRY_MAX_S, pause * 2)
