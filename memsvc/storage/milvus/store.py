"""Chunk storage in Milvus (Milvus Lite file by default, or a Milvus server by URI):
memsvc.ports.ChunkStore.

One collection holds every conversation's chunks with their dense vector and a BM25 sparse
vector (memsvc.storage.milvus.schema): memsvc's own since schema 5 (memsvc.domain.bm25),
computed by Milvus from the text before. Queries are named
for what they are for; their expressions come from memsvc.storage.milvus.expressions.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np
import structlog

from memsvc.domain.bm25 import KeywordQuery
from memsvc.domain.errors import DiskFull, FailedPrecondition, StoreUnavailable
from memsvc.domain.model_identity import ModelIdentity
from memsvc.domain.records import Candidate, StoredChunk
from memsvc.ports import SearchScope, Span
from memsvc.storage.milvus import expressions as ex
from memsvc.storage.milvus import lite, row_codec, schema
from memsvc.storage.milvus.schema import (
    CURRENT_SINCE,
    SCALAR_FIELDS,
    TENANT_KEYWORDS_SINCE,
    TURN_LINES_SINCE,
)

log = structlog.get_logger(__name__)

# Tries of a keyword search while Milvus Lite's BM25 statistics lag a new collection's rows
# (about 3 s in all).
KEYWORD_STATS_TRIES = 8

_QUERY_PAGE = 16_000  # Milvus caps offset + limit of one query at 16,384
# Keepalive pings every 10 s (pymilvus' default) make milvus-lite answer GOAWAY
# too_many_pings; a local socket needs none, a remote server gets them at its own minimum.
_GRPC_OPTIONS = {
    "grpc.keepalive_time_ms": 300_000,
    "grpc.keepalive_permit_without_calls": False,
}
PING_TIMEOUT_S = 2.0

R = TypeVar("R")


def _disk_full(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "disk is full" in text or "no space left" in text


def _store_call(fn: Callable[..., R]) -> Callable[..., R]:
    """A failing call is a store outage (StoreUnavailable, UNAVAILABLE to callers) when the
    store does not answer a ping either; otherwise the error is the call's own."""

    @functools.wraps(fn)
    def wrapper(self: MilvusChunkStore, *args: Any, **kwargs: Any) -> R:
        if not self.up:
            raise StoreUnavailable(f"vector store unreachable ({self.uri}): reconnecting")
        try:
            return fn(self, *args, **kwargs)
        except (FailedPrecondition, StoreUnavailable):
            raise
        except Exception as exc:
            if _disk_full(exc):
                raise DiskFull(f"vector store ({self.uri}): the disk is full") from exc
            if self.ping():
                raise
            self.mark_down(exc)
            raise StoreUnavailable(f"vector store unreachable ({self.uri}): retry later") from exc

    return wrapper


