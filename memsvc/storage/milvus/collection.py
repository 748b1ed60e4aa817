"""Where a store's rows live in Milvus (a Milvus Lite file by default, or a Milvus server by
URI): the connection, the collection and its shards (memsvc.storage.milvus.shards), their
loading, and the store's health. memsvc.storage.milvus.store reads and writes through it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import structlog

from memsvc.domain.errors import DiskFull, FailedPrecondition, StoreUnavailable
from memsvc.domain.model_identity import ModelIdentity
from memsvc.observability import process_memory
from memsvc.storage.milvus import lite, schema, texts
from memsvc.storage.milvus.columns import ColumnWriter
from memsvc.storage.milvus.schema import (
    CURRENT_SINCE,
    SCALAR_FIELDS,
    TENANT_KEYWORDS_SINCE,
    TURN_LINES_SINCE,
)
from memsvc.storage.milvus.shards import Residency, ShardMap
from memsvc.storage.milvus.texts import ChunkTexts

log = structlog.get_logger(__name__)

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


def store_call(fn: Callable[..., R]) -> Callable[..., R]:
    """A failing call is a store outage (StoreUnavailable, UNAVAILABLE to callers) when the
    store does not answer a ping either; otherwise the error is the call's own."""

    @functools.wraps(fn)
    def wrapper(self: MilvusCollection, *args: Any, **kwargs: Any) -> R:
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


class MilvusCollection:
    """Milvus collection access; knows nothing of gRPC or chunking.

    `up` is false from a failed call (or ping) until `reconnect()` succeeds; the store
    watch (memsvc.storage.milvus.watch) drives it. For Milvus Lite, reconnecting restarts
    its server process on the same file."""

    shards: ShardMap
    residency: Residency
    # whether the rows hold references to their texts (memsvc.storage.milvus.texts)
    text_beside = False

    def __init__(
        self,
        uri: str,
        collection: str,
        model: ModelIdentity,
        token: str = "",
        shards: int = 1,
        memory_budget_bytes: int = 0,
        # a memory budget bounds the node: this process's own memory counts
        memory_held_outside: Callable[[], int] = process_memory.resident_bytes,
        shards_by_tenant: bool = False,
    ) -> None:
        self.uri = uri
        self._new_shards = shards
        self._new_by_tenant = shards_by_tenant
        self._memory_budget = memory_budget_bytes
        self._held_outside = memory_held_outside
        self.model = model
        self.dim = model.dim
        self._token = token
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._columns = ColumnWriter()  # upserts, packed a field at a time
        self._texts: ChunkTexts | None = None  # on Milvus Lite: the rows' texts
        self._client = self._connect()
        # `collection` is the configured name; another model's vectors there put this
        # model's in a successor beside it (schema.collection_for)
        self.base_collection = collection
        self.collection = schema.collection_for(self._client, collection, model)
        self._up = threading.Event()
        # Whether a row was ever seen: until then a keyword search counts rows first
        # (memsvc.storage.milvus.store).
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
        """Open (or make) the collection and its shards; on Milvus Lite, index their rows'
        keys and open the file of their texts."""
        count, by_tenant = self._ensure()
        if self._texts is None and lite.is_lite(self.uri):
            self._texts = ChunkTexts(texts.path_beside(self.uri))
            self._texts.drop_all_but(schema.store_ids(self._client, self.uri))
            if self.text_beside and not self._texts.holds(self.store_id) and self._holds_rows():
                # rows whose texts are gone (the file lost, or another file in its place):
                # made again, and the event log rebuilds it (a new store id:
                # memsvc.services.bootstrap.follow_store_identity)
                log.error(
                    "store_texts_lost",
                    collection=self.collection,
                    file=str(self._texts.path),
                    remedy="the collection is made again and rebuilt from the event log",
                )
                for name in reversed(schema.shard_names(self._client, self.collection)):
                    self._client.drop_collection(name)
                count, by_tenant = self._ensure()
        if (count, by_tenant) != (self._new_shards, self._new_by_tenant and count > 1):
            log.warning(
                "store_shards_kept",
                collection=self.collection,
                shards=count,
                by_tenant=by_tenant,
                configured=self._new_shards,
                configured_by_tenant=self._new_by_tenant,
                note="a collection keeps the shards it was made with, and their placement; to"
                " change them, set"
                " MEMSVC_COLLECTION to a new name: it is rebuilt from the event log while"
                " searches answer from this one (docs/operations/sizing.md)",
            )
        self._open_shards(count, by_tenant)

    def _ensure(self) -> tuple[int, bool]:
        self.schema_version, self.identity, count, by_tenant = schema.ensure_collection(
            self._client,
            self.collection,
            self.uri,
            self.model,
            self._new_shards,
            self._new_by_tenant,
            text_beside=lite.is_lite(self.uri),
        )
        self.text_beside = schema.keeps_text_beside(self._client, self.collection)
        return count, by_tenant

    @property
    def store_id(self) -> str:
        """The id the collection was made with (the texts beside are kept under it)."""
        return self.identity.split("|", 1)[0]

    def _holds_rows(self) -> bool:
        names = schema.shard_names(self._client, self.collection)
        return any(int(self._client.get_collection_stats(n)["row_count"]) for n in names)

    def _open_shards(self, count: int, by_tenant: bool) -> None:
        before: Residency | None = getattr(self, "residency", None)
        if before is not None:  # reconnected: the process before held the loads
            before.stop()
        self.shards = ShardMap(self.collection, count, by_tenant)
        self.residency = Residency(
            self.shards.names,
            load=lambda name: self._client.load_collection(name),
            release=lambda name: self._client.release_collection(name),
            rows=self._rows_in,
            budget_bytes=self._memory_budget if count > 1 else 0,
            held_outside=self._outside_shards,
        )
        if count == 1:
            self.residency.mark_loaded(self.collection)  # loaded by ensure_collection
        if lite.is_lite(self.uri):
            for name in self.shards.names:
                if not lite.index_primary_keys(self.uri, name):
                    log.warning("store_keys_unindexed", uri=self.uri, collection=name)

    def _outside_shards(self) -> int:
        """What a memory budget holds besides the loaded shards' rows: what the owner counts
        (memsvc's own memory) and a Milvus Lite process's before any row."""
        return self._held_outside() + (lite.BASE_BYTES if lite.is_lite(self.uri) else 0)

    def _rows_in(self, shard: str) -> int:
        rows = self._client.query(shard, filter="", output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    def shard_progress(self) -> tuple[int, int] | None:
        """(shards loaded, shards) of a store in shards; None for one collection."""
        return self.residency.progress() if self.shards.count > 1 else None

    def load_in_background(self) -> None:
        """Load the shards not yet loaded, in a thread (calls load what they need first)."""
        if self.shards.count > 1:
            self.residency.load_in_background()

    def close(self, erase: bool = False) -> None:
        """Disconnect (stopping Milvus Lite's process). `erase`: then rewrite the Milvus
        Lite file without the pages that held deleted rows."""
        self._up.clear()
        self.residency.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        with contextlib.suppress(Exception):
            self._client.close()
        if self._texts is not None:
            if erase:
                self._texts.erase()
            self._texts.close()
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
            for name in self.shards.names:
                self._client.compact(name)
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
        the reconnection opens or makes the collection there is now. Not asked while a
        shard loads: Milvus Lite serves one call at a time, so behind a load (seconds for
        ~30,000 rows) a ping timed out with the server well, and the reconnection that
        followed restarted it (a server that fails meanwhile fails the load's call)."""
        if self.residency.loading:
            return True
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
