"""Deleting turns (logically), retiring a chunk version, and purging deleted text for good."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from memsvc.domain import validation
from memsvc.domain.errors import InvalidArgument
from memsvc.domain.types import REASON_UNKNOWN, DeleteResult, RecordError, TurnRange
from memsvc.observability import metrics
from memsvc.ports import ChunkStore, EmbeddingCache, EventLog, Span, WriterLocks
from memsvc.services.projection import Projector

log = structlog.get_logger(__name__)


class DeletionService:
    def __init__(
        self,
        log: EventLog,
        store: ChunkStore,
        cache: EmbeddingCache,
        projector: Projector,
        locks: WriterLocks,
        default_version: int,
    ) -> None:
        self.log = log
        self.store = store
        self.cache = cache
        self.projector = projector
        self.locks = locks
        self.default_version = default_version

    # -- LogicalDeleteBySource ------------------------------------------------------------
    def delete(
        self, conversation_id: str, turn_range: TurnRange | None, chunk_ids: Sequence[str]
    ) -> DeleteResult:
        """Delete turns: a range, the turns the listed chunks cover, or (neither) the whole
        conversation. The layout is re-planned without them: chunks that covered them are
        marked deleted (kept for audit until purged), surviving neighbours get new chunks,
        stored before this returns."""
        conv = validation.conversation_id(conversation_id, "conversation_id")
        if turn_range is not None:
            validation.turn_range(turn_range, "turn_range")
            if chunk_ids:
                raise InvalidArgument("chunk_ids", "give turn_range or chunk_ids, not both")
        errors: list[RecordError] = []
        with self.locks.hold(conv):
            spans: list[Span] | None
            if chunk_ids:
                spans = self._spans_of_chunks(conv, chunk_ids, errors)
                if not spans:
                    return DeleteResult(0, 0, errors)
            elif turn_range is not None:
                spans = [(turn_range.start, turn_range.end)]
            else:
                spans = None
            with self.log.transaction() as tx:
                events_deleted = tx.mark_events_deleted(conv, spans)
                versions = tx.layout_versions(conv)
            plans = [self.projector.replan(conv, v) for v in versions]
            newly = {cid for p in plans for cid in p.deleted}
            hidden = self.projector.hide_deleted_turns(conv, spans)
            # Surviving neighbours: server-built, stored now so the conversation stays
            # searchable. If the model or store fails, the worker retries them.
            pending = [r for p in plans for r in p.pending]
            if pending:
                try:
                    result = self.projector.store_records(pending, [])
                    if result.errors:
                        raise RuntimeError(result.errors[0].message)
                except Exception as exc:
                    log.warning("delete_neighbours_deferred", error=str(exc)[:300])
                    with self.log.transaction() as tx:
                        version = tx.queued_version(conv) or self.default_version
                        tx.enqueue(conv, 1, version)
            if any(p.superseded for p in plans):
                self.projector.retire_superseded(conv)
        # the replans hid their gone chunks; hide_deleted_turns counted only the others
        metrics.CHUNKS_WRITTEN.labels("deleted").inc(len(newly) + hidden)
        return DeleteResult(len(newly) + hidden, events_deleted, errors)

    def _spans_of_chunks(
        self, conv: str, chunk_ids: Sequence[str], errors: list[RecordError]
    ) -> list[Span]:
        """Turn spans of the listed chunks of this conversation (any version, deleted ones
        included); an id the conversation never had is an error and changes nothing."""
        with self.log.snapshot() as r:
            layout = r.conversation_layout(conv)
        spans: list[Span] = []
        for i, cid in enumerate(dict.fromkeys(chunk_ids)):
            row = layout.get(cid)
            if row is None:
                errors.append(
                    RecordError(
                        cid,
                        f"chunk_ids[{i}]: no chunk with this id in conversation {conv!r}",
                        REASON_UNKNOWN,
                    )
                )
            else:
                spans.append((row.start_turn, row.end_turn))
        return spans

    # -- RetireChunkVersion -----------------------------------------------------------------
    def retire_version(self, conversation_id: str, chunk_version: int) -> int:
        conv = validation.conversation_id(conversation_id, "conversation_id")
        if chunk_version < 1:
            raise InvalidArgument("chunk_version", "must be >= 1")
        with self.locks.hold(conv):
            ids = [
                c.record.chunk_id
                for c in self.store.chunks_of(conv, deleted=None, version=chunk_version)
            ]
            self.store.delete(ids)
            with self.log.transaction() as tx:
                tx.drop_layout_version(conv, chunk_version)
                tx.remove_store_version(conv, chunk_version)
        metrics.CHUNKS_WRITTEN.labels("retired").inc(len(ids))
        return len(ids)

    # -- PurgeDeleted -----------------------------------------------------------------------
    def purge_deleted(
        self, conversation_id: str, all_conversations: bool = False
    ) -> tuple[int, int]:
        """Physically erase deleted chunks and turns of one conversation or of all: from the
        store, the event log (a tombstone keeps each turn id, so numbering continues) and
        the embedding cache."""
        if not conversation_id and not all_conversations:
            raise InvalidArgument(
                "conversation_id",
                "name a conversation, or set all_conversations to purge every conversation",
            )
        if conversation_id and all_conversations:
            raise InvalidArgument("all_conversations", "set it or conversation_id, not both")
        if conversation_id:
            targets = [validation.conversation_id(conversation_id, "conversation_id")]
        else:
            stored = {
                c.record.metadata.conversation_id for c in self.store.chunks_of(None, deleted=True)
            }
            with self.log.snapshot() as r:
                targets = sorted(stored | set(r.conversations_with_deleted()))
        chunks = events = 0
        for conv in targets:
            with self.locks.hold(conv):
                ids = [c.record.chunk_id for c in self.store.chunks_of(conv, deleted=True)]
                self.store.delete(ids)
                with self.log.transaction() as tx:
                    turns = tx.purge_events(conv)
                    hashes = tx.purge_layout(conv, turns)
                self.cache.forget(sorted(hashes))
            chunks += len(ids)
            events += len(turns)
        metrics.CHUNKS_WRITTEN.labels("purged").inc(chunks)
        return chunks, events
