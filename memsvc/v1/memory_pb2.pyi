from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SearchMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEARCH_MODE_UNSPECIFIED: _ClassVar[SearchMode]
    SEARCH_MODE_DENSE: _ClassVar[SearchMode]
    SEARCH_MODE_KEYWORD: _ClassVar[SearchMode]
    SEARCH_MODE_HYBRID: _ClassVar[SearchMode]

class SearchOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEARCH_ORDER_UNSPECIFIED: _ClassVar[SearchOrder]
    SEARCH_ORDER_RELEVANCE: _ClassVar[SearchOrder]
    SEARCH_ORDER_TIME: _ClassVar[SearchOrder]
    SEARCH_ORDER_NEWEST: _ClassVar[SearchOrder]
SEARCH_MODE_UNSPECIFIED: SearchMode
SEARCH_MODE_DENSE: SearchMode
SEARCH_MODE_KEYWORD: SearchMode
SEARCH_MODE_HYBRID: SearchMode
SEARCH_ORDER_UNSPECIFIED: SearchOrder
SEARCH_ORDER_RELEVANCE: SearchOrder
SEARCH_ORDER_TIME: SearchOrder
SEARCH_ORDER_NEWEST: SearchOrder

class MemoryEvent(_message.Message):
    __slots__ = ("conversation_id", "turn_id", "speaker", "text", "timestamp", "participants", "speaker_name", "payload")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_NAME_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    turn_id: int
    speaker: str
    text: str
    timestamp: str
    participants: _containers.RepeatedScalarFieldContainer[str]
    speaker_name: str
    payload: str
    def __init__(self, conversation_id: _Optional[str] = ..., turn_id: _Optional[int] = ..., speaker: _Optional[str] = ..., text: _Optional[str] = ..., timestamp: _Optional[str] = ..., participants: _Optional[_Iterable[str]] = ..., speaker_name: _Optional[str] = ..., payload: _Optional[str] = ...) -> None: ...

class TurnRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class TimestampRange(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: str
    end: str
    def __init__(self, start: _Optional[str] = ..., end: _Optional[str] = ...) -> None: ...

class ChunkMetadata(_message.Message):
    __slots__ = ("conversation_id", "turn_range", "timestamp_range", "participants", "speakers", "intent_tag", "chunk_version", "deleted", "part_index", "part_count")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_RANGE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_RANGE_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    SPEAKERS_FIELD_NUMBER: _ClassVar[int]
    INTENT_TAG_FIELD_NUMBER: _ClassVar[int]
    CHUNK_VERSION_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    PART_INDEX_FIELD_NUMBER: _ClassVar[int]
    PART_COUNT_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    turn_range: TurnRange
    timestamp_range: TimestampRange
    participants: _containers.RepeatedScalarFieldContainer[str]
    speakers: _containers.RepeatedScalarFieldContainer[str]
    intent_tag: str
    chunk_version: int
    deleted: bool
    part_index: int
    part_count: int
    def __init__(self, conversation_id: _Optional[str] = ..., turn_range: _Optional[_Union[TurnRange, _Mapping]] = ..., timestamp_range: _Optional[_Union[TimestampRange, _Mapping]] = ..., participants: _Optional[_Iterable[str]] = ..., speakers: _Optional[_Iterable[str]] = ..., intent_tag: _Optional[str] = ..., chunk_version: _Optional[int] = ..., deleted: _Optional[bool] = ..., part_index: _Optional[int] = ..., part_count: _Optional[int] = ...) -> None: ...

class ChunkRecord(_message.Message):
    __slots__ = ("chunk_id", "text", "metadata")
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    text: str
    metadata: ChunkMetadata
    def __init__(self, chunk_id: _Optional[str] = ..., text: _Optional[str] = ..., metadata: _Optional[_Union[ChunkMetadata, _Mapping]] = ...) -> None: ...

class RecordError(_message.Message):
    __slots__ = ("chunk_id", "message", "reason")
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    message: str
    reason: str
    def __init__(self, chunk_id: _Optional[str] = ..., message: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class BuildIncrementalChunksRequest(_message.Message):
    __slots__ = ("events", "chunk_version", "allow_gaps", "conversation_id", "restore")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_VERSION_FIELD_NUMBER: _ClassVar[int]
    ALLOW_GAPS_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[MemoryEvent]
    chunk_version: int
    allow_gaps: bool
    conversation_id: str
    restore: bool
    def __init__(self, events: _Optional[_Iterable[_Union[MemoryEvent, _Mapping]]] = ..., chunk_version: _Optional[int] = ..., allow_gaps: _Optional[bool] = ..., conversation_id: _Optional[str] = ..., restore: _Optional[bool] = ...) -> None: ...

class BuildIncrementalChunksResponse(_message.Message):
    __slots__ = ("conversation_id", "turn_range", "chunks", "superseded_chunk_ids", "truncated")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_RANGE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_CHUNK_IDS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    turn_range: TurnRange
    chunks: _containers.RepeatedCompositeFieldContainer[ChunkRecord]
    superseded_chunk_ids: _containers.RepeatedScalarFieldContainer[str]
    truncated: _containers.RepeatedCompositeFieldContainer[Truncation]
    def __init__(self, conversation_id: _Optional[str] = ..., turn_range: _Optional[_Union[TurnRange, _Mapping]] = ..., chunks: _Optional[_Iterable[_Union[ChunkRecord, _Mapping]]] = ..., superseded_chunk_ids: _Optional[_Iterable[str]] = ..., truncated: _Optional[_Iterable[_Union[Truncation, _Mapping]]] = ...) -> None: ...

class Truncation(_message.Message):
    __slots__ = ("event", "field", "original_chars", "kept_chars")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_CHARS_FIELD_NUMBER: _ClassVar[int]
    KEPT_CHARS_FIELD_NUMBER: _ClassVar[int]
    event: str
    field: str
    original_chars: int
    kept_chars: int
    def __init__(self, event: _Optional[str] = ..., field: _Optional[str] = ..., original_chars: _Optional[int] = ..., kept_chars: _Optional[int] = ...) -> None: ...

class UpsertVectorRecordsRequest(_message.Message):
    __slots__ = ("records",)
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[ChunkRecord]
    def __init__(self, records: _Optional[_Iterable[_Union[ChunkRecord, _Mapping]]] = ...) -> None: ...

class UpsertVectorRecordsResponse(_message.Message):
    __slots__ = ("upserted", "updated", "unchanged", "errors", "retired")
    UPSERTED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    upserted: int
    updated: int
    unchanged: int
    errors: _containers.RepeatedCompositeFieldContainer[RecordError]
    retired: int
    def __init__(self, upserted: _Optional[int] = ..., updated: _Optional[int] = ..., unchanged: _Optional[int] = ..., errors: _Optional[_Iterable[_Union[RecordError, _Mapping]]] = ..., retired: _Optional[int] = ...) -> None: ...

class LogicalDeleteBySourceRequest(_message.Message):
    __slots__ = ("conversation_id", "turn_range", "chunk_ids", "defer_store")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_RANGE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_IDS_FIELD_NUMBER: _ClassVar[int]
    DEFER_STORE_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    turn_range: TurnRange
    chunk_ids: _containers.RepeatedScalarFieldContainer[str]
    defer_store: bool
    def __init__(self, conversation_id: _Optional[str] = ..., turn_range: _Optional[_Union[TurnRange, _Mapping]] = ..., chunk_ids: _Optional[_Iterable[str]] = ..., defer_store: _Optional[bool] = ...) -> None: ...

class LogicalDeleteBySourceResponse(_message.Message):
    __slots__ = ("deleted", "errors", "events_deleted")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    errors: _containers.RepeatedCompositeFieldContainer[RecordError]
    events_deleted: int
    def __init__(self, deleted: _Optional[int] = ..., errors: _Optional[_Iterable[_Union[RecordError, _Mapping]]] = ..., events_deleted: _Optional[int] = ...) -> None: ...

class PopEventsRequest(_message.Message):
    __slots__ = ("conversation_id", "count", "max_reply_bytes", "idempotency_key")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLY_BYTES_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    count: int
    max_reply_bytes: int
    idempotency_key: str
    def __init__(self, conversation_id: _Optional[str] = ..., count: _Optional[int] = ..., max_reply_bytes: _Optional[int] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class PopEventsResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[MemoryEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[MemoryEvent, _Mapping]]] = ...) -> None: ...

class EmbedChunkRequest(_message.Message):
    __slots__ = ("query",)
    QUERY_FIELD_NUMBER: _ClassVar[int]
    query: str
    def __init__(self, query: _Optional[str] = ...) -> None: ...

class EmbedChunkResponse(_message.Message):
    __slots__ = ("vector", "model", "dim")
    VECTOR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    vector: _containers.RepeatedScalarFieldContainer[float]
    model: str
    dim: int
    def __init__(self, vector: _Optional[_Iterable[float]] = ..., model: _Optional[str] = ..., dim: _Optional[int] = ...) -> None: ...

class Vector(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class EmbedBatchRequest(_message.Message):
    __slots__ = ("texts", "is_query")
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    IS_QUERY_FIELD_NUMBER: _ClassVar[int]
    texts: _containers.RepeatedScalarFieldContainer[str]
    is_query: bool
    def __init__(self, texts: _Optional[_Iterable[str]] = ..., is_query: _Optional[bool] = ...) -> None: ...

class EmbedBatchResponse(_message.Message):
    __slots__ = ("vectors", "model", "dim")
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    vectors: _containers.RepeatedCompositeFieldContainer[Vector]
    model: str
    dim: int
    def __init__(self, vectors: _Optional[_Iterable[_Union[Vector, _Mapping]]] = ..., model: _Optional[str] = ..., dim: _Optional[int] = ...) -> None: ...

class SearchFilters(_message.Message):
    __slots__ = ("conversation_ids", "participants", "speakers", "timestamp_range", "intent_tag", "include_deleted", "chunk_version")
    CONVERSATION_IDS_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    SPEAKERS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_RANGE_FIELD_NUMBER: _ClassVar[int]
    INTENT_TAG_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DELETED_FIELD_NUMBER: _ClassVar[int]
    CHUNK_VERSION_FIELD_NUMBER: _ClassVar[int]
    conversation_ids: _containers.RepeatedScalarFieldContainer[str]
    participants: _containers.RepeatedScalarFieldContainer[str]
    speakers: _containers.RepeatedScalarFieldContainer[str]
    timestamp_range: TimestampRange
    intent_tag: str
    include_deleted: bool
    chunk_version: int
    def __init__(self, conversation_ids: _Optional[_Iterable[str]] = ..., participants: _Optional[_Iterable[str]] = ..., speakers: _Optional[_Iterable[str]] = ..., timestamp_range: _Optional[_Union[TimestampRange, _Mapping]] = ..., intent_tag: _Optional[str] = ..., include_deleted: _Optional[bool] = ..., chunk_version: _Optional[int] = ...) -> None: ...

class EmbedDbRequest(_message.Message):
    __slots__ = ("query_text", "top_k", "filters", "mode", "mmr_lambda", "turn_budget", "exclude_standing", "order", "explain", "keep_query_end")
    QUERY_TEXT_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MMR_LAMBDA_FIELD_NUMBER: _ClassVar[int]
    TURN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_STANDING_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    EXPLAIN_FIELD_NUMBER: _ClassVar[int]
    KEEP_QUERY_END_FIELD_NUMBER: _ClassVar[int]
    query_text: str
    top_k: int
    filters: SearchFilters
    mode: SearchMode
    mmr_lambda: float
    turn_budget: int
    exclude_standing: bool
    order: SearchOrder
    explain: bool
    keep_query_end: bool
    def __init__(self, query_text: _Optional[str] = ..., top_k: _Optional[int] = ..., filters: _Optional[_Union[SearchFilters, _Mapping]] = ..., mode: _Optional[_Union[SearchMode, str]] = ..., mmr_lambda: _Optional[float] = ..., turn_budget: _Optional[int] = ..., exclude_standing: _Optional[bool] = ..., order: _Optional[_Union[SearchOrder, str]] = ..., explain: _Optional[bool] = ..., keep_query_end: _Optional[bool] = ...) -> None: ...

class HitExplanation(_message.Message):
    __slots__ = ("dense_rank", "dense_score", "keyword_rank", "keyword_score", "fused_score", "matched_terms")
    DENSE_RANK_FIELD_NUMBER: _ClassVar[int]
    DENSE_SCORE_FIELD_NUMBER: _ClassVar[int]
    KEYWORD_RANK_FIELD_NUMBER: _ClassVar[int]
    KEYWORD_SCORE_FIELD_NUMBER: _ClassVar[int]
    FUSED_SCORE_FIELD_NUMBER: _ClassVar[int]
    MATCHED_TERMS_FIELD_NUMBER: _ClassVar[int]
    dense_rank: int
    dense_score: float
    keyword_rank: int
    keyword_score: float
    fused_score: float
    matched_terms: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, dense_rank: _Optional[int] = ..., dense_score: _Optional[float] = ..., keyword_rank: _Optional[int] = ..., keyword_score: _Optional[float] = ..., fused_score: _Optional[float] = ..., matched_terms: _Optional[_Iterable[str]] = ...) -> None: ...

class Hit(_message.Message):
    __slots__ = ("chunk_id", "score", "text", "metadata", "explanation", "turns")
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    score: float
    text: str
    metadata: ChunkMetadata
    explanation: HitExplanation
    turns: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, chunk_id: _Optional[str] = ..., score: _Optional[float] = ..., text: _Optional[str] = ..., metadata: _Optional[_Union[ChunkMetadata, _Mapping]] = ..., explanation: _Optional[_Union[HitExplanation, _Mapping]] = ..., turns: _Optional[_Iterable[int]] = ...) -> None: ...

