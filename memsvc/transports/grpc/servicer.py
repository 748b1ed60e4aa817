"""MemoryService handlers: convert the request, call the core, convert the answer. What
every call goes through around its handler (span, log line, metric, status codes) is
memsvc.transports.grpc.calls."""

from __future__ import annotations

from contextlib import nullcontext

import grpc
import structlog

from memsvc.app import Services
from memsvc.domain.errors import Busy, InvalidArgument, Starting
from memsvc.domain.types import SearchMode, SearchRequest, TurnRange
from memsvc.observability import startup, tracing
from memsvc.observability.figures import figures
from memsvc.transports.grpc.admission import Gate
from memsvc.transports.grpc.auth import current_access
from memsvc.transports.grpc.calls import InFlight, rpc
from memsvc.transports.grpc.convert import (
    MODES,
    MODES_PB,
    ORDERS,
    errors_to_pb,
    event_from_pb,
    event_to_pb,
    figures_to_pb,
    filters_from_pb,
    hit_to_pb,
    index_status_to_pb,
    record_from_pb,
    record_to_pb,
    server_info_to_pb,
    truncations_to_pb,
)
from memsvc.v1 import memory_pb2 as pb
from memsvc.v1 import memory_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)


class MemoryServicer(pb_grpc.MemoryServiceServicer):
    """Thin: converts, calls the core, converts back."""

    def __init__(
        self,
        max_waiting_calls: int = 4,
        max_heavy_calls: int = 4,
        max_embedding_calls: int = 16,
        authenticated: bool = False,
        max_write_calls: int = 8,
    ) -> None:
        self._services: Services | None = None
        self.authenticated = authenticated
        self.in_flight = InFlight()
        self.waiting = Gate("WaitForIndexed", max_waiting_calls)
        self.heavy = Gate("heavy (Build/Upsert/EmbedBatch/Delete/Purge)", max_heavy_calls)
        # a bulkhead: calls waiting on the embedder cannot take every thread
        self.embedding = Gate("embedding (dense/hybrid EmbedDb, EmbedChunk)", max_embedding_calls)
        # appends are short; more than this at once means the log is slow: refused before
        # any work, with a short pushback that gRPC's retry policy honours
        self.writes = Gate("AppendEvents", max_write_calls, retry_after_s=0.25, refusal=Busy)

    def attach(self, services: Services) -> None:
        self._services = services

    @property
    def core(self) -> Services:
        if self._services is None:
            raise Starting(f"starting up: {startup.said()}")
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
                access=current_access(),
                restore=request.restore,
            )
        response = pb.BuildIncrementalChunksResponse(
            conversation_id=result.conversation_id,
            chunks=[record_to_pb(c) for c in result.chunks],
            superseded_chunk_ids=result.superseded_chunk_ids,
            truncated=truncations_to_pb(result.truncated),
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
            result = self.core.ingest.upsert(
                [record_from_pb(r) for r in request.records], current_access()
            )
        return pb.UpsertVectorRecordsResponse(
            upserted=result.upserted,
            updated=result.updated,
            unchanged=result.unchanged,
            retired=result.retired,
            errors=errors_to_pb(result.errors),
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
        # a deferred delete is a log write, as light as an append
        with nullcontext() if request.defer_store else self.heavy.enter():
            result = self.core.deletion.delete(
                request.conversation_id,
                span,
                list(request.chunk_ids),
                current_access(),
                defer_store=request.defer_store,
            )
        return pb.LogicalDeleteBySourceResponse(
            deleted=result.deleted,
            events_deleted=result.events_deleted,
            errors=errors_to_pb(result.errors),
        )

    @rpc(lambda r: {"events": len(r.events)})
    def PopEvents(
        self, request: pb.PopEventsRequest, context: grpc.ServicerContext
    ) -> pb.PopEventsResponse:
        # a log write, as light as an append
        popped = self.core.deletion.pop(
            request.conversation_id,
            request.count,
            current_access(),
            max_reply_bytes=request.max_reply_bytes,
            idempotency_key=request.idempotency_key,
        )
        return pb.PopEventsResponse(events=[event_to_pb(e) for e in popped])

    @rpc(lambda r: {"dim": r.dim})
    def EmbedChunk(
        self, request: pb.EmbedChunkRequest, context: grpc.ServicerContext
    ) -> pb.EmbedChunkResponse:
        core = self.core
        with self.embedding.enter():
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
        if request.mode not in (pb.SEARCH_MODE_UNSPECIFIED, *MODES):
            raise InvalidArgument("mode", f"unknown search mode {request.mode}")
        if request.order not in ORDERS:
            raise InvalidArgument("order", f"unknown search order {request.order}")
        mode = MODES.get(request.mode) or self.core.search.tuning.default_mode
        scope = request.filters.conversation_ids
        tracing.annotate(
            mode=mode.value,
            conversations=len(scope),
            conversation=tracing.conversation(scope[0]) if len(scope) == 1 else None,
            turn_budget=request.turn_budget or None,
            model=self.core.embedder.name if mode is not SearchMode.KEYWORD else None,
        )
        gate = self.embedding.enter() if mode is not SearchMode.KEYWORD else nullcontext()
        with gate:
            return self._search(request)

    def _search(self, request: pb.EmbedDbRequest) -> pb.EmbedDbResponse:
        found = self.core.search.search(
            SearchRequest(
                query_text=request.query_text,
                top_k=request.top_k,
                filters=filters_from_pb(request.filters),
                mode=MODES.get(request.mode),
                mmr_lambda=request.mmr_lambda,
                turn_budget=request.turn_budget,
                standing=not request.exclude_standing,
                order=ORDERS[request.order],
                explain=request.explain,
                keep_query_end=request.keep_query_end,
            ),
            current_access(),
        )
        return pb.EmbedDbResponse(
            query_text=found.query_text,
            query_cut=found.query_cut,
            unrelated_similarity=found.unrelated,
            top_k=found.top_k,
            mode=MODES_PB[found.mode],
            hits=[hit_to_pb(h) for h in found.hits],
            standing=[hit_to_pb(h) for h in found.standing],
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
            current_access(),
        )
        return pb.ListChunksResponse(
            chunks=[record_to_pb(c) for c in page.chunks], next_page_token=page.next_page_token
        )

    @rpc(lambda r: {"events": len(r.events)})
    def ExportEvents(
        self, request: pb.ExportEventsRequest, context: grpc.ServicerContext
    ) -> pb.ExportEventsResponse:
        events, token = self.core.ingest.export_events(
            request.conversation_id,
            request.page_size,
            request.page_token,
            current_access(),
            last=request.last,
            turns=(
                TurnRange(request.turn_range.start, request.turn_range.end)
                if request.HasField("turn_range")
                else None
            ),
        )
        return pb.ExportEventsResponse(
            events=[event_to_pb(e) for e in events], next_page_token=token
        )

    @rpc(lambda r: {"retired": r.retired})
    def RetireChunkVersion(
        self, request: pb.RetireChunkVersionRequest, context: grpc.ServicerContext
    ) -> pb.RetireChunkVersionResponse:
        retired = self.core.deletion.retire_version(request.conversation_id, request.chunk_version)
        return pb.RetireChunkVersionResponse(retired=retired)

    @rpc(lambda r: {"chunks_purged": r.chunks_purged, "events_purged": r.events_purged})
    def PurgeDeleted(
        self, request: pb.PurgeDeletedRequest, context: grpc.ServicerContext
    ) -> pb.PurgeDeletedResponse:
        with self.heavy.enter():
            chunks, events = self.core.deletion.purge_deleted(
                request.conversation_id, request.all_conversations, current_access()
            )
        return pb.PurgeDeletedResponse(chunks_purged=chunks, events_purged=events)

    # -- asynchronous ingestion -------------------------------------------------------------
    @rpc(lambda r: {"accepted": r.accepted, "duplicates": r.duplicates, "errors": len(r.errors)})
    def AppendEvents(
        self, request: pb.AppendEventsRequest, context: grpc.ServicerContext
    ) -> pb.AppendEventsResponse:
        core = self.core
        conversations = {e.conversation_id for e in request.events}
        tracing.annotate(
            events=len(request.events),
            conversation=tracing.conversation(next(iter(conversations)))
            if len(conversations) == 1
            else None,
        )
        with self.writes.enter():
            result = core.ingest.append(
                [event_from_pb(e) for e in request.events],
                request.allow_gaps,
                current_access(),
                restore=request.restore,
                assign_turn_ids=request.assign_turn_ids,
                idempotency_key=request.idempotency_key,
                expected_last_turn=dict(request.expected_last_turn),
            )
        if result.accepted:
            core.worker.notify()
        return pb.AppendEventsResponse(
            accepted=result.accepted,
            duplicates=result.duplicates,
            errors=errors_to_pb(result.errors),
            truncated=truncations_to_pb(result.truncated),
            turn_ids=result.turn_ids,
        )

    @rpc(lambda r: {"conversations": len(r.conversations), "backlog": r.total_backlog})
    def GetIndexStatus(
        self, request: pb.GetIndexStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetIndexStatusResponse:
        control = self.core.control
        access = current_access()
        token = ""
        if request.conversation_ids:
            items = control.status(list(request.conversation_ids), access)
        else:
            items, token = control.status_page(
                request.page_size,
                request.page_token,
                list(request.states),
                request.conversation_prefix,
                access,
            )
        # totals over what the token may see: every conversation, or those of its prefixes
        totals = control.totals(access)
        return pb.GetIndexStatusResponse(
            next_page_token=token,
            conversations=[index_status_to_pb(i) for i in items],
            total_conversations=totals.conversations,
            total_backlog=totals.backlog,
            pending=totals.pending,
            indexing=totals.indexing,
            failed=totals.failed,
            paused=totals.paused,
            server=server_info_to_pb(self.core.describe()),
            caller=pb.Caller(
                role=access.role.name.lower(),
                conversation_prefixes=list(access.prefixes),
                authenticated=self.authenticated,
            ),
            figures=figures_to_pb(figures()),
            health=pb.ServerHealth(
                store_up=self.core.store.up,
                embedder_up=self.core.embedder_watch.up,
                log_up=self.core.health.log_up,
                disk_full=self.core.health.disk_full,
            ),
        )

    @rpc(lambda r: {"indexed": r.indexed})
    def WaitForIndexed(
        self, request: pb.WaitForIndexedRequest, context: grpc.ServicerContext
    ) -> pb.WaitForIndexedResponse:
        with self.waiting.enter():
            indexed, item = self.core.control.wait(
                request.conversation_id,
                request.turn_id,
                request.timeout_ms,
                context.time_remaining(),
                context.is_active,
                current_access(),
            )
        return pb.WaitForIndexedResponse(indexed=indexed, status=index_status_to_pb(item))

    @rpc(lambda r: {"paused": r.paused})
    def SetIndexingPaused(
        self, request: pb.SetIndexingPausedRequest, context: grpc.ServicerContext
    ) -> pb.SetIndexingPausedResponse:
        control = self.core.control
        control.set_paused(request.paused, current_access())
        return pb.SetIndexingPausedResponse(paused=control.paused)

    @rpc(lambda r: {"queued": r.queued})
    def Reindex(
        self, request: pb.ReindexRequest, context: grpc.ServicerContext
    ) -> pb.ReindexResponse:
        queued = self.core.control.request_reindex(
            list(request.conversation_ids),
            request.all,
            request.chunk_version,
            request.cancel,
            current_access(),
        )
        return pb.ReindexResponse(queued=queued)
