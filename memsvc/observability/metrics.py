"""Prometheus metrics, served on their own port (MEMSVC_METRICS_LISTEN).

Labels are bounded sets (method, status code, outcome, kind, reason, state): never a
conversation id or any text. Per-conversation backlog stays in GetIndexStatus.
Counters and histograms live in one process-wide registry; gauges are read when scraped,
through a callable the composition root installs (this module imports no service)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

from memsvc.domain.errors import EmbedderError, StoreUnavailable
from memsvc.domain.records import ModelMoveStatus, QueueGauges, ServerDescription
from memsvc.observability import startup, tracing

# One series per counter and histogram: no `_created` twins (they double the series).
disable_created_metrics()  # type: ignore[no-untyped-call]
REGISTRY = CollectorRegistry(auto_describe=True)

# Queries answer in milliseconds, upserts and waits in seconds to minutes.
RPC_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_EMBED_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

RPC_DURATION = Histogram(
    "memsvc_rpc_duration_seconds",
    "Time to answer an RPC, by method, status code (failed calls included) and transport:"
    " grpc | http.",
    ["method", "code", "transport"],
    buckets=RPC_BUCKETS,
    registry=REGISTRY,
)
RPC_IN_FLIGHT = Gauge(
    "memsvc_rpc_in_flight",
    "RPC handlers running now (every transport).",
    registry=REGISTRY,
)
# Seconds to minutes: a backfill of thousands of turns takes a while.
_LAG_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
INDEX_LAG = Histogram(
    "memsvc_index_lag_seconds",
    "From an accepted append to searchable: the wait of a conversation's oldest waiting"
    " turn, observed when the conversation becomes idle.",
    buckets=_LAG_BUCKETS,
    registry=REGISTRY,
)
BUILD_INFO = Gauge(
    "memsvc_build_info",
    "1, labelled with what serves: version, model, fallback (the bundled model instead of"
    " the configured one), embed backend, dimension, event-log backend.",
    ["version", "model", "fallback", "backend", "dim", "log"],
    registry=REGISTRY,
)
# process_* (CPU, memory, open files) and python_info, as every Python exporter has them
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)


def set_build_info(server: ServerDescription) -> None:
    BUILD_INFO.clear()
    BUILD_INFO.labels(
        server.version,
        server.model,
        str(server.model_fallback).lower(),
        server.embed_backend,
        str(server.dim),
        server.log_backend,
    ).set(1)


CHUNKS_WRITTEN = Counter(
    "memsvc_chunks_written",
    "Chunk writes to the vector store by outcome:"
    " upserted | updated | unchanged | retired | deleted | purged.",
    ["outcome"],
    registry=REGISTRY,
)
RENDER_PROCESSES = Gauge(
    "memsvc_render_processes",
    "Render processes the index steps lay out in (MEMSVC_INDEX_RENDER_PROCESSES; 0 when"
    " laying out in the server, as after processes none of which started).",
    registry=REGISTRY,
)
RENDER_PROCESSES_LOST = Counter(
    "memsvc_render_processes_lost",
    "Times render processes were lost (killed, out of memory): the step in flight laid out"
    " in the server, the next started new ones.",
    registry=REGISTRY,
)
EMBED_DURATION = Histogram(
    "memsvc_embed_duration_seconds",
    "Time of one model call (a batch of texts), by kind: passage | query.",
    ["kind"],
    buckets=_EMBED_BUCKETS,
    registry=REGISTRY,
)
# A stage of a search is a millisecond or less on a small store.
_STAGE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
STAGE_DURATION = Histogram(
    "memsvc_stage_duration_seconds",
    "Time of one stage of a search, or of a write of chunks (Upsert, an index step),"
    " by operation and stage. search: embed | keyword | dense | fuse | read | verify |"
    " standing | plan; write: check | read | tokens | embed | store | bookkeep | settle. A hybrid"
    " search's keyword stage runs during its embed and dense stages. With tracing on, each"
    " stage is also a span, `operation stage`.",
    ["operation", "stage"],
    buckets=_STAGE_BUCKETS,
    registry=REGISTRY,
)


def stage(operation: str, name: str) -> Any:
    """A context manager timing one stage into memsvc_stage_duration_seconds: the
    breakdown `make bench-perf` prints, and an operator's view of a slow search. With
    tracing on, also a span (`search embed`) whose trace id is the sample's exemplar."""
    histogram = STAGE_DURATION.labels(operation, name)
    if not tracing.on():
        return histogram.time()
    return _traced(histogram, f"{operation} {name}")


@contextmanager
def _traced(histogram: Histogram, name: str) -> Iterator[None]:
    with tracing.span(name, tracing.stage_attributes(name)) as current:
        start = time.perf_counter()
        try:
            yield
        finally:
            histogram.observe(time.perf_counter() - start, exemplar=tracing.exemplar(current))


