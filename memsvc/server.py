"""gRPC transport: protobuf <-> core types, domain errors <-> status codes, one log line per RPC."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from memsvc import metrics, validation
from memsvc.admission import Gate
from memsvc.app import Services, build_services
from memsvc.auth import AuthInterceptor, TokenFileError, TokenTable, is_loopback
from memsvc.config import Settings
from memsvc.errors import (
    Cancelled,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Starting,
    Unavailable,
)
from memsvc.eventlog import QueueItem
from memsvc.status import rich_status, status_of
from memsvc.types import (
    ChunkMetadata,
    ChunkRecord,
    MemoryEvent,
    SearchFilters,
    SearchMode,
    SearchRequest,
    TimestampRange,
    TurnRange,
)
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["MemoryService"].full_name
# grpcio-reflection serves v1alpha only; v1 (what current grpcurl, Postman and the other
# languages' tools ask first) is the same protocol under another name, served alongside.
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
# WaitForIndexed replies this long before the caller's deadline, so the reply reaches it.
WAIT_REPLY_MARGIN_S = 0.2

_MODES = {
    pb.SEARCH_MODE_DENSE: SearchMode.DENSE,
    pb.SEARCH_MODE_KEYWORD: SearchMode.KEYWORD,
    pb.SEARCH_MODE_HYBRID: SearchMode.HYBRID,
}
_MODES_PB = {v: k for k, v in _MODES.items()}


# -- protobuf <-> core ----------------------------------------------------------------------
def event_from_pb(e: pb.MemoryEvent) -> MemoryEvent:
    return MemoryEvent(
        conversation_id=e.conversation_id,
        turn_id=e.turn_id,
        speaker=e.speaker,
        text=e.text,
        timestamp=e.timestamp,
        participants=tuple(e.participants),
        speaker_name=e.speaker_name,
    )


def event_to_pb(e: MemoryEvent) -> pb.MemoryEvent:
    return pb.MemoryEvent(
        conversation_id=e.conversation_id,
        turn_id=e.turn_id,
        speaker=e.speaker,
        text=e.text,
        timestamp=e.timestamp,
        participants=list(e.participants),
        speaker_name=e.speaker_name,
    )


def metadata_to_pb(m: ChunkMetadata) -> pb.ChunkMetadata:
    return pb.ChunkMetadata(
        conversation_id=m.conversation_id,
        turn_range=pb.TurnRange(start=m.turn_range.start, end=m.turn_range.end),
        timestamp_range=pb.TimestampRange(start=m.timestamp_range.start, end=m.timestamp_range.end),
        participants=list(m.participants),
        speakers=list(m.speakers),
        intent_tag=m.intent_tag,
        chunk_version=m.chunk_version,
        deleted=m.deleted,
        part_index=m.part_index,
        part_count=m.part_count,
    )


def record_to_pb(r: ChunkRecord) -> pb.ChunkRecord:
    return pb.ChunkRecord(chunk_id=r.chunk_id, text=r.text, metadata=metadata_to_pb(r.metadata))


def record_from_pb(r: pb.ChunkRecord) -> ChunkRecord:
    m = r.metadata
    return ChunkRecord(
        chunk_id=r.chunk_id,
        text=r.text,
        metadata=ChunkMetadata(
            conversation_id=m.conversation_id,
            turn_range=TurnRange(m.turn_range.start, m.turn_range.end),
            timestamp_range=TimestampRange(m.timestamp_range.start, m.timestamp_range.end),
            participants=tuple(m.participants),
            speakers=tuple(m.speakers),
            intent_tag=m.intent_tag,
            chunk_version=m.chunk_version,
            deleted=m.deleted,
            part_index=m.part_index,
            part_count=m.part_count or 1,
        ),
    )


def filters_from_pb(f: pb.SearchFilters) -> SearchFilters:
    tr = f.timestamp_range
    return SearchFilters(
        conversation_ids=tuple(f.conversation_ids),
        participants=tuple(f.participants),
        speakers=tuple(f.speakers),
        timestamp_range=TimestampRange(tr.start, tr.end) if f.HasField("timestamp_range") else None,
        intent_tag=f.intent_tag,
        include_deleted=f.include_deleted,
        chunk_version=f.chunk_version,
    )


def _errors_pb(errors: Any) -> list[pb.RecordError]:
    return [pb.RecordError(chunk_id=e.chunk_id, message=e.message, reason=e.reason) for e in errors]


# -- status mapping and the per-RPC log line ------------------------------------------------
F = TypeVar("F", bound=Callable[..., Any])

_STATUS: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Cancelled, grpc.StatusCode.CANCELLED),
]


def rpc(summary: Callable[[Any], dict[str, Any]]) -> Callable[[F], F]:
    """Maps domain errors to status codes and logs method, code, duration and counts
    (never conversation text)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(self: MemoryServicer, request: Any, context: grpc.ServicerContext) -> Any:
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            counts: dict[str, Any] = {}
            self.in_flight.enter()
            try:
                response = fn(self, request, context)
                counts = summary(response)
                return response
            except Exception as exc:
                code, message = grpc.StatusCode.INTERNAL, "internal error; see the server log"
                for kind, status in _STATUS:
                    if isinstance(exc, kind):
                        code, message = status, str(exc)
                        break
                if code is grpc.StatusCode.INTERNAL:
                    log.exception("rpc_internal_error", method=fn.__name__)
                context.abort_with_status(status_of(code, message, exc))
            finally:
                self.in_flight.leave()
                elapsed = time.perf_counter() - start
                metrics.RPC_DURATION.labels(fn.__name__, code.name).observe(elapsed)
                log.info(
                    "rpc",
                    method=fn.__name__,
                    code=code.name,
                    duration_ms=round(elapsed * 1000, 2),
                    **counts,
                )

        return wrapper  # type: ignore[return-value]

    return decorate


