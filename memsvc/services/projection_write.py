"""The write step of the projection (memsvc.services.projection): records the server
authored are embedded outside any lock, checked again against the layout under the
conversation's writer lock, and written; anything else is a per-record error. Mixed into
Projector, whose `settle` runs after each conversation's write."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace

import numpy as np

from memsvc.domain.errors import ConversationBusy
from memsvc.domain.hashing import content_hash, text_hash
from memsvc.domain.records import Conversation, StoredChunk, TurnLines
from memsvc.domain.types import (
    REASON_BUSY,
    REASON_DELETED,
    REASON_MISMATCH,
    REASON_SUPERSEDED,
    REASON_TOO_LONG,
    REASON_UNKNOWN,
    ChunkRecord,
    RecordError,
    UpsertResult,
)
from memsvc.observability import metrics
from memsvc.observability.metrics import stage
from memsvc.ports import ChunkStore, Embedder, EventLog, WriterLocks
from memsvc.services.vectors import ChunkVectors


@dataclass
class _Counts:
    upserted: int = 0
    updated: int = 0
    unchanged: int = 0
    retired: int = 0


@dataclass(frozen=True)
class _Write:
    """One store_records call's embedded records, by conversation, and its tallies."""

    by_conv: dict[str, list[ChunkRecord]]
    vectors: dict[str, np.ndarray]  # by chunk id
    lines: dict[str, TurnLines]  # by chunk id, of chunks spanning several turns
    errors: list[RecordError]
    counts: _Counts
    lacking: bool  # the layout says the store lacks these records


