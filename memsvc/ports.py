"""The interfaces the services use. Storage (SQLite, Milvus) and embedding implement them;
the composition root (memsvc.app) picks the implementations. Services never import a
storage or embedding module, so a new backend is new files under memsvc/storage plus one
line in memsvc/app.py.

Transaction convention: every read of the event log runs inside `log.snapshot()` and every
write inside `log.transaction()`; the object each yields carries the queries. Methods of
that object never open a transaction of their own. The index queue's own operations
(lease, complete, ...) each run in one transaction inside the queue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from memsvc.domain.chunking import StoredTurn
from memsvc.domain.records import (
    Candidate,
    EventRow,
    LayoutRow,
    ModelInfo,
    QueueGauges,
    QueueItem,
    StoredChunk,
)
from memsvc.domain.types import SearchFilters

# An inclusive span of turn ids.
Span = tuple[int, int]


# -- the event log --------------------------------------------------------------------------
class LogReader(Protocol):
    """Queries of one consistent view of the event log (a snapshot or a transaction)."""

    def get_meta(self, key: str) -> str | None: ...

    # events
    def events(self, conversation_id: str, turn_ids: Iterable[int]) -> dict[int, EventRow]: ...

    def turn_stats(self, conversation_id: str) -> tuple[int, int, int]:
        """(min turn_id, max turn_id, count) over all stored events, deleted included."""
        ...

    def live_turns(self, conversation_id: str) -> list[StoredTurn]:
        """Non-deleted turns with text after cleaning, in turn order."""
        ...

    def live_turn_count(self, conversation_id: str) -> int: ...

    def deleted_turn_ids(self, conversation_id: str) -> list[int]: ...

    def conversations(self) -> list[str]: ...

    def conversations_with_deleted(self) -> list[str]:
        """Conversations with deleted turns not yet purged, or deleted layout rows."""
        ...

    def event_texts(self) -> list[tuple[str, int, str]]:
        """(conversation, turn, clean text) of every event."""
        ...

    # layout
    def layout(self, conversation_id: str, version: int) -> dict[str, LayoutRow]: ...

    def conversation_layout(self, conversation_id: str) -> dict[str, LayoutRow]:
        """Every layout row of a conversation, all versions, deleted ones included."""
        ...

    def layout_rows(self, chunk_ids: Sequence[str]) -> dict[str, LayoutRow]: ...

    def layout_versions(self, conversation_id: str) -> list[int]: ...

    # superseded tails
    def superseded_among(self, chunk_ids: Sequence[str]) -> set[str]: ...

    def pending_superseded(self, conversation_id: str) -> list[str]: ...

    # chunk versions present in the store
    def complete_versions(self, conversation_id: str) -> list[int]: ...

    def multi_version_latest(self, conversation_ids: Sequence[str] = ()) -> dict[str, int]:
        """Newest complete version of each conversation that has several versions stored."""
        ...

    # the index queue's row of a conversation
    def queued_version(self, conversation_id: str) -> int | None: ...


class LogWriter(LogReader, Protocol):
    """A write transaction on the event log (all-or-nothing, one writer at a time)."""

    def set_meta(self, key: str, value: str) -> None: ...

    def savepoint(self) -> AbstractContextManager[None]:
        """A nested all-or-nothing part: an exception inside undoes only this part."""
        ...

    # events
    def put_events(self, events: Iterable[EventRow]) -> None: ...

    def mark_events_deleted(self, conversation_id: str, spans: Sequence[Span] | None) -> int:
        """Marks the events in the spans (None = every turn) deleted; returns how many."""
        ...

    def purge_events(self, conversation_id: str) -> list[int]:
        """Erases the text of deleted turns (tombstones stay); returns the turns erased."""
        ...

    def set_tokens(self, rows: Iterable[tuple[int, str, int]]) -> None:
        """(tokens, conversation, turn) rows."""
        ...

    # layout
    def put_layout(self, rows: Iterable[LayoutRow]) -> None: ...

    def mark_layout_deleted(self, chunk_ids: Iterable[str]) -> None: ...

    def drop_layout(self, chunk_ids: Iterable[str]) -> None: ...

    def drop_layout_version(self, conversation_id: str, version: int) -> None: ...

    def purge_layout(self, conversation_id: str, purged_turns: Sequence[int]) -> set[str]:
        """Drops deleted layout rows and the text history of chunks over purged turns;
        returns those chunks' text hashes (their cached vectors go too)."""
        ...

    def mark_indexed(self, pairs: Iterable[tuple[str, str]]) -> None:
        """(chunk_id, text_hash) now in the vector store with that text."""
        ...

    def reset_indexed(self, conversation_id: str, version: int) -> None: ...

    def forget_store(self) -> None:
        """The vector store changed (new collection or model): nothing in it is known."""
        ...

    # superseded tails
    def add_superseded(self, conversation_id: str, chunk_ids: Iterable[str]) -> None: ...

    def clear_superseded(self, chunk_ids: Iterable[str]) -> None: ...

    def superseded_done(self, chunk_ids: Iterable[str]) -> None: ...

    # chunk versions present in the store
    def add_store_versions(self, pairs: Iterable[tuple[str, int]], complete: bool) -> None: ...

    def remove_store_version(self, conversation_id: str, version: int) -> None: ...

    # the index queue's rows
    def enqueue(
        self, conversation_id: str, dirty: int, chunk_version: int, reindex: bool = False
    ) -> None:
        """New work for a conversation; a failed one is retried from scratch."""
        ...

    def stop_reindex(self, conversation_id: str, version: int) -> None: ...

    def advance_indexed(self, conversation_id: str) -> None:
        """Chunks were stored outside the worker: move the indexed watermark up."""
        ...


