"""The collection: its fields, indexes and analyzer, and the marker in its description that
records the schema version and the embedder's identity (provider, model, dimension,
fingerprint): opening it with another model is an error, never a mix of vectors."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import structlog

from memsvc.domain.errors import FailedPrecondition
from memsvc.domain.limits import (
    MAX_CHUNK_ID_CHARS,
    MAX_CONVERSATION_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_PARTICIPANTS,
    MAX_TIMESTAMP_CHARS,
)
from memsvc.domain.model_identity import ModelIdentity, mismatch
from memsvc.storage.milvus import turn_lines

log = structlog.get_logger(__name__)

# 2: English words stemmed in the BM25 analyzer.
# 3: `current` marks the rows of each conversation's active version, so a default search
#    filters on one field however many conversations are mid-migration.
# 4: `turn_lines` keeps each turn's line start and vector in a chunk of several turns, so a
#    search can return the turns of a late window hit that bear on the query.
# 5: memsvc writes the sparse vectors (memsvc.domain.bm25): keyword statistics per tenant.
# An older collection keeps working (without stemming; with version filters listing the
# conversations that hold several versions) until rebuilt under a new collection name.
SCHEMA_VERSION = 5
KEYWORD_ANALYZER: dict[str, Any] = {
    # jieba cuts Chinese into words and English at spaces and punctuation; the Snowball
    # English stemmer then maps "paints", "painted", "painting" to one term and leaves
    # Chinese words alone (LoCoMo dev: keyword recall within 20 turns 0.733 -> 0.766).
    "tokenizer": "jieba",
    "filter": ["lowercase", {"type": "stemmer", "language": "english"}],
}

SCALAR_FIELDS = [
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
# Fields a collection of this schema version has beyond SCALAR_FIELDS.
CURRENT_SINCE = 3
TURN_LINES_SINCE = 4
TENANT_KEYWORDS_SINCE = 5


def recorded_model(client: Any, collection: str) -> ModelIdentity | None:
    """The model whose vectors `collection` holds (None: no such collection)."""
    if not client.has_collection(collection):
        return None
    return ModelIdentity.from_json(_marker(client.describe_collection(collection)))


def successor_name(base: str, model: ModelIdentity) -> str:
    """The collection of `model`'s vectors beside `base` (which holds another model's):
    the base name, the model's name in the characters Milvus allows, its dimension."""
    slug = re.sub(r"[^0-9A-Za-z]+", "_", model.model.rsplit("/", 1)[-1]).strip("_").lower()
    return f"{base}__{slug[:60] or 'model'}_{model.dim}"


def collection_for(client: Any, base: str, model: ModelIdentity) -> str:
    """Where `model`'s vectors live: the configured collection when it holds the same
    vectors, else its successor for this model when that exists (a move made it), else the
    configured one when absent, else a new successor (memsvc.services.model_move rebuilds
    it from the log while searches answer from the collection before)."""
    recorded = recorded_model(client, base)
    if recorded is not None and mismatch(recorded, model) is None:
        return base
    successor = successor_name(base, model)
    beside = recorded_model(client, successor)
    if beside is not None and mismatch(beside, model) is None:
        return successor  # a move to this model made it (and may have dropped `base`)
    return base if recorded is None else successor


