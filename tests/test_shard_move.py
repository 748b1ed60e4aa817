"""A node moves between one collection and shards without losing an answer (issue 85): a
node that served one collection restarts with `store_shards` set and a new collection name,
rebuilds every conversation from the event log into the shards in the background (vectors
from the log's embedding cache: no model call for what was embedded before), while searches
answer from the collection before; then the reverse. A node in shards serves before its
shards are loaded, loads them in the background, and shows them in its gauges. Real model,
real Milvus Lite; indexing paused at the restart holds the move open to look at it."""

from __future__ import annotations

import time
from pathlib import Path

from memsvc.app import Services, build_services
from memsvc.domain.types import SearchFilters, SearchMode, SearchRequest, TurnRange
from memsvc.embedding.model import Embedder
from memsvc.ports import SearchScope
from memsvc.storage.milvus.previous import PreviousCollection
from memsvc.transports.cli.client import _shards_line
from memsvc.transports.grpc.convert import server_info_to_pb
from tests.conftest import conversation, make_settings, turn

CONVERSATIONS = {
    "acme/passport": ["My passport expires on 2025-02-18.", "Noted, I will remind you."],
    "acme/food": ["I love sushi and ramen.", "Then let's get ramen this weekend."],
    "beta/garden": ["The tomatoes in my garden are finally red.", "Pick them before rain."],
    "beta/bike": ["My bike's rear tyre is flat again.", "Patch it tonight then."],
    "gamma/cello": ["I started cello lessons on Tuesdays.", "How is the bowing going?"],
}


def start(
    data_dir: Path, embedder: Embedder, collection: str, shards: int, by: str = "conversation"
) -> Services:
    settings = make_settings(
        data_dir, collection=collection, store_shards=shards, store_shard_by=by, store_check_s=60
    )
    return build_services(settings, embedder=embedder)


def first(svc: Services, query: str) -> str:
    hits = svc.search.search(SearchRequest(query, 3, mode=SearchMode.HYBRID)).hits
    assert hits, query
    return hits[0].metadata.conversation_id


def scoped_texts(svc: Services, conv: str, query: str) -> list[str]:
    req = SearchRequest(query, 6, SearchFilters(conversation_ids=(conv,)), SearchMode.DENSE)
    return [h.text for h in svc.search.search(req).hits]


