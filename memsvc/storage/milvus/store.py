"""Chunk storage in Milvus: memsvc.ports.ChunkStore.

One collection (or its shards: memsvc.storage.milvus.shards) holds every conversation's
chunks with their dense vector and a BM25 sparse vector (memsvc.storage.milvus.schema):
memsvc's own since schema 5 (memsvc.domain.bm25), computed by Milvus from the text before.
Queries are named for what they are for; their expressions come from
memsvc.storage.milvus.expressions. The connection, the shards and the store's health are
memsvc.storage.milvus.collection's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import structlog

from memsvc.domain.bm25 import KeywordQuery
from memsvc.domain.records import Candidate, StoredChunk
from memsvc.ports import SearchScope, Span
from memsvc.storage.milvus import expressions as ex
from memsvc.storage.milvus import row_codec, texts
from memsvc.storage.milvus.collection import MilvusCollection, store_call
from memsvc.storage.milvus.shards import asked_again, first_ask, merged
from memsvc.storage.milvus.texts import ChunkTexts

log = structlog.get_logger(__name__)

# Tries of a keyword search while Milvus Lite's BM25 statistics lag a new collection's rows
# (about 3 s in all).
KEYWORD_STATS_TRIES = 8

_QUERY_PAGE = 16_000  # Milvus caps offset + limit of one query at 16,384
# Threads asking shards at once (a search no conversation limits, a count).
FAN_OUT_THREADS = 4
# Rows per upsert call: Milvus Lite 2.5.1 inserts 100-200-row batches at ~3,700 rows/s on 2
# cores and a 5,000-row batch at ~220 rows/s (2026-12-05, Intel Xeon).
UPSERT_ROWS = 256

R = TypeVar("R")


class MilvusChunkStore(MilvusCollection):
    """Reads and writes of chunks, each on the shards holding what it concerns; knows
    nothing of gRPC or chunking."""

    # -- reads ----------------------------------------------------------------------------
    # Each call runs on the shards holding what it concerns (memsvc.storage.milvus.shards),
    # loaded for it; one that names no conversation, on every shard.
    def _fan_out(self, names: Sequence[str], call: Callable[[str], R]) -> list[R]:
        """`call` on each shard, in parallel past one (Milvus Lite serves concurrent calls
        on two cores: 10.2 ms for four shards one after another, 7.7 ms together)."""
        if len(names) == 1:
            return [call(names[0])]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(FAN_OUT_THREADS, thread_name_prefix="store")
        return list(self._pool.map(call, names))

    @store_call
    def get(
        self,
        chunk_ids: Sequence[str],
        with_vectors: bool = False,
        with_turn_lines: bool = False,
        conversations: Collection[str] = (),
    ) -> dict[str, StoredChunk]:
        if not chunk_ids:
            return {}
        fields = self._with(with_vectors, with_turn_lines)
        out: dict[str, StoredChunk] = {}
        names = self.shards.holding(conversations)
        # A read by primary key (get/query) costs Milvus Lite ~6 ms at 100,000 rows however
        # few the ids; a FLAT search restricted to the same ids returns the same rows in
        # ~2.5 ms (benchmarks/archive/2026-11-25.md, Speed v3). The probe vector is irrelevant: the
        # filter decides which rows come back, and the limit admits all of them.
        probe = [0.0] * self.dim
        with self.residency.using(names):
            for start in range(0, len(chunk_ids), 1000):
                part = list(dict.fromkeys(chunk_ids[start : start + 1000]))
                for name in names:
                    result = self._client.search(
                        name,
                        data=[probe],
                        anns_field="vector",
                        limit=len(part),
                        filter=ex.ids_expr(part),
                        output_fields=fields,
                        search_params={"metric_type": "IP"},
                    )
                    read = self._readable([row_codec.from_row(hit["entity"]) for hit in result[0]])
                    for chunk in read:
                        out[chunk.record.chunk_id] = chunk
                    part = [cid for cid in part if cid not in out]
                    if not part:
                        break
        return out

    def chunks_of(
        self,
        conversation_id: str | None,
        *,
        deleted: bool | None = False,
        version: int | None = None,
        with_vectors: bool = False,
    ) -> list[StoredChunk]:
        expr = ex.chunks_of_expr(conversation_id, deleted, version)
        return self._query(expr, self._shards_of(conversation_id), with_vectors)

    def live_overlapping(
        self, conversation_id: str, spans: Sequence[Span] | None, with_vectors: bool = False
    ) -> list[StoredChunk]:
        expr = ex.overlapping_expr(conversation_id, spans)
        return self._query(expr, self._shards_of(conversation_id), with_vectors)

    def _shards_of(self, conversation_id: str | None) -> list[str]:
        return self.shards.names if conversation_id is None else [self.shards.of(conversation_id)]

    @store_call
    def _query(
        self, expr: str, names: Sequence[str], with_vectors: bool = False
    ) -> list[StoredChunk]:
        """Every row matching `expr` on these shards."""
        fields = self._with(with_vectors, False)
        out: list[StoredChunk] = []
        for name in names:
            with self.residency.using([name]):
                for rows in self._pages(name, expr, fields):
                    out.extend(self._readable([row_codec.from_row(row) for row in rows]))
        return out

    def _readable(self, chunks: list[StoredChunk]) -> list[StoredChunk]:
        """The chunks with their texts, where the rows hold references to them; a row
        whose text is not the one it references (a write cut short) is left out, as if
        not yet written."""
        beside = self._texts_beside()
        if beside is None or not chunks:
            return chunks
        found = beside.get(self.store_id, [c.record.chunk_id for c in chunks])
        out = []
        for c in chunks:
            text = found.get(c.record.chunk_id)
            if text is not None and texts.reference(text) == c.record.text:
                out.append(replace(c, record=replace(c.record, text=text)))
        return out

    def _texts_beside(self) -> ChunkTexts | None:
        """Where this collection's texts are, when its rows hold references to them."""
        return self._texts if self.text_beside else None

    def _with_texts(self, found: list[Candidate]) -> list[Candidate]:
        """Candidates whose records were read, with their texts (one left without is read
        again, by `get`, if it is among the hits)."""
        read = self._readable([c.stored for c in found if c.stored is not None])
        by_id = {c.record.chunk_id: c for c in read}
        return [Candidate(c.chunk_id, c.score, by_id.get(c.chunk_id)) for c in found]

    def _pages(self, name: str, expr: str, fields: list[str]) -> Iterator[list[dict[str, Any]]]:
        """The rows of one shard matching `expr`, page by page in primary-key order: stable,
        and not limited by Milvus's offset + limit <= 16,384."""
        last = ""
        while True:
            page_expr = ex.after_id(last) if last else ""
            full = " and ".join(p for p in (expr, page_expr) if p)
            rows = self._client.query(
                name, filter=full or ex.all_rows(), output_fields=fields, limit=_QUERY_PAGE
            )
            yield rows
            if len(rows) < _QUERY_PAGE:
                return
            last = max(str(r["chunk_id"]) for r in rows)

    def digest_parts(self) -> list[str]:
        return self.residency.audit_round()

    def part_of(self, conversation_id: str) -> str:
        return self.shards.of(conversation_id)

    @store_call
    def digests(
        self, conversation_id: str | None = None, part: str | None = None
    ) -> dict[str, tuple[str, str, bool]]:
        out: dict[str, tuple[str, str, bool]] = {}
        scope = ex.chunks_of_expr(conversation_id, None, None) if conversation_id else ""
        fields = ["chunk_id", "conversation_id", "content_hash", "deleted"]
        for name in [part] if part is not None else self._shards_of(conversation_id):
            with self.residency.using([name]):
                for rows in self._pages(name, scope, fields):
                    for row in rows:
                        out[str(row["chunk_id"])] = (
                            str(row["conversation_id"]),
                            str(row["content_hash"]),
                            bool(row["deleted"]),
                        )
        return out

    @store_call
    def count(self, *, deleted: bool | None = None) -> int:
        expr = ex.chunks_of_expr(None, deleted, None)

        def one(name: str) -> int:
            if not self.residency.is_loaded(name):
                # counted without loading it (a scrape must not undo the memory budget):
                # its rows, those marked deleted included
                return int(self._client.get_collection_stats(name)["row_count"])
            with self.residency.using([name]):
                rows = self._client.query(name, filter=expr, output_fields=["count(*)"])
            return int(rows[0]["count(*)"])

        return sum(self._fan_out(self.shards.names, one))

    @store_call
    def search_dense(
        self, vector: np.ndarray, scope: SearchScope, limit: int, whole: bool = False
    ) -> list[Candidate]:
        data = np.asarray(vector, dtype=np.float32).tolist()
        return self._search("vector", data, "IP", scope, limit, whole)

    def _search(
        self, field: str, data: Any, metric: str, scope: SearchScope, limit: int, whole: bool
    ) -> list[Candidate]:
        expr = ex.scope_expr(scope, self.marks_current)
        fields = self._fields if whole else row_codec.CANDIDATE_FIELDS

        def one(name: str, n: int) -> list[Candidate]:
            with self.residency.using([name]):
                result = self._client.search(
                    name,
                    data=[data],
                    anns_field=field,
                    limit=n,
                    filter=expr,
                    output_fields=fields,
                    search_params={"metric_type": metric},
                )
            found = row_codec.candidates(result[0], whole)
            return self._with_texts(found) if whole and self.text_beside else found

        names = self.shards.for_scope(scope)
        if len(names) == 1:
            return one(names[0], limit)
        asked = first_ask(limit, len(names))
        parts = self._fan_out(names, lambda name: one(name, asked))
        again = asked_again(parts, asked, limit)
        if again:
            fuller = self._fan_out([names[i] for i in again], lambda name: one(name, limit))
            for i, part in zip(again, fuller, strict=True):
                parts[i] = part
        return merged(parts, limit)

    @store_call
    def search_keyword(
        self, query: KeywordQuery, scope: SearchScope, limit: int, whole: bool = False
    ) -> list[Candidate]:
        from pymilvus.exceptions import MilvusException

        if self.weighs_keywords:
            if not query.weights:
                return []
            return self._search("sparse", dict(query.weights), "IP", scope, limit, whole)
        if not self._rows_seen:
            # BM25 over an empty collection fails (below), and the Milvus Lite server prints
            # an assertion and pymilvus an ERROR traceback for it: a new deployment's first
            # searches would fill its log with errors that are not.
            if not self.count(deleted=None):
                return []
            self._rows_seen = True
        for attempt in range(KEYWORD_STATS_TRIES):
            try:
                return self._search("sparse", query.text, "BM25", scope, limit, whole)
            except MilvusException as exc:
                # Milvus Lite 2.5.1 computes BM25 statistics over an empty collection as NaN
                # and fails the search ("Invalid sparse row: NaN or Inf value"): nothing to
                # find. In a collection made anew, the statistics also lag its first rows
                # for a moment: then the rows are there, and the search is tried again.
                if "NaN or Inf" not in str(exc):
                    raise
                if not self.count(deleted=None):
                    return []
                time.sleep(0.1 * (attempt + 1))
        log.warning("keyword_statistics_lagging", collection=self.collection)
        return []

    # -- writes ---------------------------------------------------------------------------
    @store_call
    def upsert(self, chunks: Sequence[StoredChunk]) -> None:
        """Insert or replace whole rows by chunk_id; a call per shard of the batch (per
        UPSERT_ROWS of it)."""
        beside = self._texts_beside()
        if beside is not None and chunks:
            # the text before the row that references it: a row is never without its text
            beside.put(self.store_id, ((c.record.chunk_id, c.record.text) for c in chunks))
        by_shard: dict[str, list[dict[str, Any]]] = {}
        for c in chunks:
            row = row_codec.to_row(
                c,
                self.marks_current,
                self.keeps_turn_lines,
                self.weighs_keywords,
                beside is not None,
            )
            by_shard.setdefault(self.shards.of(c.record.metadata.conversation_id), []).append(row)
        for name, rows in by_shard.items():
            with self.residency.using([name]):
                for start in range(0, len(rows), UPSERT_ROWS):
                    part = rows[start : start + UPSERT_ROWS]
                    self._columns.upsert(self._client, name, part)
            self.residency.wrote(name, len(rows))

    @store_call
    def delete(self, chunk_ids: Sequence[str], conversations: Collection[str] = ()) -> None:
        names = self.shards.holding(conversations)
        beside = self._texts_beside()
        if beside is not None and chunk_ids:
            # the texts first: a delete cut short leaves rows that read as absent, never a
            # deleted chunk's text
            beside.delete(self.store_id, chunk_ids)
        with self.residency.using(names):
            for start in range(0, len(chunk_ids), 1000):
                part = list(chunk_ids[start : start + 1000])
                for name in names:
                    self._client.delete(name, filter=ex.ids_expr(part))

    def set_deleted(self, chunks: Sequence[StoredChunk]) -> None:
        self.upsert(
            [
                replace(
                    c, record=replace(c.record, metadata=replace(c.record.metadata, deleted=True))
                )
                for c in chunks
            ]
        )

    def set_current(self, chunks: Sequence[StoredChunk], current: bool) -> None:
        if self.marks_current:
            self.upsert([replace(c, current=current) for c in chunks])