def ensure_collection(
    client: Any,
    collection: str,
    uri: str,
    model: ModelIdentity,
    shards: int = 1,
    by_tenant: bool = False,
    text_beside: bool = False,
) -> tuple[int, str, int, bool]:
    """Opens the collection, or creates it (in `shards` collections placing conversations
    by their id or, `by_tenant`, by their tenant: memsvc.storage.milvus.shards); returns
    its schema version, its identity (an id made when the collection was created: the log
    recognises the same collection at another address), its count of shards and whether
    they are by tenant, as recorded at its creation. `text_beside`: a collection made here
    keeps its rows' texts in a file beside Milvus Lite's (memsvc.storage.milvus.texts);
    `keeps_text_beside` says what an opened one does. A collection of one shard is loaded here;
    shards load when used. A collection written by another model (another
    dimension, or a fingerprint that disagrees) is FailedPrecondition with the remedy;
    the same vectors under another name (the local model moved to a server) are not."""
    if client.has_collection(collection):
        found = _marker(client.describe_collection(collection))
        recorded = ModelIdentity.from_json(found)
        why = mismatch(recorded, model)
        if why is not None:
            raise FailedPrecondition(
                f"collection {collection!r} at {uri} holds vectors of {recorded.describe()},"
                f" but the configured embedder is {model.describe()}: {why}. Vectors of two"
                " models cannot be searched together. Drop this collection (its vectors are"
                " rebuilt from the event log), or set MEMSVC_COLLECTION to a new name: memsvc"
                " rebuilds every conversation into it while searches answer from the"
                " collection before (progress in `memsvc status`). To keep serving the old"
                " vectors, configure the model they were written with."
            )
        if (recorded.provider, recorded.model) != (model.provider, model.model):
            log.info(
                "collection_model_alias",
                collection=collection,
                recorded=recorded.describe(),
                configured=model.describe(),
                note="the same vectors (fingerprints agree): served without a rebuild",
            )
        version = int(found.get("memsvc_schema", 1))
        if version < SCHEMA_VERSION:
            effects = []
            if version < 2:
                effects.append("keyword search does not stem English words")
            if version < CURRENT_SINCE:
                effects.append(
                    "default searches filter versions by listing the conversations that"
                    " hold several (no current mark)"
                )
            if version < TURN_LINES_SINCE:
                effects.append(
                    "a turn budget counts every turn of a window hit (no turn lines to"
                    " return only the turns that bear on the query)"
                )
            if version < TENANT_KEYWORDS_SINCE:
                effects.append(
                    "keyword scores count every tenant's texts (Milvus's BM25 statistics are"
                    " the whole collection's)"
                )
            log.warning(
                "collection_schema_old",
                collection=collection,
                schema=version,
                current=SCHEMA_VERSION,
                effect="; ".join(effects),
                remedy="set MEMSVC_COLLECTION to a new name: it is rebuilt from the"
                " event log; drop the old collection afterwards",
            )
        count = int(found.get("shards", 1))
        _ensure_shards(client, collection, count, found, model.dim)
        if count == 1:
            client.load_collection(collection)
        identity = f"{_id_from_marker(found, uri, collection)}|{recorded.model}|{recorded.dim}"
        return version, identity, count, found.get("shard_by") == "tenant"
    store_id = uuid.uuid4().hex
    marker: dict[str, Any] = {"memsvc_schema": SCHEMA_VERSION, **model.to_json()}
    marker["store_id"] = store_id
    by_tenant = by_tenant and shards > 1
    if shards > 1:
        marker["shards"] = shards
    if by_tenant:
        marker["shard_by"] = "tenant"
    if text_beside and SCHEMA_VERSION >= TENANT_KEYWORDS_SINCE:  # Milvus's BM25 reads it
        marker["text_beside"] = True
    try:
        # the shards first: a crash between leaves no marker naming shards that are not
        _ensure_shards(client, collection, shards, marker, model.dim)
        _create(client, collection, json.dumps(marker), model.dim)
    except Exception:
        if not client.has_collection(collection):
            raise
        # another process sharing the store created it meanwhile: open theirs
        return ensure_collection(client, collection, uri, model, shards, by_tenant, text_beside)
    log.info(
        "collection_created",
        collection=collection,
        model=model.model,
        dim=model.dim,
        provider=model.provider,
    )
    return SCHEMA_VERSION, f"{store_id}|{model.model}|{model.dim}", shards, by_tenant


