"""Chunk storage in Milvus (Milvus Lite file by default, or a Milvus server by URI).

One collection holds every conversation's chunks with their dense vector and a BM25 sparse
vector computed by Milvus from the text (jieba tokenizer, lower-cased). The collection's
description records the embedding model and dimension: opening it with another model is
an error, never a mix of vectors.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, TypeVar

import numpy as np
import structlog

from memsvc.errors import FailedPrecondition, StoreUnavailable
from memsvc.filters import ids_expr, quote
from memsvc.limits import (
    MAX_CHUNK_ID_CHARS,
    MAX_CONVERSATION_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_PARTICIPANTS,
    MAX_TIMESTAMP_CHARS,
)
from memsvc.text import epoch_ms
from memsvc.types import ChunkMetadata, ChunkRecord, TimestampRange, TurnRange

log = structlog.get_logger(__name__)

# 2: English words stemmed in the BM25 analyzer. A version-1 collection keeps working
# (without stemming) until it is rebuilt under a new collection name.
SCHEMA_VERSION = 2
KEYWORD_ANALYZER: dict[str, Any] = {
    # jieba cuts Chinese into words and English at spaces and punctuation; the Snowball
    # English stemmer then maps "paints", "painted", "painting" to one term and leaves
    # Chinese words alone (LoCoMo dev: keyword recall within 20 turns 0.733 -> 0.766).
    "tokenizer": "jieba",
    "filter": ["lowercase", {"type": "stemmer", "language": "english"}],
}
_QUERY_PAGE = 16_000  # Milvus caps offset + limit of one query at 16,384

_SCALAR_FIELDS = [
    "chunk_id",
    "conversation_id",
    "text",
    "content_hash",
    "start_turn",
    "end_turn",
    "ts_start",
    "ts_end",
    "participants",
    "speakers",
    "intent_tag",
    "chunk_version",
    "deleted",
    "part_index",
    "part_count",
]


# A ranked chunk id and its score (fusion works on these).
Scored = tuple[str, float]


@dataclass(frozen=True)
class StoredChunk:
    record: ChunkRecord
    content_hash: str
    vector: np.ndarray | None = None


def content_hash(record: ChunkRecord) -> str:
    """Hash of the text and metadata, the deleted flag excluded (compared on its own)."""
    import hashlib

    m = record.metadata
    payload = [
        record.text,
        m.conversation_id,
        m.turn_range.start,
        m.turn_range.end,
        m.timestamp_range.start,
        m.timestamp_range.end,
        list(m.participants),
        list(m.speakers),
        m.intent_tag,
        m.chunk_version,
        m.part_index,
        m.part_count,
    ]
    blob = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _to_row(chunk: StoredChunk) -> dict[str, Any]:
    r, m = chunk.record, chunk.record.metadata
    assert chunk.vector is not None
    return {
        "chunk_id": r.chunk_id,
        "conversation_id": m.conversation_id,
        "text": r.text,
        "content_hash": chunk.content_hash,
        "start_turn": m.turn_range.start,
        "end_turn": m.turn_range.end,
        "ts_start": m.timestamp_range.start,
        "ts_end": m.timestamp_range.end,
        "ts_start_ms": epoch_ms(m.timestamp_range.start, "metadata.timestamp_range.start")
        if m.timestamp_range.start
        else 0,
        "ts_end_ms": epoch_ms(m.timestamp_range.end, "metadata.timestamp_range.end")
        if m.timestamp_range.end
        else 0,
        "participants": list(m.participants),
        "speakers": list(m.speakers),
        "intent_tag": m.intent_tag,
        "chunk_version": m.chunk_version,
        "deleted": m.deleted,
        "part_index": m.part_index,
        "part_count": m.part_count,
        "vector": np.asarray(chunk.vector, dtype=np.float32).tolist(),
    }


class Candidate(NamedTuple):
    """A search candidate: id and score, and its whole record when the search read it.
    A search with hundreds of candidates (hybrid) reads ids only: their texts would cost
    ~3 ms more per list on one conversation of 205 chunks (benchmarks/RESULTS.md, Speed
    v3), and the records of the few returned are read afterwards. One with few (dense or
    keyword alone) reads whole records, which saves that second round trip."""

    chunk_id: str
    score: float
    stored: StoredChunk | None = None


def _candidates(hits: Sequence[Any], whole: bool) -> list[Candidate]:
    return [
        Candidate(
            str(h["entity"]["chunk_id"]),
            float(h["distance"]),
            _from_row(h["entity"]) if whole else None,
        )
        for h in hits
    ]


def _from_row(row: dict[str, Any]) -> StoredChunk:
    vector = row.get("vector")
    metadata = ChunkMetadata(
        conversation_id=row["conversation_id"],
        turn_range=TurnRange(int(row["start_turn"]), int(row["end_turn"])),
        timestamp_range=TimestampRange(row["ts_start"], row["ts_end"]),
        participants=tuple(row["participants"] or ()),
        speakers=tuple(row["speakers"] or ()),
        intent_tag=row["intent_tag"],
        chunk_version=int(row["chunk_version"]),
        deleted=bool(row["deleted"]),
        part_index=int(row["part_index"]),
        part_count=int(row["part_count"]),
    )
    return StoredChunk(
        ChunkRecord(row["chunk_id"], row["text"], metadata),
        row["content_hash"],
        None if vector is None else np.asarray(vector, dtype=np.float32),
    )


# Keepalive pings every 10 s (pymilvus' default) make milvus-lite answer GOAWAY
# too_many_pings; a local socket needs none, a remote server gets them at its own minimum.
_GRPC_OPTIONS = {
    "grpc.keepalive_time_ms": 300_000,
    "grpc.keepalive_permit_without_calls": False,
}
PING_TIMEOUT_S = 2.0

R = TypeVar("R")


def _store_call(fn: Callable[..., R]) -> Callable[..., R]:
    """A failing call is a store outage (StoreUnavailable, UNAVAILABLE to callers) when the
    store does not answer a ping either; otherwise the error is the call's own."""

    @functools.wraps(fn)
    def wrapper(self: ChunkStore, *args: Any, **kwargs: Any) -> R:
        if not self.up:
            raise StoreUnavailable(f"vector store unreachable ({self.uri}): reconnecting")
        try:
            return fn(self, *args, **kwargs)
        except (FailedPrecondition, StoreUnavailable):
            raise
        except Exception as exc:
            if self.ping():
                raise
            self.mark_down(exc)
            raise StoreUnavailable(f"vector store unreachable ({self.uri}): retry later") from exc

    return wrapper


