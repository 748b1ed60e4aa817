"""Plain data types of the core; the gRPC layer maps protobuf messages to and from these."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

SPEAKERS = ("user", "assistant", "system")


@dataclass(frozen=True)
class MemoryEvent:
    conversation_id: str
    turn_id: int
    speaker: str
    text: str
    timestamp: str
    participants: tuple[str, ...] = ()
    speaker_name: str = ""
    # Kept as sent and returned by ExportEvents; never chunked or searched.
    payload: str = ""


@dataclass(frozen=True)
class TurnRange:
    start: int
    end: int


@dataclass(frozen=True)
class TimestampRange:
    start: str = ""
    end: str = ""


@dataclass(frozen=True)
class ChunkMetadata:
    conversation_id: str
    turn_range: TurnRange
    timestamp_range: TimestampRange
    participants: tuple[str, ...]
    speakers: tuple[str, ...]
    intent_tag: str
    chunk_version: int
    deleted: bool = False
    part_index: int = 0
    part_count: int = 1


@dataclass(frozen=True)
class ChunkRecord:
    chunk_id: str
    text: str
    metadata: ChunkMetadata


# Why a record (or event) of a batch was refused: a stable, machine-readable code.
REASON_INVALID = "invalid"  # a field fails validation (the message names it)
REASON_UNKNOWN = "unknown"  # no chunk with this id was built by this server
REASON_SUPERSEDED = "superseded"  # a later build replaced this chunk
REASON_DELETED = "deleted"  # the chunk covers a deleted turn
REASON_MISMATCH = "mismatch"  # text or metadata differ from the server's chunk for this id
REASON_TOO_LONG = "too_long"  # over the model's token limit
REASON_BUSY = "busy"  # another writer held the conversation too long: retry
REASON_LAST_TURN_MOVED = "last_turn_moved"  # expected_last_turn no longer holds: read again
# Refusals that mean "the layout moved on": build again and upsert what it returns.
STALE_REASONS = frozenset({REASON_UNKNOWN, REASON_SUPERSEDED, REASON_DELETED, REASON_MISMATCH})


@dataclass(frozen=True)
class RecordError:
    chunk_id: str
    message: str
    reason: str = REASON_INVALID


@dataclass(frozen=True)
class Truncation:
    """A turn accepted cut short (MEMSVC_OVERSIZE=truncate): which, and how much."""

    event: str  # conversation#turn
    field: str  # the request field, e.g. events[3].text
    original_chars: int
    kept_chars: int


@dataclass(frozen=True)
class BuildResult:
    conversation_id: str
    turn_range: TurnRange | None
    chunks: list[ChunkRecord]
    superseded_chunk_ids: list[str]
    truncated: list[Truncation] = field(default_factory=list)


@dataclass(frozen=True)
class UpsertResult:
    upserted: int = 0
    updated: int = 0
    unchanged: int = 0
    retired: int = 0
    errors: list[RecordError] = field(default_factory=list)


@dataclass(frozen=True)
class AppendResult:
    accepted: int
    duplicates: int
    errors: list[RecordError] = field(default_factory=list)
    truncated: list[Truncation] = field(default_factory=list)
    # with assign_turn_ids: the turn id each event got, in request order (-1: not written)
    turn_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class DeleteResult:
    deleted: int
    events_deleted: int
    errors: list[RecordError] = field(default_factory=list)


class SearchMode(Enum):
    DENSE = "dense"
    KEYWORD = "keyword"
    HYBRID = "hybrid"


@dataclass(frozen=True)
class SearchFilters:
    conversation_ids: tuple[str, ...] = ()
    participants: tuple[str, ...] = ()
    speakers: tuple[str, ...] = ()
    timestamp_range: TimestampRange | None = None
    intent_tag: str = ""
    include_deleted: bool = False
    chunk_version: int = 0


class SearchOrder(Enum):
    RELEVANCE = "relevance"
    TIME = "time"  # oldest first: how a topic unfolded
    NEWEST = "newest"  # newest first: the current value of something stated several times


@dataclass(frozen=True)
class SearchRequest:
    query_text: str
    top_k: int = 0
    filters: SearchFilters = field(default_factory=SearchFilters)
    mode: SearchMode | None = None
    mmr_lambda: float = 0.0
    # Turns the hits (and standing instructions) may cover in all, each counted once;
    # 0 = no budget, top_k alone bounds the hits.
    turn_budget: int = 0
    # Return the standing instructions that apply beside the hits.
    standing: bool = True
    order: SearchOrder = SearchOrder.RELEVANCE
    # Say why each hit ranks where it does (Hit.explanation).
    explain: bool = False
    # Cut a query over the limits to its end instead of refusing it.
    keep_query_end: bool = False


@dataclass(frozen=True)
class Explanation:
    """A hit's place in each candidate list (rank 1-based, 0 = not in that list), the score
    it was ranked by, and the query words found in its text."""

    dense_rank: int
    dense_score: float
    keyword_rank: int
    keyword_score: float
    fused_score: float
    matched_terms: tuple[str, ...]


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    score: float
    text: str
    metadata: ChunkMetadata
    explanation: Explanation | None = None
    # The turns `text` holds when fewer than the chunk's (a late window hit narrowed under
    # a turn budget, memsvc.services.narrowing); empty: all of metadata.turn_range.
    turns: tuple[int, ...] = ()


@dataclass(frozen=True)
class SearchResult:
    mode: SearchMode
    top_k: int
    hits: list[Hit]
    # Standing instructions and preferences that apply to the query (never among `hits`).
    standing: list[Hit] = field(default_factory=list)
    query_text: str = ""  # the query searched (its end, with keep_query_end)
    query_cut: int = 0  # characters of the request's query left out
    unrelated: float = 0.0  # with explain: the model's cosine of unrelated texts