class RecordWrites:
    log: EventLog
    store: ChunkStore
    embedder: Embedder
    locks: WriterLocks
    vectors: ChunkVectors

    def settle(self, conversation_id: str) -> Conversation | None:
        raise NotImplementedError  # Projector's

    # -- write ----------------------------------------------------------------------------
    def store_records(
        self, records: Sequence[ChunkRecord], errors: list[RecordError], lacking: bool = False
    ) -> UpsertResult:
        """Embed and store server-authored records; anything else is a per-record error.
        Then each conversation written is settled. `lacking`: the records are ones the
        log's layout says the store lacks (a plan's pending chunks), so the store is not
        read for them (two Milvus calls of an index step's five, 2.5-5 ms each whatever the
        conversation's size): each is written, an upsert of what a crash may have stored
        already being harmless."""
        try:
            return self._store_records(records, errors, lacking)
        except Exception as exc:
            metrics.count_failed_write(exc, len(records))
            raise

    def _store_records(
        self, records: Sequence[ChunkRecord], errors: list[RecordError], lacking: bool
    ) -> UpsertResult:
        with stage("write", "check"):
            epoch = self.vectors.erasure_epoch()
            stored: set[str] = set()  # stored by another writer since the plan
            authored = self._authored(records, errors, stored)
        # The model is the slow part: embed before taking any lock. Texts already stored
        # with identical content need no vector; the cache makes the rest cheap on replays
        # (a plan's chunk stored before a crash let the log mark it, say).
        need = [r for r in authored if r.chunk_id not in stored] if lacking else authored
        if not lacking:
            with stage("write", "read"):
                existing = self.store.get(
                    [r.chunk_id for r in authored],
                    conversations={r.metadata.conversation_id for r in authored},
                )
            need = [r for r in authored if not _holds(existing.get(r.chunk_id), r)]
        checked = len(errors)
        with stage("write", "tokens"):
            need = self._drop_too_long(need, errors)
        with stage("write", "embed"):
            # Turn lines first: their forward pass caches the windows' vectors for `of`.
            lines: dict[str, TurnLines] = {}
            if self.store.keeps_turn_lines:
                lines = self.vectors.turn_lines(need, epoch)
            vectors = self.vectors.of(need, errors, epoch)
        refused = {e.chunk_id for e in errors[checked:]}
        authored = [r for r in authored if r.chunk_id not in refused]
        counts = _Counts()
        by_conv: dict[str, list[ChunkRecord]] = {}
        for r in authored:
            by_conv.setdefault(r.metadata.conversation_id, []).append(r)
        write = _Write(by_conv, vectors, lines, errors, counts, lacking)
        # Every conversation no other writer holds now is written together: one store
        # call per shard for all of them, not two per conversation (an index step's
        # conversations). Its locks are taken without waiting, so this writer never waits
        # while holding one (no lock order to get wrong); a conversation another writer
        # holds is written alone afterwards, after waiting for it as any writer does.
        taken: list[str] = []
        with ExitStack() as held:
            free = []
            for conv in sorted(by_conv):
                try:
                    held.enter_context(self.locks.hold(conv, wait_s=0.0))
                    free.append(conv)
                except ConversationBusy:
                    taken.append(conv)
            if free:
                self._write(free, write)
        for conv in taken:
            try:
                with self.locks.hold(conv):
                    self._write([conv], write)
            except ConversationBusy as exc:  # the other conversations are written
                errors += [RecordError(r.chunk_id, str(exc), REASON_BUSY) for r in by_conv[conv]]
        for outcome in ("upserted", "updated", "unchanged"):
            metrics.CHUNKS_WRITTEN.labels(outcome).inc(getattr(counts, outcome))
        metrics.count_upsert_failures([e.reason for e in errors])
        return UpsertResult(
            counts.upserted, counts.updated, counts.unchanged, counts.retired, errors
        )

    def _authored(
        self,
        records: Sequence[ChunkRecord],
        errors: list[RecordError],
        indexed: set[str],
    ) -> list[ChunkRecord]:
        """The records that equal what the layout holds for their ids now; `indexed`
        gets those of them the layout marks stored."""
        ids = [r.chunk_id for r in records]
        with self.log.snapshot() as r:
            layout = r.layout_rows(ids)
            superseded = r.superseded_among(ids)
        ok: list[ChunkRecord] = []
        for rec in records:
            row = layout.get(rec.chunk_id)
            if row is None:
                if rec.chunk_id in superseded:
                    errors.append(
                        RecordError(
                            rec.chunk_id,
                            "stale: superseded by a later build of its conversation",
                            REASON_SUPERSEDED,
                        )
                    )
                else:
                    errors.append(
                        RecordError(
                            rec.chunk_id,
                            "unknown chunk id: not built by this server for its conversation"
                            " and version (BuildIncrementalChunks builds chunks)",
                            REASON_UNKNOWN,
                        )
                    )
            elif row.deleted:
                errors.append(
                    RecordError(
                        rec.chunk_id,
                        "stale: the chunk covers a deleted turn; it is not restored",
                        REASON_DELETED,
                    )
                )
            elif row.content_hash != content_hash(rec):
                errors.append(
                    RecordError(
                        rec.chunk_id,
                        "text or metadata differ from the chunk the server built for this id"
                        " (stale after an edit, or changed by the caller): build again and"
                        " upsert what the build returns",
                        REASON_MISMATCH,
                    )
                )
            else:
                ok.append(rec)
                if row.indexed:
                    indexed.add(rec.chunk_id)
        return ok

    def _write(self, convs: list[str], w: _Write) -> None:
        """Under the locks of `convs`: check authorship again, write, bookkeep, settle. A
        chunk of the active version is written `current` (what default searches read)."""
        stored: set[str] = set()
        with stage("write", "bookkeep"):
            records = self._authored([r for c in convs for r in w.by_conv[c]], w.errors, stored)
            with self.log.snapshot() as view:
                active = {c: _active_version(view.conversation(c)) for c in convs}
        existing: dict[str, StoredChunk] = {}
        if not w.lacking:  # else the layout says the store lacks them: nothing to compare
            with stage("write", "read"):
                existing = self.store.get([r.chunk_id for r in records], conversations=convs)
        writes: list[StoredChunk] = []
        stale: set[str] = set()
        for r in records:
            old = existing.get(r.chunk_id)
            current = r.metadata.chunk_version == active[r.metadata.conversation_id]
            if _holds(old, r) and old is not None and old.current == current:
                w.counts.unchanged += 1
                continue
            if w.lacking and r.chunk_id in stored:
                # Another writer stored it since the plan (a call and the worker both
                # writing a delete's new neighbours): writing it again is not harmless on
                # Milvus Lite 2.5.1, where an upsert is a delete then an insert that a
                # search between them sees as neither (a row read as absent 235 times in
                # 2,000 queries beside a loop upserting it unchanged).
                w.counts.unchanged += 1
                continue
            live = replace(r, metadata=replace(r.metadata, deleted=False))
            vector = w.vectors.get(r.chunk_id)
            if vector is None:  # stored before, changed by a concurrent write: embed it now
                if self.store.keeps_turn_lines:
                    w.lines.update(self.vectors.turn_lines([r]))
                vector = self.vectors.of([r], w.errors).get(r.chunk_id)
                if vector is None:  # its turn changed meanwhile: the next build renders it
                    stale.add(r.chunk_id)
                    continue
            writes.append(
                StoredChunk(live, content_hash(live), vector, current, w.lines.get(r.chunk_id))
            )
            if old is None:
                w.counts.upserted += 1
            else:
                w.counts.updated += 1
        for conv in convs:
            self.locks.ensure(conv)
        with stage("write", "store"):
            self.store.upsert(writes)
        with stage("write", "bookkeep"):
            with self.log.transaction() as tx:
                tx.mark_indexed(
                    [(r.chunk_id, text_hash(r.text)) for r in records if r.chunk_id not in stale]
                )
            for conv in convs:
                w.counts.retired += self.retire_superseded(conv)
        with stage("write", "settle"):
            for conv in convs:
                self.settle(conv)

    def _drop_too_long(
        self, records: list[ChunkRecord], errors: list[RecordError]
    ) -> list[ChunkRecord]:
        """The chunker keeps every chunk within the model's limit; refuse (never truncate)
        anything that is not, should a bug ever produce one."""
        limit = self.embedder.info.max_tokens
        keep = []
        for r, n in zip(
            records, self.embedder.count_tokens([r.text for r in records]), strict=True
        ):
            if n + self.embedder.info.special_tokens > limit:
                errors.append(
                    RecordError(
                        r.chunk_id,
                        f"text: {n} tokens; the model reads at most"
                        f" {limit - self.embedder.info.special_tokens}",
                        REASON_TOO_LONG,
                    )
                )
            else:
                keep.append(r)
        return keep

    def retire_superseded(self, conversation_id: str) -> int:
        """Remove the conversation's superseded tails from the store (under its lock)."""
        with self.log.snapshot() as r:
            pending = r.pending_superseded(conversation_id)
        if not pending:
            return 0
        stored = self.store.get(pending, conversations=[conversation_id])
        live = [cid for cid, c in stored.items() if not c.record.metadata.deleted]
        self.locks.ensure(conversation_id)
        self.store.delete(live, [conversation_id])
        with self.log.transaction() as tx:
            tx.superseded_done(pending)
        metrics.CHUNKS_WRITTEN.labels("retired").inc(len(live))
        return len(live)


def _active_version(row: Conversation | None) -> int:
    return row.active_version if row is not None else 0


def _holds(stored: StoredChunk | None, record: ChunkRecord) -> bool:
    """The store already holds this record, live."""
    return (
        stored is not None
        and not stored.record.metadata.deleted
        and stored.content_hash == content_hash(record)
    )
