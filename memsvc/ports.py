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
from memsvc.domain.model_identity import ModelIdentity
from memsvc.domain.records import (
    Candidate,
    Conversation,
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

    def meta_with_prefix(self, prefix: str) -> dict[str, str]: ...

    # events
    def events(self, conversation_id: str, turn_ids: Iterable[int]) -> dict[int, EventRow]: ...

    def events_after(self, conversation_id: str, after_turn: int, limit: int) -> list[EventRow]:
        """Up to `limit` live (not deleted) events with turn_id > `after_turn`, in turn order."""
        ...

    def seq_through(self, conversation_id: str, turn_id: int) -> int | None:
        """The latest work sequence number among the turns up to `turn_id` (None: that turn
        was never written)."""
        ...

    def turn_stats(self, conversation_id: str) -> tuple[int, int, int]:
        """(min turn_id, max turn_id, count) over all stored events, deleted included."""
        ...

    def live_turns(self, conversation_id: str) -> list[StoredTurn]:
        """Non-deleted turns with text after cleaning, in turn order."""
        ...

    def live_turn_count(self, conversation_id: str) -> int: ...

    def deleted_turn_ids(self, conversation_id: str) -> list[int]: ...

    def conversations(self) -> list[str]:
        """Conversations with events."""
        ...

    def conversations_with_deleted(self) -> list[str]:
        """Conversations with deleted turns not yet purged, or deleted layout rows."""
        ...

    def event_texts(self) -> list[tuple[str, int, str]]:
        """(conversation, turn, clean text) of every event."""
        ...

    # conversations: versions and projection work
    def conversation(self, conversation_id: str) -> Conversation | None: ...

    def conversation_ids(self, prefixes: Sequence[str] = ()) -> list[str]:
        """Conversations with a row (events or work), all or those under the prefixes."""
        ...

    def active_versions_of_multi(
        self, conversation_ids: Sequence[str] = ()
    ) -> dict[int, list[str]]:
        """Conversations with chunks of several versions, by the version searches read."""
        ...

    # layout
    def layout(self, conversation_id: str, version: int) -> dict[str, LayoutRow]: ...

    def conversation_layout(self, conversation_id: str) -> dict[str, LayoutRow]:
        """Every layout row of a conversation, all versions, deleted ones included."""
        ...

    def layout_rows(self, chunk_ids: Sequence[str]) -> dict[str, LayoutRow]: ...

    def layout_versions(self, conversation_id: str) -> list[int]: ...

    def first_unindexed_turn(self, conversation_id: str, version: int) -> int | None:
        """The first turn of a live layout row of the version not in the store (None: all)."""
        ...

    def history_spans(self, conversation_id: str, chunk_ids: Sequence[str]) -> dict[str, Span]:
        """Turn spans of any chunk ids the conversation ever had (superseded ones too)."""
        ...

    # superseded tails, pending erasures
    def superseded_among(self, chunk_ids: Sequence[str]) -> set[str]: ...

    def pending_superseded(self, conversation_id: str) -> list[str]: ...

    def layout_digests(self) -> dict[str, tuple[str, str, bool, bool]]:
        """Every layout row, lightly: chunk id -> (conversation id, content hash, deleted,
        indexed); and the superseded tails awaiting removal are `waiting_superseded`."""
        ...

    def all_waiting_superseded(self) -> set[str]: ...

    def waiting_superseded(self, chunk_ids: Sequence[str]) -> set[str]:
        """Those of the ids that are superseded tails not yet removed from the store."""
        ...

    def erasures(self) -> list[str]:
        """Text hashes whose cached vectors a purge must still forget."""
        ...


class LogWriter(LogReader, Protocol):
    """A write transaction on the event log (all-or-nothing, one writer at a time)."""

    def set_meta(self, key: str, value: str) -> None: ...

    def delete_meta(self, key: str) -> None: ...

    def savepoint(self) -> AbstractContextManager[None]:
        """A nested all-or-nothing part: an exception inside undoes only this part."""
        ...

    # conversations: every log change the store must reflect records its work here
    def open_conversation(self, conversation_id: str, version: int) -> Conversation:
        """The conversation's row, created with `version` active if it has none."""
        ...

    def record_change(
        self,
        conversation_id: str,
        *,
        turns: int = 0,
        reconcile: bool = False,
        delay_s: float = 0.0,
    ) -> int:
        """New projection work; returns the sequence number the change's events carry."""
        ...

    def set_planned(self, conversation_id: str, version: int, seq: int) -> None: ...

    def start_building(self, conversation_id: str, version: int) -> None: ...

    def stop_building(self, conversation_id: str) -> None: ...

    def switch_version(self, conversation_id: str) -> None: ...

    def settle(
        self,
        conversation_id: str,
        *,
        done_seq: int,
        reconciled_seq: int,
        progress_seq: int,
        last_indexed_turn: int,
    ) -> Conversation: ...

    def forget_conversation(self, conversation_id: str) -> None: ...

    # events
    def put_events(self, events: Iterable[EventRow], seq: int) -> None: ...

    def mark_events_deleted(
        self, conversation_id: str, spans: Sequence[Span] | None, seq: int
    ) -> int:
        """Marks the events in the spans (None = every turn) deleted; returns how many."""
        ...

    def purge_events(self, conversation_id: str, seq: int) -> list[int]:
        """Erases the text of deleted turns (tombstones stay); returns the turns erased."""
        ...

    def set_tokens(self, rows: Iterable[tuple[int, str, int]]) -> None:
        """(tokens, conversation, turn) rows."""
        ...

    # layout
    def put_layout(self, rows: Iterable[LayoutRow]) -> None: ...

    def record_texts(self, conversation_id: str, rows: Iterable[tuple[str, int, int]]) -> None:
        """(text hash, start turn, end turn) of texts embedded for a conversation's chunks
        besides their own texts (a turn's head and gist): a purge of those turns forgets
        their cached vectors too."""
        ...

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

    def unmark_indexed(self, chunk_ids: Iterable[str]) -> None: ...

    def reset_indexed(self, conversation_id: str, version: int) -> None: ...

    def forget_store(self) -> None:
        """The vector store changed (new collection or model): nothing in it is known."""
        ...

    # superseded tails, pending erasures
    def add_superseded(self, conversation_id: str, chunk_ids: Iterable[str]) -> None: ...

    def clear_superseded(self, chunk_ids: Iterable[str]) -> None: ...

    def superseded_done(self, chunk_ids: Iterable[str]) -> None: ...

    def add_erasures(self, text_hashes: Iterable[str]) -> None: ...

    def clear_erasures(self, text_hashes: Iterable[str]) -> None: ...


class EventLog(Protocol):
    """The durable event log: the only source of truth."""

    def snapshot(self) -> AbstractContextManager[LogReader]: ...

    def transaction(self) -> AbstractContextManager[LogWriter]: ...

    def erase(self) -> None:
        """Leave no deleted content in the log's files (after a purge; at a clean stop)."""
        ...

    def ping(self) -> bool:
        """Whether the log answers (a database can go away; a file does not)."""
        ...

    def close(self) -> None: ...


class IndexQueue(Protocol):
    """Conversations with projection work, leased by workers with expiry and fencing."""

    def lease(
        self, now: float | None, lease_s: float, limit: int, owner: str = ""
    ) -> list[QueueItem]:
        """`now`: the caller's clock, or None for the database's. Nothing while paused:
        the flag is read in the lease's own transaction, so no lease begins after a
        pause has committed, in any process sharing the log."""
        ...

    def paused(self) -> bool: ...

    def set_paused(self, paused: bool) -> None:
        """Durable and shared by every process on the log; a pause waits for a lease
        being taken to commit, so `leased()` right after it sees every step in flight."""
        ...

    def renew(
        self, items: Sequence[QueueItem], lease_s: float, now: float | None = None
    ) -> int: ...

    def complete(
        self, item: QueueItem, retry_in_s: float = 0.0, now: float | None = None
    ) -> str | None:
        """Returns the new state, None if the lease was lost."""
        ...

    def fail(
        self,
        item: QueueItem,
        error: str,
        max_attempts: int,
        backoff_s: float,
        now: float | None = None,
    ) -> None: ...

    def release(self, item: QueueItem) -> None:
        """Hand a lease back untouched: pending again, no attempt counted."""
        ...

    def release_owned(self, owner: str) -> int: ...

    def release_stale_leases(self) -> int:
        """Leases held by a process that is gone go back to pending."""
        ...

    def status(
        self, conversation_ids: Sequence[str] = (), prefixes: Sequence[str] = ()
    ) -> list[QueueItem]: ...

    def gauges(self) -> QueueGauges: ...

    def leased(self) -> int:
        """Conversations under a live lease, by any process sharing the log."""
        ...


class WriterLocks(Protocol):
    """One writer per conversation, across every process sharing the log: every change
    to a conversation's layout or stored chunks runs while holding its lock (re-entrant
    within a thread). No lock outlives a stuck holder, and no waiter waits past its
    bound: ConversationBusy then."""

    def hold(
        self, conversation_id: str, wait_s: float | None = None
    ) -> AbstractContextManager[None]:
        """Wait at most `wait_s` (None: the lock's default wait, MEMSVC_WRITER_WAIT_S),
        and never past the current call's deadline; then ConversationBusy."""
        ...

    def ensure(self, conversation_id: str) -> None:
        """Raise if this holder has lost the lock (its database connection died): called
        just before each store write, so a writer that lost it stops writing."""
        ...


class Notifier(Protocol):
    """Wakes idle index workers and WaitForIndexed callers when work arrives or ends."""

    def notify(self) -> None: ...

    def wait(self, timeout_s: float) -> None: ...


# -- embeddings -------------------------------------------------------------------------------
class Embedder(Protocol):
    """Texts to L2-normalised float32 vectors, and the model's token counts: a model in
    this process or a remote embedding server."""

    info: ModelInfo
    batch_size: int
    identity: ModelIdentity  # provider, name, dimension, fingerprint of what it writes

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    @property
    def tokenizer_id(self) -> str: ...

    def available(self) -> bool:
        """False while a remote server is known to be failing (its circuit open): index
        steps wait for it rather than spend attempts."""
        ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]: ...

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray: ...

    def probe(self, texts: Sequence[str]) -> np.ndarray:
        """Passage vectors for the model identity's probe texts, left out of the counters
        of callers' work (a restart embeds them and nothing else)."""
        ...

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

    def forget_model(self, model: str) -> int:
        """Drop every vector kept under `model` (another model now answers to the name)."""
        ...

    def erase(self) -> None:
        """Leave no forgotten vector in the cache's files."""
        ...

    def close(self) -> None: ...