class ChunkStore:
    """Milvus collection access; knows nothing of gRPC or chunking.

    `up` is false from a failed call (or ping) until `reconnect()` succeeds; StoreWatch
    (memsvc.supervision) drives it. For Milvus Lite, reconnecting restarts its server
    process on the same file."""

    def __init__(self, uri: str, collection: str, model: str, dim: int, token: str = "") -> None:
        self.uri = uri
        self.collection = collection
        self.model = model
        self.dim = dim
        self._token = token
        self._client = self._connect()
        # Read-modify-write of rows (logical delete) must not interleave with upserts.
        self.write_lock = threading.RLock()
        self._up = threading.Event()
        self.schema_version = SCHEMA_VERSION  # of the collection opened (_ensure_collection)
        self._ensure_collection()
        self._up.set()

    @property
    def is_lite(self) -> bool:
        return self.uri.endswith(".db")

    def _connect(self) -> Any:
        from pymilvus import MilvusClient

        kwargs: dict[str, Any] = {"uri": self.uri, "grpc_options": _GRPC_OPTIONS}
        if self._token:
            kwargs["token"] = self._token
        return MilvusClient(**kwargs)

    def close(self) -> None:
        self._up.clear()
        self._client.close()

    # -- health ---------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self._up.is_set()

    def ping(self) -> bool:
        try:
            self._client.has_collection(self.collection, timeout=PING_TIMEOUT_S)
            return True
        except Exception:
            return False

    def mark_down(self, exc: BaseException | None = None) -> None:
        if self._up.is_set():
            self._up.clear()
            log.error("store_down", uri=self.uri, error=str(exc)[:300] if exc else "ping failed")

    def reconnect(self) -> bool:
        """Connect again (restarting the Milvus Lite server process); True when up."""
        try:
            old = self._client
            if self.is_lite:
                from milvus_lite.server_manager import server_manager_instance

                server_manager_instance.release_server(self.uri)
            with contextlib.suppress(Exception):  # the old connection is dead
                old.close()
            self._client = self._connect()
            self._ensure_collection()
        except FailedPrecondition:
            raise
        except Exception as exc:
            log.warning("store_reconnect_failed", uri=self.uri, error=str(exc)[:300])
            return False
        self._up.set()
        log.info("store_up", uri=self.uri)
        return True

    def _ensure_collection(self) -> None:
        marker = {"memsvc_schema": SCHEMA_VERSION, "model": self.model, "dim": self.dim}
        if self._client.has_collection(self.collection):
            desc = self._client.describe_collection(self.collection).get("description", "")
            try:
                found = json.loads(desc)
            except ValueError:
                found = {}
            if found.get("model") != self.model or found.get("dim") != self.dim:
                raise FailedPrecondition(
                    f"collection {self.collection!r} at {self.uri} holds vectors of model"
                    f" {found.get('model')!r} (dim {found.get('dim')}), but the active model is"
                    f" {self.model!r} (dim {self.dim}). Start with the model the data was written"
                    " with, or use another collection (MEMSVC_COLLECTION) or data dir and"
                    " rebuild from the event log."
                )
            self.schema_version = int(found.get("memsvc_schema", 1))
            if self.schema_version < SCHEMA_VERSION:
                log.warning(
                    "collection_schema_old",
                    collection=self.collection,
                    schema=self.schema_version,
                    current=SCHEMA_VERSION,
                    effect="keyword search does not stem English words",
                    remedy="set MEMSVC_COLLECTION to a new name: it is rebuilt from the"
                    " event log; drop the old collection afterwards",
                )
            self._client.load_collection(self.collection)
            return
        self.schema_version = SCHEMA_VERSION
        self._create(json.dumps(marker))

    def _create(self, description: str) -> None:
        from pymilvus import DataType, Function, FunctionType

        c = self._client
        schema = c.create_schema(auto_id=False, enable_dynamic_field=False, description=description)
        schema.add_field(
            "chunk_id", DataType.VARCHAR, is_primary=True, max_length=MAX_CHUNK_ID_CHARS
        )
        schema.add_field(
            "conversation_id", DataType.VARCHAR, max_length=MAX_CONVERSATION_ID_CHARS * 4
        )
        schema.add_field(
            "text",
            DataType.VARCHAR,
            max_length=65_535,
            enable_analyzer=True,
            analyzer_params=KEYWORD_ANALYZER,
        )
        schema.add_field("content_hash", DataType.VARCHAR, max_length=64)
        schema.add_field("start_turn", DataType.INT64)
        schema.add_field("end_turn", DataType.INT64)
        schema.add_field("ts_start", DataType.VARCHAR, max_length=MAX_TIMESTAMP_CHARS)
        schema.add_field("ts_end", DataType.VARCHAR, max_length=MAX_TIMESTAMP_CHARS)
        schema.add_field("ts_start_ms", DataType.INT64)
        schema.add_field("ts_end_ms", DataType.INT64)
        schema.add_field(
            "participants",
            DataType.ARRAY,
            element_type=DataType.VARCHAR,
            max_capacity=MAX_PARTICIPANTS,
            max_length=MAX_NAME_CHARS * 4,
        )
        schema.add_field(
            "speakers", DataType.ARRAY, element_type=DataType.VARCHAR, max_capacity=3, max_length=16
        )
        schema.add_field("intent_tag", DataType.VARCHAR, max_length=64)
        schema.add_field("chunk_version", DataType.INT64)
        schema.add_field("deleted", DataType.BOOL)
        schema.add_field("part_index", DataType.INT64)
        schema.add_field("part_count", DataType.INT64)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=self.dim)
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        schema.add_function(
            Function(
                name="text_bm25",
                function_type=FunctionType.BM25,
                input_field_names=["text"],
                output_field_names=["sparse"],
            )
        )
        index = c.prepare_index_params()
        index.add_index("vector", index_type="FLAT", metric_type="IP")
        index.add_index("sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
        # Nearly every search is scoped to one conversation: index the filter field.
        index.add_index("conversation_id", index_type="INVERTED")
        c.create_collection(
            self.collection, schema=schema, index_params=index, consistency_level="Strong"
        )
        log.info("collection_created", collection=self.collection, model=self.model, dim=self.dim)

    # -- reads ----------------------------------------------------------------------------
    @_store_call
    def get(self, chunk_ids: Sequence[str], with_vectors: bool = False) -> dict[str, StoredChunk]:
        if not chunk_ids:
            return {}
        fields = _SCALAR_FIELDS + (["vector"] if with_vectors else [])
        out: dict[str, StoredChunk] = {}
        # A read by primary key (get/query) costs Milvus Lite ~6 ms at 100,000 rows however
        # few the ids; a FLAT search restricted to the same ids returns the same rows in
        # ~2.5 ms (benchmarks/RESULTS.md, Speed v3). The probe vector is irrelevant: the
        # filter decides which rows come back, and the limit admits all of them.
        probe = [0.0] * self.dim
        for start in range(0, len(chunk_ids), 1000):
            part = list(dict.fromkeys(chunk_ids[start : start + 1000]))
            result = self._client.search(
                self.collection,
                data=[probe],
                anns_field="vector",
                limit=len(part),
                filter=ids_expr(part),
                output_fields=fields,
                search_params={"metric_type": "IP"},
            )
            for hit in result[0]:
                chunk = _from_row(hit["entity"])
                out[chunk.record.chunk_id] = chunk
        return out

    @_store_call
    def query(self, expr: str, with_vectors: bool = False) -> list[StoredChunk]:
        """Every row matching `expr` (paged past Milvus's per-query cap)."""
        fields = _SCALAR_FIELDS + (["vector"] if with_vectors else [])
        out: list[StoredChunk] = []
        seen: set[str] = set()
        # Page by primary key: stable, and not limited by offset + limit <= 16,384.
        last = ""
        while True:
            page_expr = f"chunk_id > {quote(last)}" if last else ""
            full = " and ".join(p for p in (expr, page_expr) if p)
            rows = self._client.query(
                self.collection,
                filter=full or 'chunk_id != ""',
                output_fields=fields,
                limit=_QUERY_PAGE,
            )
            for row in rows:
                chunk = _from_row(row)
                if chunk.record.chunk_id not in seen:
                    seen.add(chunk.record.chunk_id)
                    out.append(chunk)
            if len(rows) < _QUERY_PAGE:
                return out
            last = max(str(r["chunk_id"]) for r in rows)

    @_store_call
    def count(self, expr: str = "") -> int:
        rows = self._client.query(self.collection, filter=expr, output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    @_store_call
    def search_dense(
        self, vector: np.ndarray, expr: str, limit: int, whole: bool = False
    ) -> list[Candidate]:
        result = self._client.search(
            self.collection,
            data=[np.asarray(vector, dtype=np.float32).tolist()],
            anns_field="vector",
            limit=limit,
            filter=expr,
            output_fields=_SCALAR_FIELDS if whole else ["chunk_id"],
            search_params={"metric_type": "IP"},
        )
        return _candidates(result[0], whole)

    @_store_call
    def search_keyword(
        self, text: str, expr: str, limit: int, whole: bool = False
    ) -> list[Candidate]:
        from pymilvus.exceptions import MilvusException

        try:
            result = self._client.search(
                self.collection,
                data=[text],
                anns_field="sparse",
                limit=limit,
                filter=expr,
                output_fields=_SCALAR_FIELDS if whole else ["chunk_id"],
                search_params={"metric_type": "BM25"},
            )
        except MilvusException as exc:
            # Milvus Lite 2.5.1 computes BM25 statistics over an empty collection as NaN and
            # fails the search ("Invalid sparse row: NaN or Inf value"): nothing to find.
            if "NaN or Inf" in str(exc):
                return []
            raise
        return _candidates(result[0], whole)

    # -- writes ---------------------------------------------------------------------------
    @_store_call
    def upsert(self, chunks: Sequence[StoredChunk]) -> None:
        """Insert or replace whole rows by chunk_id; one call per batch."""
        if chunks:
            self._client.upsert(self.collection, [_to_row(c) for c in chunks])

    @_store_call
    def delete(self, chunk_ids: Sequence[str]) -> None:
        for start in range(0, len(chunk_ids), 1000):
            self._client.delete(
                self.collection, filter=ids_expr(list(chunk_ids[start : start + 1000]))
            )

    @_store_call
    def set_deleted(self, chunks: Sequence[StoredChunk]) -> None:
        """Rewrite rows (fetched with vectors) with deleted = true."""
        self.upsert(
            [
                replace(
                    c, record=replace(c.record, metadata=replace(c.record.metadata, deleted=True))
                )
                for c in chunks
            ]
        )