EMBEDDED_TEXTS = Counter(
    "memsvc_embedded_texts",
    "Texts run through the model, by kind: passage | query.",
    ["kind"],
    registry=REGISTRY,
)
EMBED_REQUESTS = Counter(
    "memsvc_embed_requests",
    "Embedding requests by provider (local | openai) and outcome: ok | throttled |"
    " server_error | timeout | connection_error | refused | bad_response | circuit_open"
    " (a remote server's answers; for the local model, ok | error per model call).",
    ["provider", "outcome"],
    registry=REGISTRY,
)
EMBED_OUTCOMES = (
    "ok",
    "throttled",
    "server_error",
    "timeout",
    "connection_error",
    "refused",
    "bad_response",
    "circuit_open",
    "error",
)
HTTP_HEADERS_DROPPED = Counter(
    "memsvc_http_headers_dropped",
    "Headers of HTTP calls not passed on to the gRPC server, by header: traceparent |"
    " tracestate | baggage | authorization (malformed, not printable ASCII, or over its"
    " size limit; the call goes on without it, as W3C Trace Context asks).",
    ["header"],
    registry=REGISTRY,
)
CACHE_LOOKUPS = Counter(
    "memsvc_embed_cache_lookups",
    "Passage embeddings looked up in the cache, by result: hit | miss.",
    ["result"],
    registry=REGISTRY,
)
SEARCH_RECORD_LOOKUPS = Counter(
    "memsvc_search_record_lookups",
    "Records of a hybrid search's hits looked up among those recently returned, by"
    " result: hit (not read again) | miss (read from the store).",
    ["result"],
    registry=REGISTRY,
)
STORE_AUDITS = Histogram(
    "memsvc_store_audit_seconds",
    "Rounds of the store audit (the store's rows compared with the log's layout), by"
    " outcome: ok | failed; and how long each took (~10 s at a million chunks).",
    ["outcome"],
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
UPSERT_FAILURES = Counter(
    "memsvc_upsert_failures",
    "Chunk records not stored, by reason: invalid | unknown | stale | too_long |"
    " store_unavailable | model_error | internal.",
    ["reason"],
    registry=REGISTRY,
)

# RecordError reasons -> the bounded label set above
_FAILURE_REASON = {
    "superseded": "stale",
    "deleted": "stale",
    "mismatch": "stale",
    "unknown": "unknown",
    "too_long": "too_long",
    "invalid": "invalid",
}


def count_upsert_failures(reasons: Iterator[str] | list[str]) -> None:
    for reason in reasons:
        UPSERT_FAILURES.labels(_FAILURE_REASON.get(reason, "invalid")).inc()


def count_failed_write(exc: BaseException, records: int) -> None:
    """A whole store write failed: every record in it counts, by the cause."""
    if isinstance(exc, StoreUnavailable):
        reason = "store_unavailable"
    elif isinstance(exc, EmbedderError):
        reason = "model_error"
    else:
        reason = "internal"
    UPSERT_FAILURES.labels(reason).inc(records)


@dataclass(frozen=True)
class GaugeReading:
    """What the gauges show, read from the running services at scrape time."""

    queue: QueueGauges
    paused: bool
    store_up: bool
    disk_full: bool = False
    log_up: bool = True
    chunks_stored: int | None = None
    embedder_up: bool = True
    # A model move in progress.
    model_move: ModelMoveStatus | None = None
    # A store in shards: (loaded, shards).
    store_shards: tuple[int, int] | None = None


class ServiceGauges(Collector):  # type: ignore[misc]
    """Index queue and store state, read at scrape time through `read` (None: not yet
    serving, no gauges)."""

    def __init__(self) -> None:
        self.read: Callable[[], GaugeReading] | None = None

    def describe(self) -> list[Any]:
        return []  # families are only known at collect time; skip registry checks

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.read is None:
            return
        reading = self.read()
        gauges = reading.queue
        yield GaugeMetricFamily(
            "memsvc_index_backlog_turns",
            "Accepted turns not yet indexed, over every conversation.",
            value=gauges.backlog,
        )
        states = GaugeMetricFamily(
            "memsvc_index_conversations",
            "Conversations known to the index queue, by state.",
            labels=["state"],
        )
        for state in ("idle", "pending", "indexing", "failed"):
            states.add_metric([state], gauges.by_state.get(state, 0))
        yield states
        oldest = gauges.oldest_pending_since
        yield GaugeMetricFamily(
            "memsvc_index_oldest_pending_seconds",
            "Age of the oldest accepted turn not yet indexed (0 = nothing waiting).",
            value=max(0.0, time.time() - oldest) if oldest is not None else 0.0,
        )
        yield GaugeMetricFamily(
            "memsvc_index_paused",
            "1 while indexing is paused (SetIndexingPaused).",
            value=1 if reading.paused else 0,
        )
        yield GaugeMetricFamily(
            "memsvc_store_up",
            "1 while the vector store answers, 0 while it is down.",
            value=1 if reading.store_up else 0,
        )
        yield GaugeMetricFamily(
            "memsvc_embedder_up",
            "1 while the embedder answers; 0 while a remote embedding server's circuit is"
            " open (searches UNAVAILABLE, indexing waits). Always 1 for the local model.",
            value=1 if reading.embedder_up else 0,
        )
        yield GaugeMetricFamily(
            "memsvc_log_up",
            "1 while the event log (its database) answers, 0 while it is unreachable.",
            value=1 if reading.log_up else 0,
        )
        if reading.chunks_stored is not None:
            yield GaugeMetricFamily(
                "memsvc_chunks_stored",
                "Chunks in the vector store that searches may return (not deleted; every"
                " chunk version).",
                value=reading.chunks_stored,
            )
        if reading.model_move is not None:
            move = GaugeMetricFamily(
                "memsvc_model_move_conversations",
                "While the store is rebuilt for a new model: conversations rebuilt and left"
                " (searches answer from the collection before for those left).",
                labels=["state"],
            )
            left = reading.model_move.left
            move.add_metric(["rebuilt"], reading.model_move.conversations - left)
            move.add_metric(["left"], left)
            yield move
        if reading.store_shards is not None:
            shards = GaugeMetricFamily(
                "memsvc_store_shards",
                "A store in shards: shards loaded in memory (searchable at once) and not"
                " (loaded when next used; after a start, and past the memory budget).",
                labels=["state"],
            )
            loaded, total = reading.store_shards
            shards.add_metric(["loaded"], loaded)
            shards.add_metric(["unloaded"], total - loaded)
            yield shards
        yield GaugeMetricFamily(
            "memsvc_disk_full",
            "1 while writes fail because the disk under the data dir is full (DISK_FULL).",
            value=1 if reading.disk_full else 0,
        )


SERVICE_GAUGES = ServiceGauges()
REGISTRY.register(SERVICE_GAUGES)


class Readiness:
    """`/readyz`: what the composition root says (SERVING on gRPC health); not ready until
    it installs a callable."""

    def __init__(self) -> None:
        self.read: Callable[[], bool] = lambda: False
        # what an operator must know though it is ready (the model fallback), one per line
        self.notes: Callable[[], list[str]] = lambda: []


READINESS = Readiness()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            # With tracing on, OpenMetrics when the scraper asks (Prometheus does): the
            # format that carries exemplars, the trace ids of latency samples
            if tracing.on() and "application/openmetrics-text" in self.headers.get("accept", ""):
                text = openmetrics.generate_latest(REGISTRY)  # type: ignore[no-untyped-call]
                self._reply(200, text, openmetrics.CONTENT_TYPE_LATEST)
            else:
                self._reply(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        elif path == "/healthz":  # the process answers
            self._reply(200, b"ok\n")
        elif path == "/readyz":  # it should get traffic: model loaded, store and log up
            ready = READINESS.read()
            phase = None if ready else startup.starting()
            state = "ready" if ready else "not ready"
            said = [f"{state}: starting up, {phase}" if phase else state, *READINESS.notes()]
            self._reply(200 if ready else 503, "".join(f"{s}\n" for s in said).encode())
        else:
            self._reply(404, b"not found: /metrics, /healthz, /readyz\n")

    def _reply(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # scrapes are not log lines


def serve_metrics(listen: str) -> int:
    """Serve /metrics, /healthz and /readyz on HOST:PORT (port 0: any) in a daemon thread;
    returns the port."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = Server((host, int(port)), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return int(server.server_address[1])


# Every label value of the bounded sets exists from the start (at 0), so dashboards and
# alerts see the series before the first event.
for _outcome in ("upserted", "updated", "unchanged", "retired", "deleted", "purged"):
    CHUNKS_WRITTEN.labels(_outcome)
for _kind in ("passage", "query"):
    EMBEDDED_TEXTS.labels(_kind)
for _outcome in ("ok", "error"):
    EMBED_REQUESTS.labels("local", _outcome)
for _result in ("hit", "miss"):
    CACHE_LOOKUPS.labels(_result)
for _reason in (
    "invalid",
    "unknown",
    "stale",
    "too_long",
    "store_unavailable",
    "model_error",
    "internal",
):
    UPSERT_FAILURES.labels(_reason)