class EventLog(Protocol):
    """The durable event log: the only source of truth."""

    def snapshot(self) -> AbstractContextManager[LogReader]: ...

    def transaction(self) -> AbstractContextManager[LogWriter]: ...

    def close(self) -> None: ...


class IndexQueue(Protocol):
    """What the background worker has to do, per conversation, leased with expiry."""

    def lease(self, now: float, lease_s: float, limit: int) -> list[QueueItem]: ...

    def complete(self, conversation_id: str, indexed_turn: int, again: bool = False) -> None: ...

    def fail(
        self, conversation_id: str, error: str, now: float, max_attempts: int, backoff_s: float
    ) -> None: ...

    def release(self, conversation_id: str) -> None:
        """Hand a lease back untouched: pending again, no attempt counted."""
        ...

    def release_stale_leases(self) -> int:
        """Leases held by a process that is gone go back to pending."""
        ...

    def status(self, conversation_ids: Sequence[str] = ()) -> list[QueueItem]: ...

    def gauges(self) -> QueueGauges: ...


class WriterLocks(Protocol):
    """One writer per conversation: every change to a conversation's layout or stored
    chunks runs while holding its lock (re-entrant within a thread)."""

    def hold(self, conversation_id: str) -> AbstractContextManager[None]: ...


class Notifier(Protocol):
    """Wakes idle index workers and WaitForIndexed callers when work arrives or ends."""

    def notify(self) -> None: ...

    def wait(self, timeout_s: float) -> None: ...


# -- embeddings -------------------------------------------------------------------------------
class Embedder(Protocol):
    """Texts to L2-normalised float32 vectors, and the model's token counts."""

    info: ModelInfo
    batch_size: int

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    @property
    def tokenizer_id(self) -> str: ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]: ...

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray: ...

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray: ...


class QueryEncoder(Protocol):
    """One query's vector (concurrent queries may share a forward pass)."""

    def encode(self, text: str) -> np.ndarray: ...

    def close(self) -> None: ...


class EmbeddingCache(Protocol):
    """Passage vectors by (model, text hash): unchanged text never runs the model again."""

    def get_many(self, model: str, hashes: Sequence[str]) -> dict[str, np.ndarray]: ...

    def put_many(self, model: str, items: Mapping[str, np.ndarray]) -> None: ...

    def forget(self, hashes: Sequence[str]) -> None:
        """Erase the vectors of these texts, for every model (privacy purge)."""
        ...

    def close(self) -> None: ...


# -- the vector store -------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchScope:
    """Which stored chunks a search may return: the request's filters, and for each
    conversation with several versions stored, the version it reads (the others read the
    one they have)."""

    filters: SearchFilters = field(default_factory=SearchFilters)
    newest_of_multi: Mapping[str, int] = field(default_factory=dict)


class ChunkStore(Protocol):
    """The vector store: a projection of the event log's layout. Queries are named for
    their intent; no service writes the store's query language."""

    @property
    def up(self) -> bool: ...

    def ping(self) -> bool: ...

    def mark_down(self, exc: BaseException | None = None) -> None: ...

    def reconnect(self) -> bool: ...

    def close(self) -> None: ...

    # reads
    def get(self, chunk_ids: Sequence[str], with_vectors: bool = False) -> dict[str, StoredChunk]:
        """The records with these ids (missing ids are absent)."""
        ...

    def chunks_of(
        self,
        conversation_id: str | None,
        *,
        deleted: bool | None = False,
        version: int | None = None,
        with_vectors: bool = False,
    ) -> list[StoredChunk]:
        """Every chunk of a conversation (None: of all), live only (`deleted=False`),
        deleted only (`True`) or both (`None`), of one version or all."""
        ...

    def live_overlapping(
        self, conversation_id: str, spans: Sequence[Span] | None, with_vectors: bool = False
    ) -> list[StoredChunk]:
        """Live chunks of a conversation covering any turn of the spans (None: all)."""
        ...

    def count(self, *, deleted: bool | None = None) -> int: ...

    def search_dense(
        self, vector: np.ndarray, scope: SearchScope, limit: int, whole: bool = False
    ) -> list[Candidate]: ...

    def search_keyword(
        self, text: str, scope: SearchScope, limit: int, whole: bool = False
    ) -> list[Candidate]: ...

    # writes
    def upsert(self, chunks: Sequence[StoredChunk]) -> None:
        """Insert or replace whole rows by chunk id."""
        ...

    def delete(self, chunk_ids: Sequence[str]) -> None: ...

    def set_deleted(self, chunks: Sequence[StoredChunk]) -> None:
        """Rewrite rows (read with their vectors) with deleted = true."""
        ...


class StoreSupervisor(Protocol):
    """Watches the store and tells listeners when it goes down or comes back."""

    def on_change(self, listener: Callable[[bool], None]) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...
