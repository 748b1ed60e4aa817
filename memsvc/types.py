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


@dataclass(frozen=True)
class RecordError:
    chunk_id: str
    message: str


@dataclass(frozen=True)
class BuildResult:
    conversation_id: str
    turn_range: TurnRange | None
    chunks: list[ChunkRecord]
    superseded_chunk_ids: list[str]


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


@dataclass(frozen=True)
class SearchRequest:
    query_text: str
    top_k: int = 0
    filters: SearchFilters = field(default_factory=SearchFilters)
    mode: SearchMode | None = None
    mmr_lambda: float = 0.0


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    score: float
    text: str
    metadata: ChunkMetadata