class EmbedDbResponse(_message.Message):
    __slots__ = ("query_text", "top_k", "hits", "mode", "standing", "query_cut", "unrelated_similarity")
    QUERY_TEXT_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    STANDING_FIELD_NUMBER: _ClassVar[int]
    QUERY_CUT_FIELD_NUMBER: _ClassVar[int]
    UNRELATED_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    query_text: str
    top_k: int
    hits: _containers.RepeatedCompositeFieldContainer[Hit]
    mode: SearchMode
    standing: _containers.RepeatedCompositeFieldContainer[Hit]
    query_cut: int
    unrelated_similarity: float
    def __init__(self, query_text: _Optional[str] = ..., top_k: _Optional[int] = ..., hits: _Optional[_Iterable[_Union[Hit, _Mapping]]] = ..., mode: _Optional[_Union[SearchMode, str]] = ..., standing: _Optional[_Iterable[_Union[Hit, _Mapping]]] = ..., query_cut: _Optional[int] = ..., unrelated_similarity: _Optional[float] = ...) -> None: ...

class ListChunksRequest(_message.Message):
    __slots__ = ("conversation_id", "include_deleted", "page_size", "page_token", "chunk_version")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DELETED_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_VERSION_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    include_deleted: bool
    page_size: int
    page_token: str
    chunk_version: int
    def __init__(self, conversation_id: _Optional[str] = ..., include_deleted: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., chunk_version: _Optional[int] = ...) -> None: ...

