"""What the event log, the index queue and the vector store hold, as plain values: the
storage backends return these and the services work on them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from memsvc.domain.pages import utf8_size
from memsvc.domain.types import ChunkRecord, MemoryEvent

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
    provider: str = "local"  # local | openai
    # What an operator must know of the model serving: why the fallback serves and what
    # that means (empty when the configured model serves).
    notice: str = ""


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
    payload: str = ""

    def as_appended(self) -> MemoryEvent:
        """The turn as it was appended (what export and a pop return)."""
        return MemoryEvent(
            conversation_id=self.conversation_id,
            turn_id=self.turn_id,
            speaker=self.speaker,
            text=self.text,
            timestamp=self.timestamp,
            participants=tuple(self.participants),
            speaker_name=self.speaker_name,
            payload=self.payload,
        )

    def size(self) -> int:
        """Its bytes in a page (export, pop): with ITEM_OVERHEAD_BYTES, at least its size on
        the wire (a pop's reply is checked against the caller's budget with it); each name
        of `participants` adds its own field's tag and length."""
        return utf8_size(
            self.conversation_id,
            self.text,
            self.payload,
            self.timestamp,
            self.speaker_name,
            self.speaker,
            *self.participants,
        ) + 3 * len(self.participants)

    def same_content(self, other: EventRow) -> bool:
        if self.payload != other.payload:
            return False
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
    # A standing instruction (intent tag "instruction"). True where not known (rows written
    # before the log kept it), so a search never skips the rules it might hold.
    standing: bool = True

    def covers(self, turn_id: int) -> bool:
        return self.start_turn <= turn_id <= self.end_turn


# -- conversations and their indexing ---------------------------------------------------------
@dataclass(frozen=True)
class Conversation:
    """A conversation's versions and the progress of its projection into the store.

    Every log change the store must reflect bumps `work_seq`, and the events it wrote carry
    that number (`seq`). The store reflects the log, for default searches, through
    `done_seq`; a change that needs the store compared with the layout as a whole (a delete,
    purge, retire, a version switch) sets `reconcile_seq`, done once `reconciled_seq`
    reaches it. `active_version` is what searches read and new turns are built in; a
    reindex builds `building_version` beside it, which becomes active once complete."""

    conversation_id: str
    active_version: int
    building_version: int = 0
    work_seq: int = 0
    done_seq: int = 0
    reconcile_seq: int = 0
    reconciled_seq: int = 0
    active_planned_seq: int = 0
    building_planned_seq: int = 0
    # A bounded step stored part of a large backlog: turns up to `last_indexed_turn` whose
    # events carry seq <= progress_seq are findable already.
    progress_seq: int = 0
    last_indexed_turn: int = -1
    # Set by the settle that made the conversation idle: seconds its oldest accepted turn
    # waited to be searchable (not stored).
    searchable_after_s: float | None = None

    @property
    def needs_reconcile(self) -> bool:
        return self.reconcile_seq > self.reconciled_seq

    def planned_seq(self, version: int) -> int:
        if version == self.active_version:
            return self.active_planned_seq
        if version == self.building_version:
            return self.building_planned_seq
        return 0

    def findable_through(self, turn_id: int, latest_seq: int) -> bool:
        """Whether default searches find every turn up to `turn_id` as last written, given
        the latest work sequence number among those turns."""
        return latest_seq <= self.done_seq or (
            latest_seq <= self.progress_seq and turn_id <= self.last_indexed_turn
        )


@dataclass(frozen=True)
class QueueItem:
    """One conversation's asynchronous indexing state (and, when leased, the lease)."""

    conversation_id: str
    state: str  # idle | pending | indexing | failed
    active_version: int
    building_version: int
    dirty: int  # turns written and not yet findable
    attempts: int
    last_error: str
    last_indexed_turn: int
    last_appended_turn: int = -1
    lease_token: int = 0
    leased_seq: int = 0
    needs_reconcile: bool = False
    last_timestamp: str = ""  # the last turn's, as appended ("" = none)
    # W3C traceparents of the calls that queued this work since its last lease (newest
    # first, a few): the index step's span links to them
    trace_links: tuple[str, ...] = ()

    @property
    def reindex(self) -> bool:
        return self.building_version != 0

    @property
    def chunk_version(self) -> int:
        """The version being built: the reindex target, else the active one."""
        return self.building_version or self.active_version


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
class TurnLines:
    """The turns of a chunk that spans several: each one's id, where its line starts in
    the chunk's text, and its vector (pooled from the chunk's forward pass over the
    tokens of its line: memsvc.embedding.parts). With them a search can
    return the few turns of a late window hit that bear on the query, not all of them
    (memsvc.services.narrowing)."""

    turn_ids: tuple[int, ...]
    starts: tuple[int, ...]
    vectors: np.ndarray  # one row per turn, unit length

    def text_of(self, text: str, keep: Sequence[int]) -> str:
        """`text` (the chunk's) with the lines of the turns in `keep` only, under its
        prefix line."""
        ends = [*(s - 1 for s in self.starts[1:]), len(text)]
        lines = [
            text[start:end]
            for turn, start, end in zip(self.turn_ids, self.starts, ends, strict=True)
            if turn in keep
        ]
        return "\n".join([text[: self.starts[0] - 1], *lines])


@dataclass(frozen=True)
class StoredChunk:
    record: ChunkRecord
    content_hash: str
    vector: np.ndarray | None = None
    # Of its conversation's active version (what default searches read).
    current: bool = True
    # A chunk of several turns, when the store keeps them (schema 4): read with its vector.
    turn_lines: TurnLines | None = None


# A ranked chunk id and its score (fusion works on these).
Scored = tuple[str, float]


class Candidate(NamedTuple):
    """A search candidate: id and score, and its whole record when the search read it.
    A search with hundreds of candidates (hybrid) reads ids and scores only: their texts
    would cost ~3 ms more per list on one conversation of 205 chunks
    (benchmarks/archive/2026-11-25.md, Speed v3), even their content hashes ~1.7 ms
    (benchmarks/archive/2026-11-28.md); the records of the few returned are read
    afterwards, unless recently read ones with the content the log holds are at hand. One
    with few (dense or keyword alone) reads whole records, which saves that second round
    trip."""

    chunk_id: str
    score: float
    stored: StoredChunk | None = None


@dataclass(frozen=True)
class ServerDescription:
    """What serves: shown in GetIndexStatus and memsvc_build_info."""

    version: str
    model: str
    model_fallback: bool
    dim: int
    embed_backend: str  # onnx | torch | openai
    log_backend: str  # sqlite | postgres
    model_notice: str = ""  # ModelInfo.notice
    # A model move in progress (memsvc.services.model_move), else None.
    model_move: ModelMoveStatus | None = None
    # A store in shards: (shards loaded in memory, shards); None for one collection.
    store_shards: tuple[int, int] | None = None


@dataclass(frozen=True)
class ModelMoveStatus:
    """A model move's progress, as GetIndexStatus reports it."""

    from_model: str
    from_collection: str
    to_collection: str
    conversations: int
    left: int
    previous_model_serves: bool
