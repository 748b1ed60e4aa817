"""Protobuf messages <-> core types. No logic beyond field mapping."""

from __future__ import annotations

from collections.abc import Iterable

from memsvc.domain.records import QueueItem, ServerDescription
from memsvc.domain.types import (
    ChunkMetadata,
    ChunkRecord,
    Hit,
    MemoryEvent,
    RecordError,
    SearchFilters,
    SearchMode,
    SearchOrder,
    TimestampRange,
    Truncation,
    TurnRange,
)
from memsvc.observability.figures import Figures
from memsvc.v1 import memory_pb2 as pb

MODES = {
    pb.SEARCH_MODE_DENSE: SearchMode.DENSE,
    pb.SEARCH_MODE_KEYWORD: SearchMode.KEYWORD,
    pb.SEARCH_MODE_HYBRID: SearchMode.HYBRID,
}
MODES_PB = {v: k for k, v in MODES.items()}
ORDERS = {
    pb.SEARCH_ORDER_UNSPECIFIED: SearchOrder.RELEVANCE,
    pb.SEARCH_ORDER_RELEVANCE: SearchOrder.RELEVANCE,
    pb.SEARCH_ORDER_TIME: SearchOrder.TIME,
    pb.SEARCH_ORDER_NEWEST: SearchOrder.NEWEST,
}


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
        payload=e.payload,
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
        payload=e.payload,
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


def errors_to_pb(errors: Iterable[RecordError]) -> list[pb.RecordError]:
    return [pb.RecordError(chunk_id=e.chunk_id, message=e.message, reason=e.reason) for e in errors]


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
        last_timestamp=item.last_timestamp,
    )


def server_info_to_pb(server: ServerDescription) -> pb.ServerInfo:
    return pb.ServerInfo(
        version=server.version,
        model=server.model,
        model_fallback=server.model_fallback,
        dim=server.dim,
        embed_backend=server.embed_backend,
        log_backend=server.log_backend,
        model_notice=server.model_notice,
        store_shards=server.store_shards[1] if server.store_shards else 1,
        store_shards_loaded=server.store_shards[0] if server.store_shards else 1,
        model_move=None
        if (move := server.model_move) is None
        else pb.ModelMove(
            from_model=move.from_model,
            from_collection=move.from_collection,
            to_collection=move.to_collection,
            conversations=move.conversations,
            left=move.left,
            previous_model_serves=move.previous_model_serves,
        ),
    )


def hit_to_pb(h: Hit) -> pb.Hit:
    hit = pb.Hit(
        chunk_id=h.chunk_id,
        score=h.score,
        text=h.text,
        metadata=metadata_to_pb(h.metadata),
        turns=list(h.turns),
    )
    if h.explanation is not None:
        why = h.explanation
        hit.explanation.CopyFrom(
            pb.HitExplanation(
                dense_rank=why.dense_rank,
                dense_score=why.dense_score,
                keyword_rank=why.keyword_rank,
                keyword_score=why.keyword_score,
                fused_score=why.fused_score,
                matched_terms=list(why.matched_terms),
            )
        )
    return hit


def truncations_to_pb(items: Iterable[Truncation]) -> list[pb.Truncation]:
    return [
        pb.Truncation(
            event=t.event,
            field=t.field,
            original_chars=t.original_chars,
            kept_chars=t.kept_chars,
        )
        for t in items
    ]


def figures_to_pb(f: Figures) -> pb.ServerFigures:
    return pb.ServerFigures(
        uptime_s=f.uptime_s,
        chunks_written=f.chunks_written,
        searches=f.searches,
        search_latency_bounds_s=list(f.search_latency_bounds_s),
        search_latency_counts=list(f.search_latency_counts),
        index_lag_count=f.index_lag_count,
        index_lag_sum_s=f.index_lag_sum_s,
    )