class ListChunksResponse(_message.Message):
    __slots__ = ("chunks", "next_page_token")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[ChunkRecord]
    next_page_token: str
    def __init__(self, chunks: _Optional[_Iterable[_Union[ChunkRecord, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RetireChunkVersionRequest(_message.Message):
    __slots__ = ("conversation_id", "chunk_version")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_VERSION_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    chunk_version: int
    def __init__(self, conversation_id: _Optional[str] = ..., chunk_version: _Optional[int] = ...) -> None: ...

class RetireChunkVersionResponse(_message.Message):
    __slots__ = ("retired",)
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    retired: int
    def __init__(self, retired: _Optional[int] = ...) -> None: ...

class ExportEventsRequest(_message.Message):
    __slots__ = ("conversation_id", "page_size", "page_token", "last", "turn_range")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    TURN_RANGE_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    page_size: int
    page_token: str
    last: int
    turn_range: TurnRange
    def __init__(self, conversation_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., last: _Optional[int] = ..., turn_range: _Optional[_Union[TurnRange, _Mapping]] = ...) -> None: ...

class ExportEventsResponse(_message.Message):
    __slots__ = ("events", "next_page_token")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[MemoryEvent]
    next_page_token: str
    def __init__(self, events: _Optional[_Iterable[_Union[MemoryEvent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PurgeDeletedRequest(_message.Message):
    __slots__ = ("conversation_id", "all_conversations")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    ALL_CONVERSATIONS_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    all_conversations: bool
    def __init__(self, conversation_id: _Optional[str] = ..., all_conversations: _Optional[bool] = ...) -> None: ...

class PurgeDeletedResponse(_message.Message):
    __slots__ = ("chunks_purged", "events_purged")
    CHUNKS_PURGED_FIELD_NUMBER: _ClassVar[int]
    EVENTS_PURGED_FIELD_NUMBER: _ClassVar[int]
    chunks_purged: int
    events_purged: int
    def __init__(self, chunks_purged: _Optional[int] = ..., events_purged: _Optional[int] = ...) -> None: ...

class AppendEventsRequest(_message.Message):
    __slots__ = ("events", "allow_gaps", "restore", "assign_turn_ids", "idempotency_key", "expected_last_turn")
    class ExpectedLastTurnEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_GAPS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_FIELD_NUMBER: _ClassVar[int]
    ASSIGN_TURN_IDS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_LAST_TURN_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[MemoryEvent]
    allow_gaps: bool
    restore: bool
    assign_turn_ids: bool
    idempotency_key: str
    expected_last_turn: _containers.ScalarMap[str, int]
    def __init__(self, events: _Optional[_Iterable[_Union[MemoryEvent, _Mapping]]] = ..., allow_gaps: _Optional[bool] = ..., restore: _Optional[bool] = ..., assign_turn_ids: _Optional[bool] = ..., idempotency_key: _Optional[str] = ..., expected_last_turn: _Optional[_Mapping[str, int]] = ...) -> None: ...

class AppendEventsResponse(_message.Message):
    __slots__ = ("accepted", "duplicates", "errors", "truncated", "turn_ids")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TURN_IDS_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    errors: _containers.RepeatedCompositeFieldContainer[RecordError]
    truncated: _containers.RepeatedCompositeFieldContainer[Truncation]
    turn_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ..., errors: _Optional[_Iterable[_Union[RecordError, _Mapping]]] = ..., truncated: _Optional[_Iterable[_Union[Truncation, _Mapping]]] = ..., turn_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class IndexStatus(_message.Message):
    __slots__ = ("conversation_id", "last_appended_turn", "last_indexed_turn", "backlog", "state", "last_error", "attempts", "chunk_version", "reindexing", "last_timestamp")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_APPENDED_TURN_FIELD_NUMBER: _ClassVar[int]
    LAST_INDEXED_TURN_FIELD_NUMBER: _ClassVar[int]
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_VERSION_FIELD_NUMBER: _ClassVar[int]
    REINDEXING_FIELD_NUMBER: _ClassVar[int]
    LAST_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    last_appended_turn: int
    last_indexed_turn: int
    backlog: int
    state: str
    last_error: str
    attempts: int
    chunk_version: int
    reindexing: bool
    last_timestamp: str
    def __init__(self, conversation_id: _Optional[str] = ..., last_appended_turn: _Optional[int] = ..., last_indexed_turn: _Optional[int] = ..., backlog: _Optional[int] = ..., state: _Optional[str] = ..., last_error: _Optional[str] = ..., attempts: _Optional[int] = ..., chunk_version: _Optional[int] = ..., reindexing: _Optional[bool] = ..., last_timestamp: _Optional[str] = ...) -> None: ...

class GetIndexStatusRequest(_message.Message):
    __slots__ = ("conversation_ids", "page_size", "page_token", "states", "conversation_prefix")
    CONVERSATION_IDS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_PREFIX_FIELD_NUMBER: _ClassVar[int]
    conversation_ids: _containers.RepeatedScalarFieldContainer[str]
    page_size: int
    page_token: str
    states: _containers.RepeatedScalarFieldContainer[str]
    conversation_prefix: str
    def __init__(self, conversation_ids: _Optional[_Iterable[str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., states: _Optional[_Iterable[str]] = ..., conversation_prefix: _Optional[str] = ...) -> None: ...

class GetIndexStatusResponse(_message.Message):
    __slots__ = ("conversations", "total_conversations", "total_backlog", "pending", "indexing", "failed", "paused", "server", "caller", "figures", "health", "next_page_token")
    CONVERSATIONS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CONVERSATIONS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BACKLOG_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    INDEXING_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    conversations: _containers.RepeatedCompositeFieldContainer[IndexStatus]
    total_conversations: int
    total_backlog: int
    pending: int
    indexing: int
    failed: int
    paused: bool
    server: ServerInfo
    caller: Caller
    figures: ServerFigures
    health: ServerHealth
    next_page_token: str
    def __init__(self, conversations: _Optional[_Iterable[_Union[IndexStatus, _Mapping]]] = ..., total_conversations: _Optional[int] = ..., total_backlog: _Optional[int] = ..., pending: _Optional[int] = ..., indexing: _Optional[int] = ..., failed: _Optional[int] = ..., paused: _Optional[bool] = ..., server: _Optional[_Union[ServerInfo, _Mapping]] = ..., caller: _Optional[_Union[Caller, _Mapping]] = ..., figures: _Optional[_Union[ServerFigures, _Mapping]] = ..., health: _Optional[_Union[ServerHealth, _Mapping]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ServerHealth(_message.Message):
    __slots__ = ("store_up", "embedder_up", "log_up", "disk_full")
    STORE_UP_FIELD_NUMBER: _ClassVar[int]
    EMBEDDER_UP_FIELD_NUMBER: _ClassVar[int]
    LOG_UP_FIELD_NUMBER: _ClassVar[int]
    DISK_FULL_FIELD_NUMBER: _ClassVar[int]
    store_up: bool
    embedder_up: bool
    log_up: bool
    disk_full: bool
    def __init__(self, store_up: _Optional[bool] = ..., embedder_up: _Optional[bool] = ..., log_up: _Optional[bool] = ..., disk_full: _Optional[bool] = ...) -> None: ...

class Caller(_message.Message):
    __slots__ = ("role", "conversation_prefixes", "authenticated")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_PREFIXES_FIELD_NUMBER: _ClassVar[int]
    AUTHENTICATED_FIELD_NUMBER: _ClassVar[int]
    role: str
    conversation_prefixes: _containers.RepeatedScalarFieldContainer[str]
    authenticated: bool
    def __init__(self, role: _Optional[str] = ..., conversation_prefixes: _Optional[_Iterable[str]] = ..., authenticated: _Optional[bool] = ...) -> None: ...

class ServerFigures(_message.Message):
    __slots__ = ("uptime_s", "chunks_written", "searches", "search_latency_bounds_s", "search_latency_counts", "index_lag_count", "index_lag_sum_s")
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    SEARCHES_FIELD_NUMBER: _ClassVar[int]
    SEARCH_LATENCY_BOUNDS_S_FIELD_NUMBER: _ClassVar[int]
    SEARCH_LATENCY_COUNTS_FIELD_NUMBER: _ClassVar[int]
    INDEX_LAG_COUNT_FIELD_NUMBER: _ClassVar[int]
    INDEX_LAG_SUM_S_FIELD_NUMBER: _ClassVar[int]
    uptime_s: float
    chunks_written: int
    searches: int
    search_latency_bounds_s: _containers.RepeatedScalarFieldContainer[float]
    search_latency_counts: _containers.RepeatedScalarFieldContainer[int]
    index_lag_count: int
    index_lag_sum_s: float
    def __init__(self, uptime_s: _Optional[float] = ..., chunks_written: _Optional[int] = ..., searches: _Optional[int] = ..., search_latency_bounds_s: _Optional[_Iterable[float]] = ..., search_latency_counts: _Optional[_Iterable[int]] = ..., index_lag_count: _Optional[int] = ..., index_lag_sum_s: _Optional[float] = ...) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("version", "model", "model_fallback", "dim", "embed_backend", "log_backend", "model_notice", "model_move", "store_shards", "store_shards_loaded")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_FALLBACK_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    EMBED_BACKEND_FIELD_NUMBER: _ClassVar[int]
    LOG_BACKEND_FIELD_NUMBER: _ClassVar[int]
    MODEL_NOTICE_FIELD_NUMBER: _ClassVar[int]
    MODEL_MOVE_FIELD_NUMBER: _ClassVar[int]
    STORE_SHARDS_FIELD_NUMBER: _ClassVar[int]
    STORE_SHARDS_LOADED_FIELD_NUMBER: _ClassVar[int]
    version: str
    model: str
    model_fallback: bool
    dim: int
    embed_backend: str
    log_backend: str
    model_notice: str
    model_move: ModelMove
    store_shards: int
    store_shards_loaded: int
    def __init__(self, version: _Optional[str] = ..., model: _Optional[str] = ..., model_fallback: _Optional[bool] = ..., dim: _Optional[int] = ..., embed_backend: _Optional[str] = ..., log_backend: _Optional[str] = ..., model_notice: _Optional[str] = ..., model_move: _Optional[_Union[ModelMove, _Mapping]] = ..., store_shards: _Optional[int] = ..., store_shards_loaded: _Optional[int] = ...) -> None: ...

class ModelMove(_message.Message):
    __slots__ = ("from_model", "from_collection", "to_collection", "conversations", "left", "previous_model_serves")
    FROM_MODEL_FIELD_NUMBER: _ClassVar[int]
    FROM_COLLECTION_FIELD_NUMBER: _ClassVar[int]
    TO_COLLECTION_FIELD_NUMBER: _ClassVar[int]
    CONVERSATIONS_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_MODEL_SERVES_FIELD_NUMBER: _ClassVar[int]
    from_model: str
    from_collection: str
    to_collection: str
    conversations: int
    left: int
    previous_model_serves: bool
    def __init__(self, from_model: _Optional[str] = ..., from_collection: _Optional[str] = ..., to_collection: _Optional[str] = ..., conversations: _Optional[int] = ..., left: _Optional[int] = ..., previous_model_serves: _Optional[bool] = ...) -> None: ...

class WaitForIndexedRequest(_message.Message):
    __slots__ = ("conversation_id", "turn_id", "timeout_ms")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    turn_id: int
    timeout_ms: int
    def __init__(self, conversation_id: _Optional[str] = ..., turn_id: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class WaitForIndexedResponse(_message.Message):
    __slots__ = ("indexed", "status")
    INDEXED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    indexed: bool
    status: IndexStatus
    def __init__(self, indexed: _Optional[bool] = ..., status: _Optional[_Union[IndexStatus, _Mapping]] = ...) -> None: ...

class SetIndexingPausedRequest(_message.Message):
    __slots__ = ("paused",)
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    def __init__(self, paused: _Optional[bool] = ...) -> None: ...

class SetIndexingPausedResponse(_message.Message):
    __slots__ = ("paused",)
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    paused: bool
    def __init__(self, paused: _Optional[bool] = ...) -> None: ...

class ReindexRequest(_message.Message):
    __slots__ = ("conversation_ids", "all", "chunk_version", "cancel")
    CONVERSATION_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    CHUNK_VERSION_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    conversation_ids: _containers.RepeatedScalarFieldContainer[str]
    all: bool
    chunk_version: int
    cancel: bool
    def __init__(self, conversation_ids: _Optional[_Iterable[str]] = ..., all: _Optional[bool] = ..., chunk_version: _Optional[int] = ..., cancel: _Optional[bool] = ...) -> None: ...

class ReindexResponse(_message.Message):
    __slots__ = ("queued",)
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    queued: int
    def __init__(self, queued: _Optional[int] = ...) -> None: ...