class InFlight:
    """Counts RPC handlers running, so shutdown closes the store only after the last one
    (gRPC's stop(grace) cancels calls at the deadline but cannot stop their threads)."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = threading.Condition()

    def enter(self) -> None:
        with self._idle:
            self._count += 1

    def leave(self) -> None:
        with self._idle:
            self._count -= 1
            if self._count == 0:
                self._idle.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._count == 0, timeout_s)


class MemoryServicer(pb_grpc.MemoryServiceServicer):
    """Thin: converts, calls the core, converts back."""

    def __init__(self, max_waiting_calls: int = 4, max_heavy_calls: int = 4) -> None:
        self._services: Services | None = None
        self.in_flight = InFlight()
        self.waiting = Gate("WaitForIndexed", max_waiting_calls)
        self.heavy = Gate("heavy (Build/Upsert/EmbedBatch/Delete/Purge)", max_heavy_calls)

    def attach(self, services: Services) -> None:
        self._services = services

    @property
    def core(self) -> Services:
        if self._services is None:
            raise Starting("starting up: model and store are loading")
        return self._services

    @rpc(lambda r: {"chunks": len(r.chunks), "superseded": len(r.superseded_chunk_ids)})
    def BuildIncrementalChunks(
        self, request: pb.BuildIncrementalChunksRequest, context: grpc.ServicerContext
    ) -> pb.BuildIncrementalChunksResponse:
        with self.heavy.enter():
            result = self.core.ingest.build(
                [event_from_pb(e) for e in request.events],
                chunk_version=request.chunk_version,
                allow_gaps=request.allow_gaps,
                conversation_id=request.conversation_id,
            )
        response = pb.BuildIncrementalChunksResponse(
            conversation_id=result.conversation_id,
            chunks=[record_to_pb(c) for c in result.chunks],
            superseded_chunk_ids=result.superseded_chunk_ids,
        )
        if result.turn_range is not None:
            response.turn_range.start = result.turn_range.start
            response.turn_range.end = result.turn_range.end
        return response

    @rpc(
        lambda r: {
            "upserted": r.upserted,
            "updated": r.updated,
            "unchanged": r.unchanged,
            "retired": r.retired,
            "errors": len(r.errors),
        }
    )
    def UpsertVectorRecords(
        self, request: pb.UpsertVectorRecordsRequest, context: grpc.ServicerContext
    ) -> pb.UpsertVectorRecordsResponse:
        with self.heavy.enter():
            result = self.core.ingest.upsert([record_from_pb(r) for r in request.records])
        return pb.UpsertVectorRecordsResponse(
            upserted=result.upserted,
            updated=result.updated,
            unchanged=result.unchanged,
            retired=result.retired,
            errors=_errors_pb(result.errors),
        )

    @rpc(lambda r: {"deleted": r.deleted, "events_deleted": r.events_deleted})
    def LogicalDeleteBySource(
        self, request: pb.LogicalDeleteBySourceRequest, context: grpc.ServicerContext
    ) -> pb.LogicalDeleteBySourceResponse:
        span = (
            TurnRange(request.turn_range.start, request.turn_range.end)
            if request.HasField("turn_range")
            else None
        )
        with self.heavy.enter():
            result = self.core.ingest.delete(request.conversation_id, span, list(request.chunk_ids))
        return pb.LogicalDeleteBySourceResponse(
            deleted=result.deleted,
            events_deleted=result.events_deleted,
            errors=_errors_pb(result.errors),
        )

    @rpc(lambda r: {"dim": r.dim})
    def EmbedChunk(
        self, request: pb.EmbedChunkRequest, context: grpc.ServicerContext
    ) -> pb.EmbedChunkResponse:
        core = self.core
        vector = core.search.embed_query(request.query)
        return pb.EmbedChunkResponse(
            vector=vector.tolist(), model=core.embedder.name, dim=core.embedder.dim
        )

    @rpc(lambda r: {"vectors": len(r.vectors)})
    def EmbedBatch(
        self, request: pb.EmbedBatchRequest, context: grpc.ServicerContext
    ) -> pb.EmbedBatchResponse:
        core = self.core
        with self.heavy.enter():
            matrix = core.search.embed_batch(
                list(request.texts), request.is_query, context.is_active
            )
        return pb.EmbedBatchResponse(
            vectors=[pb.Vector(values=row.tolist()) for row in matrix],
            model=core.embedder.name,
            dim=core.embedder.dim,
        )

    @rpc(lambda r: {"hits": len(r.hits), "top_k": r.top_k})
    def EmbedDb(
        self, request: pb.EmbedDbRequest, context: grpc.ServicerContext
    ) -> pb.EmbedDbResponse:
        if request.mode not in (pb.SEARCH_MODE_UNSPECIFIED, *_MODES):
            raise InvalidArgument("mode", f"unknown search mode {request.mode}")
        mode, top_k, hits = self.core.search.search(
            SearchRequest(
                query_text=request.query_text,
                top_k=request.top_k,
                filters=filters_from_pb(request.filters),
                mode=_MODES.get(request.mode),
                mmr_lambda=request.mmr_lambda,
            )
        )
        return pb.EmbedDbResponse(
            query_text=request.query_text,
            top_k=top_k,
            mode=_MODES_PB[mode],
            hits=[
                pb.Hit(
                    chunk_id=h.chunk_id,
                    score=h.score,
                    text=h.text,
                    metadata=metadata_to_pb(h.metadata),
                )
                for h in hits
            ],
        )

    @rpc(lambda r: {"chunks": len(r.chunks)})
    def ListChunks(
        self, request: pb.ListChunksRequest, context: grpc.ServicerContext
    ) -> pb.ListChunksResponse:
        page = self.core.ingest.list_chunks(
            request.conversation_id,
            request.include_deleted,
            request.page_size,
            request.page_token,
            request.chunk_version,
        )
        return pb.ListChunksResponse(
            chunks=[record_to_pb(c) for c in page.chunks], next_page_token=page.next_page_token
        )

    @rpc(lambda r: {"retired": r.retired})
    def RetireChunkVersion(
        self, request: pb.RetireChunkVersionRequest, context: grpc.ServicerContext
    ) -> pb.RetireChunkVersionResponse:
        retired = self.core.ingest.retire_version(request.conversation_id, request.chunk_version)
        return pb.RetireChunkVersionResponse(retired=retired)

    @rpc(lambda r: {"chunks_purged": r.chunks_purged, "events_purged": r.events_purged})
    def PurgeDeleted(
        self, request: pb.PurgeDeletedRequest, context: grpc.ServicerContext
    ) -> pb.PurgeDeletedResponse:
        if not request.conversation_id and not request.all_conversations:
            raise InvalidArgument(
                "conversation_id",
                "name a conversation, or set all_conversations to purge every conversation",
            )
        if request.conversation_id and request.all_conversations:
            raise InvalidArgument("all_conversations", "set it or conversation_id, not both")
        with self.heavy.enter():
            chunks, events = self.core.ingest.purge_deleted(request.conversation_id)
        return pb.PurgeDeletedResponse(chunks_purged=chunks, events_purged=events)

    # -- asynchronous ingestion -------------------------------------------------------------
    @rpc(lambda r: {"accepted": r.accepted, "duplicates": r.duplicates, "errors": len(r.errors)})
    def AppendEvents(
        self, request: pb.AppendEventsRequest, context: grpc.ServicerContext
    ) -> pb.AppendEventsResponse:
        core = self.core
        result = core.ingest.append([event_from_pb(e) for e in request.events], request.allow_gaps)
        if result.accepted:
            core.worker.notify()
        return pb.AppendEventsResponse(
            accepted=result.accepted,
            duplicates=result.duplicates,
            errors=_errors_pb(result.errors),
        )

    @rpc(lambda r: {"conversations": len(r.conversations), "backlog": r.total_backlog})
    def GetIndexStatus(
        self, request: pb.GetIndexStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetIndexStatusResponse:
        worker = self.core.worker
        items = worker.queue.status(list(request.conversation_ids))
        totals = worker.totals(None if request.conversation_ids else items)
        return pb.GetIndexStatusResponse(
            conversations=[index_status_to_pb(i) for i in items],
            total_conversations=totals.conversations,
            total_backlog=totals.backlog,
            pending=totals.pending,
            indexing=totals.indexing,
            failed=totals.failed,
            paused=totals.paused,
        )

    @rpc(lambda r: {"indexed": r.indexed})
    def WaitForIndexed(
        self, request: pb.WaitForIndexedRequest, context: grpc.ServicerContext
    ) -> pb.WaitForIndexedResponse:
        conv = validation.conversation_id(request.conversation_id, "conversation_id")
        if not 0 <= request.timeout_ms <= 300_000:
            raise InvalidArgument("timeout_ms", "must be 0 (= 10000) to 300000")
        timeout_s = (request.timeout_ms or 10_000) / 1000
        remaining = context.time_remaining()
        if remaining is not None:
            # Answer (indexed=false) just before the client's own deadline, not after it.
            timeout_s = max(0.0, min(timeout_s, remaining - WAIT_REPLY_MARGIN_S))
        with self.waiting.enter():
            item = self.core.worker.wait_for_indexed(
                conv, request.turn_id, timeout_s, context.is_active
            )
        if item is None:
            raise NotFound(f"conversation {conv!r} has no appended events")
        return pb.WaitForIndexedResponse(
            indexed=item.indexed_through(request.turn_id), status=index_status_to_pb(item)
        )

    @rpc(lambda r: {"paused": r.paused})
    def SetIndexingPaused(
        self, request: pb.SetIndexingPausedRequest, context: grpc.ServicerContext
    ) -> pb.SetIndexingPausedResponse:
        worker = self.core.worker
        worker.set_paused(request.paused)
        return pb.SetIndexingPausedResponse(paused=worker.paused)

    @rpc(lambda r: {"queued": r.queued})
    def Reindex(
        self, request: pb.ReindexRequest, context: grpc.ServicerContext
    ) -> pb.ReindexResponse:
        core = self.core
        if not request.all and not request.conversation_ids:
            raise InvalidArgument("conversation_ids", "name conversations or set all")
        if request.chunk_version < 0:
            raise InvalidArgument("chunk_version", "must be >= 0 (0 = server default)")
        version = request.chunk_version or core.settings.chunk_version
        ids = [] if request.all else list(request.conversation_ids)
        for i, conv in enumerate(ids):
            validation.conversation_id(conv, f"conversation_ids[{i}]")
        if request.cancel:
            return pb.ReindexResponse(queued=core.worker.cancel_reindex(ids))
        return pb.ReindexResponse(queued=core.worker.reindex(ids, version))


def _enable_reflection(server: grpc.Server) -> None:
    """Server reflection under v1alpha and v1 (identical messages, different service)."""
    from grpc_reflection.v1alpha import reflection_pb2 as rpb
    from grpc_reflection.v1alpha import reflection_pb2_grpc

    names = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME, REFLECTION_V1)
    servicer = reflection.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(
        REFLECTION_V1,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=rpb.ServerReflectionRequest.FromString,
                response_serializer=rpb.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1,))


def index_status_to_pb(item: QueueItem) -> pb.IndexStatus:
    return pb.IndexStatus(
        conversation_id=item.conversation_id,
        last_appended_turn=item.last_appended_turn,
        last_indexed_turn=item.last_indexed_turn,
        backlog=item.dirty,
        state=item.state,
        last_error=item.last_error,
        attempts=item.attempts,
        chunk_version=item.chunk_version,
        reindexing=item.reindex,
    )


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    servicer: MemoryServicer
    health: health.HealthServicer

    def mark_ready(self, services: Services) -> None:
        self.servicer.attach(services)
        self.set_serving(services.store.up)
        # NOT_SERVING while the vector store is down, SERVING again once it is back.
        services.store_watch.on_change(self.set_serving)

    def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            self.health.set(name, status)

    def stop(self, grace: float = 5.0) -> None:
        """Health NOT_SERVING at once, new calls refused, calls in flight get `grace`
        seconds; returns when their handlers have finished (or `grace` + 10 s)."""
        self.set_serving(False)
        self.server.stop(grace).wait()
        if not self.servicer.in_flight.wait_idle(10.0):
            log.warning("shutdown_handlers_still_running")


class _Undecodable:
    def __init__(self, error: Exception) -> None:
        self.error = error


class DecodeGuard(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """A request that does not decode (invalid UTF-8 in a string field, a malformed
    message) is the caller's error, INVALID_ARGUMENT, not gRPC's default INTERNAL."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler: Any = continuation(details)  # a namedtuple at run time (_replace)
        if handler is None or not handler.unary_unary or handler.request_deserializer is None:
            return handler  # type: ignore[no-any-return]
        decode = handler.request_deserializer
        behavior = handler.unary_unary

        def safe_decode(data: bytes) -> Any:
            try:
                return decode(data)
            except Exception as exc:
                return _Undecodable(exc)

        def checked(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, _Undecodable):
                description = (
                    "does not decode as the method's message (invalid UTF-8 in a string"
                    f" field, or a malformed message): {request.error}"[:500]
                )
                context.abort_with_status(
                    rich_status(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"request: {description}",
                        violations=[("request", description)],
                    )
                )
            return behavior(request, context)

        replaced: Handler = handler._replace(request_deserializer=safe_decode, unary_unary=checked)
        return replaced