class MilvusChunkStore:
    """Milvus collection access; knows nothing of gRPC or chunking.

    `up` is false from a failed call (or ping) until `reconnect()` succeeds; the store
    watch (memsvc.storage.milvus.watch) drives it. For Milvus Lite, reconnecting restarts
    its server process on the same file."""

    def __init__(self, uri: str, collection: str, model: ModelIdentity, token: str = "") -> None:
        self.uri = uri
        self.model = model
        self.dim = model.dim
        self._token = token
        self._client = self._connect()
        # `collection` is the configured name; another model's vectors there put this
        # model's in a successor beside it (schema.collection_for)
        self.base_collection = collection
        self.collection = schema.collection_for(self._client, collection, model)
        self._up = threading.Event()
        # Whether a row was ever seen: until then a keyword search counts rows first (see
        # search_keyword).
        self._rows_seen = False
        self._open_collection()
        self._up.set()

    @property
    def marks_current(self) -> bool:
        return self.schema_version >= CURRENT_SINCE

    @property
    def keeps_turn_lines(self) -> bool:
        return self.schema_version >= TURN_LINES_SINCE

    @property
    def weighs_keywords(self) -> bool:
        return self.schema_version >= TENANT_KEYWORDS_SINCE

    @property
    def _fields(self) -> list[str]:
        return SCALAR_FIELDS + (["current"] if self.marks_current else [])

    def _with(self, vectors: bool, lines: bool) -> list[str]:
        """The fields to read: a row's vectors (to write it back whole) include its turn
        lines."""
        extra = (["vector"] if vectors else []) + (
            ["turn_lines"] if (vectors or lines) and self.keeps_turn_lines else []
        )
        return self._fields + extra

    def _connect(self) -> Any:
        from pymilvus import MilvusClient

        kwargs: dict[str, Any] = {"uri": self.uri, "grpc_options": _GRPC_OPTIONS}
        if self._token:
            kwargs["token"] = self._token
        if lite.is_lite(self.uri):
            lite.start(self.uri)  # with a home of its own; the client then finds it running
        return MilvusClient(**kwargs)

    def _open_collection(self) -> None:
        """Open (or make) the collection; on Milvus Lite, index its rows' keys."""
        self.schema_version, self.identity = schema.ensure_collection(
            self._client, self.collection, self.uri, self.model
        )
        if lite.is_lite(self.uri) and not lite.index_primary_keys(self.uri, self.collection):
            log.warning("store_keys_unindexed", uri=self.uri, collection=self.collection)

    def close(self, erase: bool = False) -> None:
        """Disconnect (stopping Milvus Lite's process). `erase`: then rewrite the Milvus
        Lite file without the pages that held deleted rows."""
        self._up.clear()
        with contextlib.suppress(Exception):
            self._client.close()
        if lite.is_lite(self.uri):
            lite.release(self.uri)
            if erase:
                lite.vacuum(self.uri)

    def compact(self) -> None:
        """A Milvus server drops deleted rows from its segments when it compacts them
        (Milvus Lite cannot compact while running: its file is rewritten at close)."""
        if lite.is_lite(self.uri) or not self.up:
            return
        try:
            self._client.compact(self.collection)
        except Exception as exc:  # best effort: the server compacts on its own schedule too
            log.warning("store_compact_failed", error=str(exc)[:300])

    # -- health ---------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self._up.is_set()

    def ping(self) -> bool:
        """The server answers and still has the collection it had when this process opened
        it: one dropped or lost (a server back without its data) is down, and so is one
        made anew meanwhile by another replica (this one was frozen through the loss):
        the reconnection opens or makes the collection there is now."""
        try:
            now = schema.collection_id(self._client, self.collection, self.uri, PING_TIMEOUT_S)
        except Exception:
            return False
        return self.identity.startswith(f"{now}|")

    def mark_down(self, exc: BaseException | None = None) -> None:
        if self._up.is_set():
            self._up.clear()
            log.error("store_down", uri=self.uri, error=str(exc)[:300] if exc else "ping failed")

    def reconnect(self) -> bool:
        """Connect again (restarting the Milvus Lite server process); True when up."""
        try:
            old = self._client
            if lite.is_lite(self.uri):
                lite.release(self.uri)
            with contextlib.suppress(Exception):  # the old connection is dead
                old.close()
            self._client = self._connect()
            self._open_collection()
        except FailedPrecondition:
            raise
        except Exception as exc:
            log.warning("store_reconnect_failed", uri=self.uri, error=str(exc)[:300])
            return False
        self._up.set()
        log.info("store_up", uri=self.uri)
        return True

    # -- reads ----------------------------------------------------------------------------
    @_store_call
    def get(
        self, chunk_ids: Sequence[str], with_vectors: bool = False, with_turn_lines: bool = False
    ) -> dict[str, StoredChunk]:
        if not chunk_ids:
            return {}
        fields = self._with(with_vectors, with_turn_lines)
        out: dict[str, StoredChunk] = {}
        # A read by primary key (get/query) costs Milvus Lite ~6 ms at 100,000 rows however
        # few the ids; a FLAT search restricted to the same ids returns the same rows in
        # ~2.5 ms (benchmarks/archive/2026-11-25.md, Speed v3). The probe vector is irrelevant: the
        # filter decides which rows come back, and the limit admits all of them.
        probe = [0.0] * self.dim
        for start in range(0, len(chunk_ids), 1000):
            part = list(dict.fromkeys(chunk_ids[start : start + 1000]))
            result = self._client.search(
                self.collection,
                data=[probe],
                anns_field="vector",
                limit=len(part),
                filter=ex.ids_expr(part),
                output_fields=fields,
                search_params={"metric_type": "IP"},
            )
            for hit in result[0]:
                chunk = row_codec.from_row(hit["entity"])
                out[chunk.record.chunk_id] = chunk
        return out

    def chunks_of(
        self,
        conversation_id: str | None,
        *,
        deleted: bool | None = False,
        version: int | None = None,
        with_vectors: bool = False,
    ) -> list[StoredChunk]:
        return self._query(ex.chunks_of_expr(conversation_id, deleted, version), with_vectors)

    def live_overlapping(
        self, conversation_id: str, spans: Sequence[Span] | None, with_vectors: bool = False
    ) -> list[StoredChunk]:
        return self._query(ex.overlapping_expr(conversation_id, spans), with_vectors)

    @_store_call
    def _query(self, expr: str, with_vectors: bool = False) -> list[StoredChunk]:
        """Every row matching `expr` (paged past Milvus's per-query cap)."""
        fields = self._with(with_vectors, False)
        out: list[StoredChunk] = []
        seen: set[str] = set()
        # Page by primary key: stable, and not limited by offset + limit <= 16,384.
        last = ""
        while True:
            page_expr = ex.after_id(last) if last else ""
            full = " and ".join(p for p in (expr, page_expr) if p)
            rows = self._client.query(
                self.collection,
                filter=full or ex.all_rows(),
                output_fields=fields,
                limit=_QUERY_PAGE,
            )
            for row in rows:
                chunk = row_codec.from_row(row)
                if chunk.record.chunk_id not in seen:
                    seen.add(chunk.record.chunk_id)
                    out.append(chunk)
            if len(rows) < _QUERY_PAGE:
                return out
            last = max(str(r["chunk_id"]) for r in rows)

    @_store_call
    def digests(self, conversation_id: str | None = None) -> dict[str, tuple[str, str, bool]]:
        out: dict[str, tuple[str, str, bool]] = {}
        last = ""
        scope = ex.chunks_of_expr(conversation_id, None, None) if conversation_id else ""
        while True:  # paged by primary key, as _query
            where = [ex.after_id(last) if last else ex.all_rows()] + ([scope] if scope else [])
            rows = self._client.query(
                self.collection,
                filter=" and ".join(where),
                output_fields=["chunk_id", "conversation_id", "content_hash", "deleted"],
                limit=_QUERY_PAGE,
            )
            for row in rows:
                out[str(row["chunk_id"])] = (
                    str(row["conversation_id"]),
                    str(row["content_hash"]),
                    bool(row["deleted"]),
                )
            if len(rows) < _QUERY_PAGE:
                return out
            last = max(str(r["chunk_id"]) for r in rows)

    @_store_call
    def count(self, *, deleted: bool | None = None) -> int:
        expr = ex.chunks_of_expr(None, deleted, None)
        rows = self._client.query(self.collection, filter=expr, output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    @_store_call
    def search_dense(
        self, vector: np.ndarray, scope: SearchScope, limit: int, whole: bool = False
    ) -> list[Candidate]:
        data = np.asarray(vector, dtype=np.float32).tolist()
        return self._search("vector", data, "IP", scope, limit, whole)

    def _search(
        self, field: str, data: Any, metric: str, scope: SearchScope, limit: int, whole: bool
    ) -> list[Candidate]:
        result = self._client.search(
            self.collection,
            data=[data],
            anns_field=field,
            limit=limit,
            filter=ex.scope_expr(scope, self.marks_current),
            output_fields=self._fields if whole else row_codec.CANDIDATE_FIELDS,
            search_params={"metric_type": metric},
        )
        return row_codec.candidates(result[0], whole)

    @_store_call
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
    @_store_call
    def upsert(self, chunks: Sequence[StoredChunk]) -> None:
        """Insert or replace whole rows by chunk_id; one call per batch."""
        if chunks:
            rows = [
                row_codec.to_row(c, self.marks_current, self.keeps_turn_lines, self.weighs_keywords)
                for c in chunks
            ]
            self._client.upsert(self.collection, rows)

    @_store_call
    def delete(self, chunk_ids: Sequence[str]) -> None:
        for start in range(0, len(chunk_ids), 1000):
            part = list(chunk_ids[start : start + 1000])
            self._client.delete(self.collection, filter=ex.ids_expr(part))

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