def wait_moved(svc: Services, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while svc.search.previous is not None:
        assert time.monotonic() < deadline, svc.describe().model_move
        time.sleep(0.2)


def answers_everything(svc: Services) -> None:
    assert first(svc, "when does my passport expire?") == "acme/passport"
    assert first(svc, "sushi and ramen") == "acme/food"
    assert first(svc, "tomatoes in the garden") == "beta/garden"
    assert first(svc, "flat tyre on the bike") == "beta/bike"
    assert first(svc, "cello lessons") == "gamma/cello"


def test_a_node_moves_into_shards_and_back_answering_throughout(
    tmp_path: Path, embedder: Embedder
) -> None:
    svc = start(tmp_path, embedder, "memsvc_chunks", 1)
    try:
        for conv, turns in CONVERSATIONS.items():
            svc.ingest.append(conversation(conv, turns))
            assert svc.control.wait_for_indexed(conv, 1, 60).state == "idle"
        assert svc.store.shards.count == 1
        assert svc.gauges().store_shards is None
        assert server_info_to_pb(svc.describe()).store_shards == 1
        svc.control.set_paused(True)
    finally:
        svc.close()

    into = start(tmp_path, embedder, "memsvc_sharded", 4)
    try:
        assert into.store.shards.count == 4
        move = into.describe().model_move
        assert move is not None
        assert (move.from_collection, move.to_collection) == ("memsvc_chunks", "memsvc_sharded")
        assert move.left == len(CONVERSATIONS) and move.previous_model_serves
        assert into.store.count(deleted=False) == 0
        answers_everything(into)  # from the collection before
        # a delete meanwhile holds in the collection before and after the move
        into.deletion.delete("acme/food", TurnRange(0, 0), [], defer_store=True)
        assert all("sushi" not in t for t in scoped_texts(into, "acme/food", "sushi"))
        into.ingest.append([turn("beta/garden", 2, "I also planted basil beside them.")])
        into.control.set_paused(False)
        wait_moved(into)
        assert PreviousCollection.recorded(into.store, "memsvc_chunks") is None  # dropped
        answers_everything(into)
        assert all("sushi" not in t for t in scoped_texts(into, "acme/food", "sushi"))
        assert any("basil" in t for t in scoped_texts(into, "beta/garden", "basil"))
        # every chunk in the shard of its conversation, more than one shard used
        stored = into.store.digests()
        assert {conv for conv, _h, _d in stored.values()} == set(CONVERSATIONS)
        used = {into.store.shards.of(conv) for conv, _h, _d in stored.values()}
        assert len(used) > 1
        into.control.set_paused(True)
    finally:
        into.close()

    # A restart in shards: SERVING without waiting for them; they load in the background
    # or when first used, and the gauge counts them.
    again = start(tmp_path, embedder, "memsvc_sharded", 4)
    try:
        assert again.model_move is None
        loaded, total = again.gauges().store_shards or (0, 0)
        assert total == 4 and 0 <= loaded <= 4
        answers_everything(again)
        deadline = time.monotonic() + 60
        while again.store.residency.progress()[0] < 4:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert again.gauges().store_shards == (4, 4)
        info = server_info_to_pb(again.describe())  # GetIndexStatus.server; memsvc status
        assert (info.store_shards, info.store_shards_loaded) == (4, 4)
        assert "store in 4 shards (4 loaded)" in _shards_line(4, 4)
    finally:
        again.close()

    back = start(tmp_path, embedder, "memsvc_chunks", 1)
    try:
        move = back.describe().model_move
        assert move is not None and move.from_collection == "memsvc_sharded"
        answers_everything(back)  # from the shards
        back.deletion.delete("acme/passport", TurnRange(0, 0), [], defer_store=True)
        back.deletion.purge_deleted("acme/passport")
        previous = back.search.previous
        assert previous is not None
        rows = previous.store.chunks_of("acme/passport", deleted=None)
        assert not any("2025-02-18" in r.record.text for r in rows)
        back.control.set_paused(False)
        wait_moved(back)
        client = back.store._client
        assert not [n for n in client.list_collections() if n.startswith("memsvc_sharded")]
        assert back.store.shards.count == 1
        assert first(back, "tomatoes in the garden") == "beta/garden"
        assert all("2025-02-18" not in t for t in scoped_texts(back, "acme/passport", "expires"))
    finally:
        back.close()


def test_a_node_moves_to_shards_by_tenant_answering_throughout(
    tmp_path: Path, embedder: Embedder
) -> None:
    """From shards by conversation to shards by tenant (`store_shard_by`), under a new
    collection: rebuilt from the log while the shards before answer; then a tenant's
    conversations share a shard, and a search limited to its prefix asks that one."""
    svc = start(tmp_path, embedder, "memsvc_chunks", 4)
    try:
        for conv, turns in CONVERSATIONS.items():
            svc.ingest.append(conversation(conv, turns))
            assert svc.control.wait_for_indexed(conv, 1, 60).state == "idle"
        assert not svc.store.shards.by_tenant
        svc.control.set_paused(True)
    finally:
        svc.close()

    moved = start(tmp_path, embedder, "memsvc_by_tenant", 4, by="tenant")
    try:
        assert moved.store.shards.by_tenant and moved.describe().model_move is not None
        answers_everything(moved)  # from the shards before
        moved.control.set_paused(False)
        wait_moved(moved)
        answers_everything(moved)
        stored = moved.store.digests()
        assert {conv for conv, _h, _d in stored.values()} == set(CONVERSATIONS)
        for tenant in ("acme/", "beta/", "gamma/"):
            shards = {
                moved.store.shards.of(c) for c, _h, _d in stored.values() if c.startswith(tenant)
            }
            assert shards == {moved.store.shards.of(tenant)}
            assert moved.store.shards.for_scope(SearchScope(prefixes=(tenant,))) == list(shards)
    finally:
        moved.close()