def start_server(
    listen: str,
    workers: int = 16,
    max_waiting_calls: int = 4,
    max_heavy_calls: int = 4,
    tokens: TokenTable | None = None,
    credentials: grpc.ServerCredentials | None = None,
    reflection_on: bool | None = None,
) -> RunningServer:
    """Listen now (health NOT_SERVING, RPCs UNAVAILABLE) so probes work during model load.
    With `tokens`, MemoryService calls need a bearer token (health stays open) and
    reflection is off unless `reflection_on`."""
    interceptors: list[Any] = [DecodeGuard()]
    if tokens is not None:
        # the auth check runs on the decoded request, inside the decode guard
        interceptors.append(AuthInterceptor(tokens))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc"),
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ],
    )
    servicer = MemoryServicer(max_waiting_calls, max_heavy_calls)
    pb_grpc.add_MemoryServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if reflection_on if reflection_on is not None else tokens is None:
        _enable_reflection(server)
    if credentials is not None:
        port = server.add_secure_port(listen, credentials)
    else:
        port = server.add_insecure_port(listen)
    if port == 0:
        raise RuntimeError(f"cannot listen on {listen}")
    server.start()
    return RunningServer(server, port, servicer, health_servicer)


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    ca = settings.tls_client_ca_file
    return grpc.ssl_server_credentials(
        [(settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes())],
        root_certificates=ca.read_bytes() if ca is not None else None,
        require_client_auth=ca is not None,
    )


