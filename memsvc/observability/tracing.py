"""OpenTelemetry traces: off unless the standard OTEL_* variables ask for them; then one
server span per call, continuing the caller's W3C `traceparent`, with a child span per stage
(the stages memsvc_stage_duration_seconds times) and one span per index step.

On when OTEL_TRACES_EXPORTER names an exporter (`otlp`, `console`) or an OTLP endpoint is
set (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), unless
OTEL_SDK_DISABLED=true. The SDK reads the rest itself: OTEL_SERVICE_NAME and
OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER (and _ARG), OTEL_EXPORTER_OTLP_PROTOCOL,
_HEADERS, _TIMEOUT, OTEL_BSP_* and OTEL_PROPAGATORS. It needs the `otel` extra
(`pip install 'memsvc[otel]'`): asking for traces without it stops the start, saying so.

Attributes never hold text: method, status, counts, mode, top_k, the model, and the
conversation id, or only its tenant prefix (MEMSVC_TRACE_CONVERSATIONS=tenant), or nothing.
Off, every helper here returns after one test of a module global."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

# While tracing is on: the opentelemetry Tracer spans come from, and its provider.
_tracer: Any = None
_provider: Any = None
# How a conversation id appears in an attribute: id | tenant | none.
_conversations = "id"
# The attributes of each stage's span, after describe(): which database it talks to
# (OpenTelemetry's database conventions), or which model and runtime.
_stage_attributes: dict[str, dict[str, str]] = {}

# What each timed stage (metrics.stage) talks to: the event log, the vector store (with the
# store's operation), or the embedding model. The rest (fuse) is memsvc's own work.
STAGE_TARGETS: dict[str, tuple[str, str]] = {
    "search standing": ("log", ""),
    "search plan": ("log", ""),
    "search verify": ("log", ""),
    "write check": ("log", ""),
    "write bookkeep": ("log", ""),
    "write settle": ("log", ""),
    "search read": ("store", "query"),
    "search dense": ("store", "search"),
    "search keyword": ("store", "search"),
    "write read": ("store", "query"),
    "write store": ("store", "upsert"),
    "search embed": ("model", ""),
    "write embed": ("model", ""),
    "write tokens": ("model", ""),
    "search fuse": ("", ""),
}

_EXPORTERS = ("otlp", "console", "none")
# gRPC codes a server span reports as an error (OpenTelemetry's RPC conventions): the rest
# are the caller's (INVALID_ARGUMENT, NOT_FOUND, ...).
SERVER_ERRORS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return any(e.strip() not in ("", "none") for e in exporters.split(","))
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure(conversations: str = "id", environ: Mapping[str, str] = os.environ) -> bool:
    """Start tracing if the environment asks for it (see the module's docstring); returns
    whether it is on. A SystemExit names what is missing or unknown."""
    global _conversations
    _conversations = conversations
    if not wanted(environ):
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise SystemExit(
            "memsvc: OTEL_* asks for traces but OpenTelemetry's SDK is not installed:"
            " pip install 'memsvc[otel]' (or unset OTEL_TRACES_EXPORTER and the OTLP endpoint)"
        ) from None
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "memsvc"}))
    provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER
    for exporter in _exporters(environ):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    start(provider, conversations)
    # this process's own tracer provider: libraries tracing through the global one (the
    # MCP SDK's span of each tool call) export with memsvc's spans
    from opentelemetry import trace

    trace.set_tracer_provider(provider)
    return True


def _exporters(environ: Mapping[str, str]) -> list[Any]:
    names = [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",")]
    exporters: list[Any] = []
    for name in (n for n in names if n and n != "none"):
        if name not in _EXPORTERS:
            raise SystemExit(
                f"memsvc: OTEL_TRACES_EXPORTER={name!r} is not one memsvc knows:"
                " otlp, console or none"
            )
        if name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
            continue
        protocol = (
            environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        ).strip()
        if protocol not in ("grpc", "http/protobuf"):
            raise SystemExit(
                f"memsvc: OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: memsvc exports grpc or"
                " http/protobuf"
            )
        try:
            exporters.append(_otlp_exporter(protocol))
        except ImportError:
            raise SystemExit(
                f"memsvc: the OTLP exporter ({protocol}) is not installed:"
                " pip install 'memsvc[otel]'"
            ) from None
    return exporters


def _otlp_exporter(protocol: str) -> Any:
    """OTLP over gRPC or HTTP; the exporter reads its endpoint, headers, timeout and
    certificates from the OTEL_EXPORTER_OTLP_* variables."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc import trace_exporter as over_grpc

        return over_grpc.OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http import trace_exporter as over_http

    return over_http.OTLPSpanExporter()


def start(provider: Any, conversations: str = "id") -> None:
    """Trace into `provider` (an SDK TracerProvider; an application embedding memsvc may
    pass its own)."""
    global _tracer, _provider, _conversations
    _provider, _conversations = provider, conversations
    _tracer = provider.get_tracer("memsvc")


def shutdown() -> None:
    """Export what is still buffered and stop tracing (at the end of a clean stop)."""
    global _tracer, _provider
    provider, _tracer, _provider = _provider, None, None
    if provider is not None:
        provider.shutdown()


def describe(log_system: str, collection: str, model: str, runtime: str) -> None:
    """What the stage spans name: the log's database (`sqlite` | `postgresql`), the
    store's collection (Milvus), and the model with its runtime (`onnx`, `torch`, `openai`)."""
    store = {"db.system.name": "milvus", "db.collection.name": collection}
    by_target = {
        "log": {"db.system.name": log_system},
        "store": store,
        "model": {"memsvc.model": model, "memsvc.runtime": runtime},
        "": {},
    }
    _stage_attributes.clear()
    for name, (target, operation) in STAGE_TARGETS.items():
        attributes = dict(by_target[target])
        if operation:
            attributes["db.operation.name"] = operation
        _stage_attributes[name] = attributes


def stage_attributes(name: str) -> dict[str, str]:
    """The attributes of the span of stage `name` (`search dense`), as describe() set them."""
    return _stage_attributes.get(name, {})


def on() -> bool:
    return _tracer is not None


@contextmanager
def server_span(
    method: str, carrier: Iterable[tuple[str, Any]], attributes: Mapping[str, Any]
) -> Iterator[Any]:
    """The span of one call, `memsvc.v1.MemoryService/Search`, child of the caller's
    `traceparent` in `carrier` (gRPC metadata, or HTTP headers the bridge forwarded)."""
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    headers = {k: v for k, v in carrier if isinstance(v, str)}
    service, _, name = method.lstrip("/").partition("/")
    with _tracer.start_as_current_span(
        method.lstrip("/"),
        context=propagate.extract(headers),
        kind=SpanKind.SERVER,
        attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
        | dict(attributes),
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def finish(span: Any, code: str, counts: Mapping[str, Any]) -> None:
    """A call's outcome on its span: the status code, and the counts its log line has."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("rpc.grpc.status_code", _GRPC_CODES.get(code, 2))
    for key, value in counts.items():
        if isinstance(value, bool | int | float):
            span.set_attribute(f"memsvc.{key}", value)
    if code in SERVER_ERRORS:
        span.set_status(Status(StatusCode.ERROR, code))


@contextmanager
def span(
    name: str, attributes: Mapping[str, Any] | None = None, links: Iterable[str] = ()
) -> Iterator[Any]:
    """An internal span under the current one (a stage, an index step), linked to the
    spans named by `links` (W3C traceparents); None when off."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(name, attributes=attributes, links=_links(links)) as current:
        yield current


def link(traceparents: Iterable[str]) -> None:
    """Links from the current span to the spans `traceparents` name (work found done by
    the step under way, beyond what it leased)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    current = trace.get_current_span()
    for found in _links(traceparents):
        current.add_link(found.context)


def traceparent() -> str:
    """The current span as a W3C traceparent, "" when tracing is off or no span is open:
    what durable work records of the call that queued it, so the step that does the work
    (on any replica, later) can link back to it."""
    if _tracer is None:
        return ""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent", "")


def _links(traceparents: Iterable[str]) -> list[Any]:
    from opentelemetry import trace
    from opentelemetry.trace import Link
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    propagator = TraceContextTextMapPropagator()
    links, seen = [], set()
    for value in traceparents:
        if value in seen:
            continue
        seen.add(value)
        # a value cut short where the log keeps only the newest few parses as no context
        context = trace.get_current_span(
            propagator.extract({"traceparent": value})
        ).get_span_context()
        if context.is_valid:
            links.append(Link(context))
    return links


def annotate(**attributes: Any) -> None:
    """Attributes on the current span, named memsvc.<key>; nothing when tracing is off."""
    if _tracer is None:
        return
    from opentelemetry import trace

    current = trace.get_current_span()
    for key, value in attributes.items():
        if value is not None:
            current.set_attribute(f"memsvc.{key}", value)


def conversation(conversation_id: str) -> str | None:
    """A conversation id as MEMSVC_TRACE_CONVERSATIONS allows it in an attribute."""
    if _conversations == "id":
        return conversation_id
    if _conversations == "tenant":
        prefix, slash, _ = conversation_id.partition("/")
        return prefix + slash if slash else ""
    return None


def exemplar(current: Any) -> dict[str, str] | None:
    """The trace id of `current` as a Prometheus exemplar, for a latency histogram."""
    context = current.get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return None
    return {"trace_id": format(context.trace_id, "032x")}


def outgoing(metadata: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`metadata` plus the current trace context, for a call memsvc makes to memsvc."""
    if _tracer is None:
        return metadata
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return metadata + sorted(carrier.items())


# grpc.StatusCode names -> numbers, without importing grpc into this layer
_GRPC_CODES = {
    name: number
    for number, name in enumerate(
        (
            "OK CANCELLED UNKNOWN INVALID_ARGUMENT DEADLINE_EXCEEDED NOT_FOUND ALREADY_EXISTS"
            " PERMISSION_DENIED RESOURCE_EXHAUSTED FAILED_PRECONDITION ABORTED OUT_OF_RANGE"
            " UNIMPLEMENTED INTERNAL UNAVAILABLE DATA_LOSS UNAUTHENTICATED"
        ).split()
    )
}
