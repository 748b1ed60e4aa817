"""The vector store as a projection of the event log.

The event log is the only source of truth. For each conversation and chunk_version the
*layout* is the set of chunks planned from the live (non-deleted) turns; the store holds
what the layout holds, and nothing else stays live. Writing a conversation's chunks is
three steps, each here in one place:

- `replan` (plan) recomputes the layout from the live turns. New or changed windows are
  rendered and become *pending* (not yet stored). Chunks that left the layout are either
  *deleted* (they covered a turn that is now deleted: kept for audit, marked deleted in the
  store) or *superseded* (a tail replaced by a longer window: removed from the store once
  its replacement is stored).
- `embed` runs the model on the texts not already cached, outside any lock.
- `write` stores records only if each equals, byte for byte, the chunk the layout holds for
  its id at the moment of writing (checked again under the conversation's writer lock, after
  the model has embedded, so a delete or rebuild that lands meanwhile wins). The server is
  the author of every chunk; a caller can only hand back what a build gave it.

Callers hold the conversation's writer lock around `replan`; `store_records` takes it for
the write step itself.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import structlog

from memsvc.domain.chunking import ChunkRenderer, plan_windows
from memsvc.domain.hashing import content_hash, text_hash
from memsvc.domain.records import LayoutRow, StoredChunk
from memsvc.domain.types import (
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
from memsvc.ports import ChunkStore, Embedder, EmbeddingCache, EventLog, Span, WriterLocks

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Replan:
    conversation_id: str
    version: int
    # Chunks of the layout not yet in the store (new, changed, or never stored).
    pending: list[ChunkRecord]
    # Chunks that left the layout in this replan, their turns still live.
    superseded: list[str]
    # Chunks that left the layout in this replan because a turn they cover is deleted.
    deleted: list[str]


@dataclass
class _Counts:
    upserted: int = 0
    updated: int = 0
    unchanged: int = 0
    retired: int = 0


class Projector:
    def __init__(
        self,
        log: EventLog,
        store: ChunkStore,
        embedder: Embedder,
        cache: EmbeddingCache,
        renderer: ChunkRenderer,
        locks: WriterLocks,
    ) -> None:
        self.log = log
        self.store = store
        self.embedder = embedder
        self.cache = cache
        self.renderer = renderer
        self.policy = renderer.policy
        self.locks = locks

    # -- plan -----------------------------------------------------------------------------
    def replan(self, conversation_id: str, version: int) -> Replan:
        """Recompute the layout of one conversation and version from its live turns.
        The caller holds the conversation's lock: the rows read here cannot change before
        the write below, except by appends, which the next replan picks up."""
        conv = conversation_id
        with self.log.snapshot() as r:
            turns = r.live_turns(conv)
            old = r.layout(conv, version)
            deleted_turns = r.deleted_turn_ids(conv)
        # Rendering (jieba, the tokenizer) runs outside any transaction on the shared log.
        windows = plan_windows(turns, self.policy, self.embedder.count_tokens)
        pending: list[ChunkRecord] = []
        fresh: list[LayoutRow] = []
        current: set[str] = set()
        for w in windows:
            cid = w.chunk_id(conv, version)
            current.add(cid)
            source = w.source_hash(version, self.policy)
            previous = old.get(cid)
            same = (
                previous is not None
                and not previous.deleted
                and previous.source_hash == source
                and previous.content_hash != ""
            )
            if same and previous is not None and previous.indexed:
                continue
            record = self.renderer.render(conv, w, version)
            pending.append(record)
            if not same:
                fresh.append(
                    LayoutRow(
                        cid,
                        conv,
                        version,
                        w.start_turn,
                        w.end_turn,
                        source,
                        text_hash(record.text),
                        content_hash=content_hash(record),
                    )
                )
        gone = [row for cid, row in old.items() if cid not in current and not row.deleted]
        deleted = sorted(r.chunk_id for r in gone if _covers_any(r, deleted_turns))
        superseded = sorted({r.chunk_id for r in gone} - set(deleted))
        if deleted:
            # A chunk over a now-deleted turn leaves the layout: hide its stored copy first
            # (it may be a re-rendering without that turn, stored live), so a failure below
            # leaves nothing visible and the next replan finds the row gone again.
            stored = self.store.get(deleted, with_vectors=True)
            self.store.set_deleted([c for c in stored.values() if not c.record.metadata.deleted])
        if fresh or gone:
            with self.log.transaction() as tx:
                tx.put_layout(fresh)
                tx.mark_layout_deleted(deleted)
                tx.drop_layout(superseded)
                tx.add_superseded(conv, superseded)
                tx.clear_superseded(r.chunk_id for r in fresh)
        return Replan(conv, version, pending, superseded, deleted)

    # -- embed ----------------------------------------------------------------------------
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors for `texts`, running the model only on texts the cache has not seen."""
        return embed_passages_cached(self.embedder, self.cache, texts)

    # -- write ----------------------------------------------------------------------------
    def store_records(
        self,
        records: Sequence[ChunkRecord],
        errors: list[RecordError],
        register_versions: bool = True,
    ) -> UpsertResult:
        """Embed and store server-authored records; anything else is a per-record error.

        `register_versions=False` (a reindex in progress) keeps searches on the
        conversation's previous version until the worker completes it."""
        try:
            return self._store_records(records, errors, register_versions)
        except Exception as exc:
            metrics.count_failed_write(exc, len(records))
            raise

    def _store_records(
        self,
        records: Sequence[ChunkRecord],
        errors: list[RecordError],
        register_versions: bool,
    ) -> UpsertResult:
        authored = self._authored(records, errors)
        # The model is the slow part: embed before taking any lock. Texts already stored
        # with identical content need no vector; the cache makes the rest cheap on replays.
        existing = self.store.get([r.chunk_id for r in authored])
        need = [r for r in authored if not _holds(existing.get(r.chunk_id), r)]
        need = self._drop_too_long(need, errors)
        too_long = {e.chunk_id for e in errors if e.reason == REASON_TOO_LONG}
        authored = [r for r in authored if r.chunk_id not in too_long]
        texts = list(dict.fromkeys(r.text for r in need))
        vectors = dict(zip(texts, self.embed(texts), strict=True))
        counts = _Counts()
        by_conv: dict[str, list[ChunkRecord]] = {}
        for r in authored:
            by_conv.setdefault(r.metadata.conversation_id, []).append(r)
        for conv, group in by_conv.items():
            with self.locks.hold(conv):
                self._write(conv, group, vectors, errors, counts, register_versions)
        for outcome in ("upserted", "updated", "unchanged"):
            metrics.CHUNKS_WRITTEN.labels(outcome).inc(getattr(counts, outcome))
        metrics.count_upsert_failures([e.reason for e in errors])
        return UpsertResult(
            counts.upserted, counts.updated, counts.unchanged, counts.retired, errors
        )

    def _authored(
        self, records: Sequence[ChunkRecord], errors: list[RecordError]
    ) -> list[ChunkRecord]:
        """The records that equal what the layout holds for their ids now."""
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
        return ok

    def _write(
        self,
        conv: str,
        records: list[ChunkRecord],
        vectors: dict[str, np.ndarray],
        errors: list[RecordError],
        counts: _Counts,
        register_versions: bool,
    ) -> None:
        """Under the conversation's lock: check authorship again, write, bookkeep."""
        records = self._authored(records, errors)
        existing = self.store.get([r.chunk_id for r in records])
        writes: list[StoredChunk] = []
        for r in records:
            old = existing.get(r.chunk_id)
            if _holds(old, r):
                counts.unchanged += 1
                continue
            live = replace(r, metadata=replace(r.metadata, deleted=False))
            vector = vectors.get(r.text)
            if vector is None:  # stored text, changed by a concurrent write: embed it now
                vector = self.embed([r.text])[0]
            writes.append(StoredChunk(live, content_hash(live), vector))
            if old is None:
                counts.upserted += 1
            else:
                counts.updated += 1
        self.store.upsert(writes)
        with self.log.transaction() as tx:
            tx.mark_indexed([(r.chunk_id, text_hash(r.text)) for r in records])
            tx.advance_indexed(conv)
            if writes:
                tx.add_store_versions(
                    {(conv, w.record.metadata.chunk_version) for w in writes},
                    complete=register_versions,
                )
        counts.retired += self.retire_superseded(conv)

    def version_complete(self, conversation_id: str, version: int) -> None:
        """A rebuild of `version` is wholly stored: searches read it from now on."""
        with self.log.transaction() as tx:
            tx.add_store_versions([(conversation_id, version)], complete=True)

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
        live = [cid for cid, c in self.store.get(pending).items() if not c.record.metadata.deleted]
        self.store.delete(live)
        with self.log.transaction() as tx:
            tx.superseded_done(pending)
        metrics.CHUNKS_WRITTEN.labels("retired").inc(len(live))
        return len(live)

    def hide_deleted_turns(self, conversation_id: str, spans: Sequence[Span] | None) -> int:
        """Mark deleted every live stored chunk of the conversation that overlaps the spans
        (None = all) and is not a chunk of the current layout (layout chunks are rendered
        from live turns only). Returns the number of chunks changed."""
        candidates = self.store.live_overlapping(conversation_id, spans, with_vectors=True)
        with self.log.snapshot() as r:
            layout = r.layout_rows([c.record.chunk_id for c in candidates])
        stale = [
            c
            for c in candidates
            if (row := layout.get(c.record.chunk_id)) is None
            or row.deleted
            or row.content_hash != c.content_hash
        ]
        self.store.set_deleted(stale)
        return len(stale)


