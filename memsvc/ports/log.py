"""The event log's interfaces: reads in a snapshot, writes in a transaction (memsvc.ports
explains the convention)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from memsvc.domain.bm25 import Tenants
from memsvc.domain.chunking import StoredTurn
from memsvc.domain.records import Conversation, EventRow, LayoutRow

# An inclusive span of turn ids.
Span = tuple[int, int]


class LogReader(Protocol):
    """Queries of one consistent view of the event log (a snapshot or a transaction)."""

    def get_meta(self, key: str) -> str | None: ...

    def meta_with_prefix(self, prefix: str) -> dict[str, str]: ...

    def clock(self) -> float:
        """The database's time (unix seconds): one clock for every process sharing the log,
        whatever each machine's own says."""
        ...

    # events
    def term_frequencies(
        self, tenants: Tenants, term_ids: Sequence[int]
    ) -> tuple[int, dict[int, int]]:
        """Keyword statistics over these tenants (memsvc.domain.bm25): (live turns, {term:
        live turns holding it})."""
        ...

    def events(self, conversation_id: str, turn_ids: Iterable[int]) -> dict[int, EventRow]: ...

    def events_after(self, conversation_id: str, after_turn: int, limit: int) -> list[EventRow]:
        """Up to `limit` live (not deleted) events with turn_id > `after_turn`, in turn order."""
        ...

    def nth_newest_live_turn(self, conversation_id: str, n: int) -> int | None:
        """The turn_id of the `n`-th newest live event (n >= 1; None: fewer live events)."""
        ...

    def seq_through(self, conversation_id: str, turn_id: int) -> int | None:
        """The latest work sequence number among the turns up to `turn_id` (None: that turn
        was never written)."""
        ...

    def turn_stats(self, conversation_id: str) -> tuple[int, int, int]:
        """(min turn_id, max turn_id, count) over all stored events, deleted included."""
        ...

    def live_turns(self, conversation_id: str, from_turn: int | None = None) -> list[StoredTurn]:
        """Non-deleted turns with text after cleaning, in turn order (those from
        `from_turn` on, when given)."""
        ...

    def live_turn_before(self, conversation_id: str, turn_id: int, n: int) -> int | None:
        """The `n`-th live turn with text before `turn_id`, counting back (None: fewer)."""
        ...

    def first_turn_written_since(self, conversation_id: str, seq: int) -> int | None:
        """The first turn id among events written, deleted or purged by a change after
        work sequence number `seq` (None: none)."""
        ...

    def live_turn_count(self, conversation_id: str) -> int: ...

    def deleted_turn_ids(self, conversation_id: str, from_turn: int | None = None) -> list[int]:
        """Deleted turns in turn order (those from `from_turn` on, when given)."""
        ...

    def conversations(self) -> list[str]:
        """Conversations with events."""
        ...

    def conversations_with_deleted(self) -> list[str]:
        """Conversations with deleted turns not yet purged, or deleted layout rows."""
        ...

    def holds_deleted(self, conversation_id: str) -> bool:
        """Whether this conversation has deleted turns not yet purged, or deleted layout
        rows (one conversation's rows read, not every conversation's)."""
        ...

    def event_texts(self) -> list[tuple[str, int, str]]:
        """(conversation, turn, clean text) of every event."""
        ...

    def event_texts_after(
        self, conversation_id: str, turn_id: int, limit: int
    ) -> list[tuple[str, int, str, str]]:
        """(conversation, turn, text as sent, clean text) of up to `limit` events after
        (conversation_id, turn_id) in key order: every event, a page at a time."""
        ...

    # conversations: versions and projection work
    def conversation(self, conversation_id: str) -> Conversation | None: ...

    def conversation_ids(self, prefixes: Sequence[str] = ()) -> list[str]:
        """Conversations with a row (events or work), all or those under the prefixes."""
        ...

    def unreconciled(self, conversation_ids: Sequence[str] = ()) -> list[str]:
        """Of those named (none: every one), the conversations whose last reconcile is not
        done yet, sorted."""
        ...

    def reconcile_counts(self) -> tuple[int, int]:
        """(conversations, of them not yet reconciled)."""
        ...

    def active_versions_of_multi(
        self, conversation_ids: Sequence[str] = ()
    ) -> dict[int, list[str]]:
        """Conversations with chunks of several versions, by the version searches read."""
        ...

    # layout
    def layout(
        self, conversation_id: str, version: int, from_turn: int | None = None
    ) -> dict[str, LayoutRow]:
        """The version's layout rows (those starting at `from_turn` or later, when given),
        deleted ones included."""
        ...

    def conversation_layout(self, conversation_id: str) -> dict[str, LayoutRow]:
        """Every layout row of a conversation, all versions, deleted ones included."""
        ...

    def layout_rows(self, chunk_ids: Sequence[str]) -> dict[str, LayoutRow]: ...

    def may_hold_standing(self, conversation_ids: Sequence[str] = ()) -> bool:
        """Whether a layout row of these conversations (of any, given none), of any version,
        deleted or not, is or may be a standing instruction."""
        ...

    def standing_conversations(self, prefixes: Sequence[str], limit: int) -> list[str]:
        """Conversations (under `prefixes`, if any) with a layout row that is or may be a
        standing instruction, at most `limit` of them."""
        ...

    def layout_hashes(self, conversation_ids: Sequence[str], limit: int) -> list[tuple[str, str]]:
        """(chunk id, content hash) of these conversations' layout rows not deleted, of any
        version, at most `limit` of them."""
        ...

    def layout_versions(self, conversation_id: str) -> list[int]: ...

    def first_unindexed_turn(self, conversation_id: str, version: int) -> int | None:
        """The first turn of a live layout row of the version not in the store (None: all)."""
        ...

    def first_turn_to_render(self, conversation_id: str, version: int) -> int | None:
        """The first turn of a live layout row of the version a replan renders again: not
        in the store, or written before content hashes were kept (None: none)."""
        ...

    def history_spans(self, conversation_id: str, chunk_ids: Sequence[str]) -> dict[str, Span]:
        """Turn spans of any chunk ids the conversation ever had (superseded ones too)."""
        ...

    # superseded tails, pending erasures
    def superseded_among(self, chunk_ids: Sequence[str]) -> set[str]: ...

    def pending_superseded(self, conversation_id: str) -> list[str]: ...

    def layout_digests(
        self, conversation_ids: Sequence[str] | None = None
    ) -> dict[str, tuple[str, str, bool, bool]]:
        """Every layout row (or those of the conversations named), lightly: chunk id ->
        (conversation id, content hash, deleted, indexed); and the superseded tails awaiting
        removal are `waiting_superseded`."""
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

    def claim_key(
        self, key: str, request_hash: str, expire_before: float
    ) -> tuple[str, str] | None:
        """A keyed write's key, claimed for this transaction: None when it is new (the
        caller writes, then `answer_key`), else (its request hash, its answer) as the first
        write recorded them. A concurrent claim of the same key waits for this transaction.
        Keys created before `expire_before` (the log's clock) are forgotten first."""
        ...

    def answer_key(self, key: str, answer: str) -> None:
        """Record the answer of the write that claimed `key` in this transaction."""
        ...

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
        """(tokens, conversation, turn) rows; every layout is planned whole next time."""
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

    def sync_lazily(self) -> None:
        """From now on, this thread's commits return before they are on disk: for work
        that is redone when its record is lost (the index worker's). A power failure can
        lose the last of them and nothing else: the log is written in order, so the next
        commit that waits for the disk (every call's) takes them with it."""
        ...

    def close(self) -> None: ...