# -- the vector store -------------------------------------------------------------------------
@dataclass(frozen=True)
class SearchScope:
    """Which stored chunks a search may return: the request's filters (in normal form),
    the conversation-id prefixes a limited token spans, and, for a store that does not
    mark its current chunks, the version each conversation with several reads."""

    filters: SearchFilters = field(default_factory=SearchFilters)
    prefixes: tuple[str, ...] = ()
    versions_of_multi: Mapping[int, Sequence[str]] = field(default_factory=dict)


class ChunkStore(Protocol):
    """The vector store: a projection of the event log's layout. Queries are named for
    their intent; no service writes the store's query language."""

    @property
    def up(self) -> bool: ...

    @property
    def identity(self) -> str:
        """Names the collection and the vectors it holds (model, dimension)."""
        ...

    @property
    def marks_current(self) -> bool:
        """Rows carry `current` (of the conversation's active version): default searches
        filter on it. Else searches pass `SearchScope.versions_of_multi`."""
        ...

    def ping(self) -> bool: ...

    def mark_down(self, exc: BaseException | None = None) -> None: ...

    def reconnect(self) -> bool: ...

    def close(self, erase: bool = False) -> None:
        """`erase`: leave no deleted rows in the store's files (Milvus Lite) on the way out."""
        ...

    def compact(self) -> None:
        """Ask the store to drop deleted rows physically where it can while running."""
        ...

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

    def digests(self) -> dict[str, tuple[str, str, bool]]:
        """Every row, lightly: chunk id -> (conversation id, content hash, deleted)."""
        ...

    def search_dense(
        self, vector: np.ndarray, scope: SearchScope, limit: int, whole: bool = False
    ) -> list[Candidate]:
        """The nearest chunks in scope: ids, scores and content hashes, and whole records
        when `whole`."""
        ...

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

    def set_current(self, chunks: Sequence[StoredChunk], current: bool) -> None:
        """Rewrite rows (read with their vectors) with the current mark given."""
        ...


class StoreSupervisor(Protocol):
    """Watches the store and tells listeners when it goes down or comes back."""

    def on_change(self, listener: Callable[[bool], None]) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...