def _ensure_shards(client: Any, base: str, count: int, marker: dict[str, Any], dim: int) -> None:
    """Shards 1.. of `base` (shard 0 is `base` itself), made where missing, each marked as
    one (`shard_of`): a listing of collections tells them from collections of their own."""
    from memsvc.storage.milvus.shards import shard_name

    for index in range(1, count):
        name = shard_name(base, index)
        if not client.has_collection(name):
            own = {**marker, "shard_of": base, "shard": index}
            own.pop("shards", None)
            _create(client, name, json.dumps(own), dim, load=False)


def shard_names(client: Any, collection: str) -> list[str]:
    """The collections holding `collection`'s rows: itself and its shards."""
    from memsvc.storage.milvus.shards import shard_name

    if not client.has_collection(collection):
        return []
    count = int(_marker(client.describe_collection(collection)).get("shards", 1))
    return [shard_name(collection, i) for i in range(count)]


def keeps_text_beside(client: Any, collection: str) -> bool:
    """Whether the collection's rows hold a reference to their text, kept beside."""
    return bool(_marker(client.describe_collection(collection)).get("text_beside"))


def store_ids(client: Any, uri: str) -> list[str]:
    """The ids of the collections (shards aside) on the connection."""
    out = []
    for name in client.list_collections():
        found = _marker(client.describe_collection(name))
        if "shard_of" not in found:
            out.append(_id_from_marker(found, uri, name))
    return out


def is_shard(client: Any, collection: str) -> bool:
    return "shard_of" in _marker(client.describe_collection(collection))


def collection_id(client: Any, collection: str, uri: str, timeout: float) -> str:
    """The id the collection was created with, asked of the server now (raises when it has
    no such collection): the start of its identity (`ensure_collection`)."""
    found = _marker(client.describe_collection(collection, timeout=timeout))
    return _id_from_marker(found, uri, collection)


def _marker(description: dict[str, Any]) -> dict[str, Any]:
    """The memsvc marker a collection's description holds ({} when it holds none)."""
    try:
        found = json.loads(description.get("description", ""))
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _id_from_marker(found: dict[str, Any], uri: str, collection: str) -> str:
    # Collections made before they had an id are known by their address.
    return str(found.get("store_id") or f"{uri}|{collection}")


def _create(client: Any, collection: str, description: str, dim: int, load: bool = True) -> None:
    from pymilvus import DataType, Function, FunctionType

    schema = client.create_schema(
        auto_id=False, enable_dynamic_field=False, description=description
    )
    schema.add_field("chunk_id", DataType.VARCHAR, is_primary=True, max_length=MAX_CHUNK_ID_CHARS)
    schema.add_field("conversation_id", DataType.VARCHAR, max_length=MAX_CONVERSATION_ID_CHARS * 4)
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
    if SCHEMA_VERSION >= CURRENT_SINCE:
        schema.add_field("current", DataType.BOOL)
    if SCHEMA_VERSION >= TURN_LINES_SINCE:
        schema.add_field("turn_lines", DataType.VARCHAR, max_length=turn_lines.MAX_CELL_CHARS)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
    if SCHEMA_VERSION < TENANT_KEYWORDS_SINCE:
        schema.add_function(
            Function(
                name="text_bm25",
                function_type=FunctionType.BM25,
                input_field_names=["text"],
                output_field_names=["sparse"],
            )
        )
    index = client.prepare_index_params()
    index.add_index("vector", index_type="FLAT", metric_type="IP")
    # memsvc writes BM25's term-frequency parts and queries with IDF weights: their inner
    # product is the score (memsvc.domain.bm25).
    index.add_index(
        "sparse",
        index_type="SPARSE_INVERTED_INDEX",
        metric_type="IP" if SCHEMA_VERSION >= TENANT_KEYWORDS_SINCE else "BM25",
    )
    # Nearly every search is scoped to one conversation: index the filter field.
    index.add_index("conversation_id", index_type="INVERTED")
    client.create_collection(collection, schema=schema, consistency_level="Strong")
    # An empty collection's indexes are ready once made: pymilvus's wait for each polls
    # every 0.5 s, 1.5 of a new store's 2 s.
    client.create_index(collection, index, sync=False)
    if load:
        client.load_collection(collection)