def embed_passages_cached(
    embedder: Embedder, cache: EmbeddingCache, texts: Sequence[str]
) -> np.ndarray:
    """Vectors for `texts`, running the model only on texts the cache has not seen."""
    hashes = [text_hash(t) for t in texts]
    cached = cache.get_many(embedder.name, hashes)
    missing = list(dict.fromkeys(h for h in hashes if h not in cached))
    metrics.CACHE_LOOKUPS.labels("hit").inc(len(hashes) - len(missing))
    metrics.CACHE_LOOKUPS.labels("miss").inc(len(missing))
    if missing:
        by_hash = {h: t for h, t in zip(hashes, texts, strict=True)}
        vectors = embedder.encode_passages([by_hash[h] for h in missing])
        fresh = dict(zip(missing, vectors, strict=True))
        cache.put_many(embedder.name, fresh)
        cached.update(fresh)
    out = np.zeros((len(texts), embedder.dim), dtype=np.float32)
    for i, h in enumerate(hashes):
        out[i] = cached[h]
    return out


def _holds(stored: StoredChunk | None, record: ChunkRecord) -> bool:
    """The store already holds this record, live."""
    return (
        stored is not None
        and not stored.record.metadata.deleted
        and stored.content_hash == content_hash(record)
    )


def _covers_any(row: LayoutRow, sorted_turns: Sequence[int]) -> bool:
    i = bisect.bisect_left(sorted_turns, row.start_turn)
    return i < len(sorted_turns) and sorted_turns[i] <= row.end_turn