def check_exposure(settings: Settings) -> None:
    """Refuse to serve beyond loopback with nobody authenticated, unless told to."""
    if is_loopback(settings.listen) or settings.auth_tokens_file or settings.allow_insecure:
        return
    raise SystemExit(
        f"memsvc: refusing to listen on {settings.listen} without authentication: anyone who"
        " can reach it could read and erase every conversation. Set MEMSVC_AUTH_TOKENS_FILE"
        " (--auth-tokens-file) to a file of 'ROLE TOKEN' lines (and TLS with"
        " MEMSVC_TLS_CERT_FILE / MEMSVC_TLS_KEY_FILE), listen on 127.0.0.1, or set"
        " MEMSVC_ALLOW_INSECURE=true (--allow-insecure) if a network policy protects it."
    )


def serve(settings: Settings) -> None:
    """`memsvc serve`: listen, load model and store, serve until SIGINT/SIGTERM."""
    check_exposure(settings)
    # Everything the service writes (event log, cache, Milvus Lite files) is private.
    os.umask(0o077)
    try:
        tokens = TokenTable(settings.auth_tokens_file) if settings.auth_tokens_file else None
    except TokenFileError as exc:
        raise SystemExit(f"memsvc: auth tokens file: {exc}") from None
    running = start_server(
        settings.listen,
        settings.grpc_workers,
        settings.max_waiting_calls,
        settings.max_heavy_calls,
        tokens=tokens,
        credentials=server_credentials(settings),
        reflection_on=settings.reflection,
    )
    host = settings.listen.rpartition(":")[0]
    log.info(
        "listening",
        address=f"{host}:{running.port}",
        health="NOT_SERVING until ready",
        auth=tokens is not None,
        tls=settings.tls_cert_file is not None,
        mtls=settings.tls_client_ca_file is not None,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if tokens is not None:
        # token rotation without a restart
        signal.signal(signal.SIGHUP, lambda *_: tokens.reload())
    try:
        services = build_services(settings)
    except Exception:
        running.stop(0)
        raise
    running.mark_ready(services)
    metrics.SERVICE_GAUGES.services = services
    if settings.metrics_listen:
        metrics_port = metrics.serve_metrics(settings.metrics_listen)
        log.info("metrics", address=f"{settings.metrics_listen.rpartition(':')[0]}:{metrics_port}")
    log.info("serving", address=f"{host}:{running.port}", model=services.embedder.name)
    # A signal may be delivered to any thread (ONNX Runtime's and torch's pools do not block
    # them), and Python runs its handlers in the main thread only between bytecodes: a single
    # blocking wait here could sleep through SIGHUP or SIGTERM. Wait in short steps.
    while not stop.wait(0.2):
        pass
    log.info("shutting_down", grace_s=settings.shutdown_grace_s)
    running.stop(settings.shutdown_grace_s)
    services.close()
    log.info("stopped")
