"""The collection searches answer from while a model move rebuilds the store in a
successor (memsvc.services.model_move): another collection on the owner's connection,
opened with the model its marker records, read only, and dropped once the move is done."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import structlog

from memsvc.domain.model_identity import ModelIdentity
from memsvc.storage.milvus import schema
from memsvc.storage.milvus.store import MilvusChunkStore

log = structlog.get_logger(__name__)


class PreviousCollection(MilvusChunkStore):
    """`collection` on `owner`'s connection (its Milvus Lite process, its health): closing
    it closes nothing; a failed call marks the connection down as the owner's would."""

    def __init__(self, owner: MilvusChunkStore, collection: str, model: ModelIdentity) -> None:
        self._owner = owner
        self.uri = owner.uri
        self.model = model
        self.dim = model.dim
        self._token = ""
        self._new_shards = 1
        self._memory_budget = owner._memory_budget
        self._held_outside = owner._held_outside
        self._pool = None
        self._pool_lock = threading.Lock()
        self._columns = owner._columns
        self._texts = owner._texts  # the same Milvus Lite file's
        self._rows_seen = False
        self.base_collection = self.collection = collection
        self._open_collection()

    @property  # type: ignore[override]
    def _client(self) -> Any:
        return self._owner._client

    @property
    def up(self) -> bool:
        return self._owner.up

    def mark_down(self, exc: BaseException | None = None) -> None:
        """A failed call here says nothing of the owner's collection: the call fails alone
        (memsvc.services.moving_search opens this collection again, or answers without)."""
        log.warning("previous_collection_failed", collection=self.collection, error=str(exc)[:300])

    def reopen(self) -> bool:
        """Load the collection again (a restarted Milvus Lite process holds none loaded);
        False when it is gone (another replica ended the move)."""
        if not self._client.has_collection(self.collection):
            return False
        self.residency.forget()
        with self.residency.using([self.collection]):
            return True

    @staticmethod
    def recorded(owner: MilvusChunkStore, collection: str) -> ModelIdentity | None:
        """The model `collection` holds vectors of, on `owner`'s connection (None: none)."""
        return schema.recorded_model(owner._client, collection)

    def _open_collection(self) -> None:
        self.schema_version, self.identity, count, by_tenant = schema.ensure_collection(
            self._client, self.collection, self.uri, self.model
        )
        self.text_beside = schema.keeps_text_beside(self._client, self.collection)
        self._open_shards(count, by_tenant)

    def close(self, erase: bool = False) -> None:
        """The connection is the owner's."""

    def reconnect(self) -> bool:
        return self._owner.up

    def drop(self) -> None:
        """Remove the collection and its shards (the move is done; every vector is rebuilt
        beside it). Shard 0 last: it names the others."""
        self.residency.stop()
        for name in reversed(self.shards.names):
            if self._client.has_collection(name):
                self._client.drop_collection(name)
        if self._texts is not None:
            self._texts.drop(self.store_id)
        log.info("collection_dropped", collection=self.collection, uri=self.uri)

    def forget_turns(self, conversation_id: str, turn_ids: Sequence[int]) -> None:
        """A purge during the move: no chunk here keeps the purged turns' text."""
        if not turn_ids:
            return
        spans = [(t, t) for t in sorted(set(turn_ids))]
        for start in range(0, len(spans), 200):  # expressions of a bounded size
            rows = self.live_overlapping(conversation_id, spans[start : start + 200])
            self.delete([r.record.chunk_id for r in rows], [conversation_id])


def drop_abandoned(owner: MilvusChunkStore, keep: Sequence[str]) -> list[str]:
    """Drop the successors of the owner's configured collection that nothing serves or
    moves from (a move reversed before its end): each is a partial copy of the log's
    turns, which a purge since would not have reached. Returns their names."""
    prefix = f"{owner.base_collection}__"
    dropped = []
    for name in owner._client.list_collections():
        if not name.startswith(prefix) or name in keep or schema.is_shard(owner._client, name):
            continue
        model = schema.recorded_model(owner._client, name)
        if model is not None and model.model:  # memsvc's marker: a collection of ours
            store_id = schema.collection_id(owner._client, name, owner.uri, timeout=60)
            for shard in reversed(schema.shard_names(owner._client, name)):
                owner._client.drop_collection(shard)
            if owner._texts is not None:
                owner._texts.drop(store_id)
            log.warning("collection_abandoned_dropped", collection=name, uri=owner.uri)
            dropped.append(name)
    return dropped
