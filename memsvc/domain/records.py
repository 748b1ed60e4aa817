"""What the event log, the index queue and the vector store hold, as plain values: the
storage backends return these and the services work on them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from memsvc.domain.types import ChunkRecord

# Tokens a BERT-style model reads when its config names no position limit.
DEFAULT_MAX_TOKENS = 512


@dataclass(frozen=True)
class ModelInfo:
    """The embedding model in use, as the embedder reports it."""

    name: str
    dim: int
    pooling: str
    query_instruction: str | None
    fallback: bool
    # Tokens the model reads per text, the special tokens ([CLS] ... [SEP]) included.
    max_tokens: int = DEFAULT_MAX_TOKENS
    special_tokens: int = 2


# -- the event log ----------------------------------------------------------------------------
@dataclass(frozen=True)
class EventRow:
    """One turn as logged: raw and cleaned text, token count, deleted flag. A purged turn
    is a tombstone (deleted, no text) so turn numbering continues."""

    conversation_id: str
    turn_id: int
    speaker: str
    speaker_name: str
    text: str
    clean_text: str
    timestamp: str
    participants: tuple[str, ...]
    tokens: int
    deleted: bool = False

    def same_content(self, other: EventRow) -> bool:
        return (self.speaker, self.speaker_name, self.text, self.timestamp, self.participants) == (
            other.speaker,
            other.speaker_name,
            other.text,
            other.timestamp,
            other.participants,
        )


@dataclass(frozen=True)
class LayoutRow:
    """A chunk the last plan of its conversation and version holds: source hash = what it
    was derived from, text hash = what it says, content hash = text and metadata as the
    server renders them (the only record an upsert may store for that id)."""

    chunk_id: str
    conversation_id: str
    chunk_version: int
    start_turn: int
    end_turn: int
    source_hash: str
    text_hash: str
    deleted: bool = False
    indexed: bool = False
    # "" for rows written before content hashes were kept: re-rendered on the next build.
    content_hash: str = ""

    def covers(self, turn_id: int) -> bool:
        return self.start_turn <= turn_id <= self.end_turn


# -- the index queue --------------------------------------------------------------------------
@dataclass(frozen=True)
class QueueItem:
    """One conversation's asynchronous indexing state."""

    conversation_id: str
    state: str  # idle | pending | indexing | failed
    chunk_version: int
    dirty: int  # accepted events not yet indexed
    attempts: int
    last_error: str
    last_indexed_turn: int
    reindex: bool
    last_appended_turn: int = -1

    def indexed_through(self, turn_id: int) -> bool:
        return self.state == "idle" and self.last_indexed_turn >= turn_id


@dataclass(frozen=True)
class QueueGauges:
    backlog: int
    by_state: dict[str, int]
    oldest_pending_since: float | None  # unix time; None = nothing waiting


@dataclass(frozen=True)
class IndexTotals:
    conversations: int
    backlog: int
    pending: int
    indexing: int
    failed: int
    paused: bool


# -- the vector store -------------------------------------------------------------------------
@dataclass(frozen=True)
class StoredChunk:
    record: ChunkRecord
    content_hash: str
    vector: np.ndarray | None = None


# A ranked chunk id and its score (fusion works on these).
Scored = tuple[str, float]


class Candidate(NamedTuple):
    """A search candidate: id and score, and its whole record when the search read it.
    A search with hundreds of candidates (hybrid) reads ids only: their texts would cost
    ~3 ms more per list on one conversation of 205 chunks (benchmarks/RESULTS.md, Speed
    v3), and the records of the few returned are read afterwards. One with few (dense or
    keyword alone) reads whole records, which saves that second round trip."""

    chunk_id: str
    score: float
    stored: StoredChunk | None = None
