"""Moving between models loses nothing (issue 82): a node that served all-MiniLM-L6-v2
restarts on multilingual-e5-small (and back) and rebuilds its vectors from the event log
into a collection of the new model, while searches keep answering from the collection
before with the model that wrote it; deletes and purges made meanwhile hold in both; when
every conversation is rebuilt, the collection before is dropped. Real models, real Milvus
Lite; indexing paused at the restart holds the move open to look at it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from memsvc.app import Services, build_services
from memsvc.domain.types import SearchFilters, SearchMode, SearchRequest, TurnRange
from memsvc.embedding.e5 import E5_MODEL_NAME, E5Embedder
from memsvc.embedding.model import BUNDLED_MODEL_NAME, Embedder
from memsvc.services.search import SearchService
from memsvc.storage.milvus.previous import PreviousCollection
from tests.conftest import conversation, make_settings, turn

PASSPORT = ["My passport expires on 2025-02-18.", "Noted, I will remind you a month before."]
FOOD = ["I love sushi and ramen.", "Then let's get ramen this weekend."]
GARDEN = ["The tomatoes in my garden are finally red.", "Pick them before the rain."]


def start(data_dir: Path, model: str, embedder: Embedder, **backend: object) -> Services:
    """The store watch held off: the test restarts Milvus Lite itself."""
    settings = make_settings(data_dir, embed_model=model, store_check_s=60, **backend)
    return build_services(settings, embedder=embedder)


def first_conversation(svc: Services, query: str) -> str:
    hits = svc.search.search(SearchRequest(query, 3, mode=SearchMode.HYBRID)).hits
    assert hits, query
    return hits[0].metadata.conversation_id


def texts(svc: Services, conv: str, query: str) -> list[str]:
    req = SearchRequest(query, 6, SearchFilters(conversation_ids=(conv,)), SearchMode.DENSE)
    return [h.text for h in svc.search.search(req).hits]


def wait_moved(svc: Services, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while svc.search.previous is not None:  # the move's end closes it last
        assert time.monotonic() < deadline, svc.describe().model_move
        time.sleep(0.2)


@pytest.fixture()
def served_minilm(tmp_path: Path, embedder: Embedder) -> Iterator[Path]:
    """A data dir whose node served MiniLM: three conversations indexed, then indexing
    paused (durable) and the node stopped."""
    yield served(tmp_path, embedder)


def served(tmp_path: Path, embedder: Embedder, **backend: object) -> Path:
    svc = start(tmp_path, BUNDLED_MODEL_NAME, embedder, **backend)
    try:
        for conv, turns in (("passport", PASSPORT), ("food", FOOD), ("garden", GARDEN)):
            svc.ingest.append(conversation(conv, turns))
            assert svc.control.wait_for_indexed(conv, 1, 60).state == "idle"
        assert svc.model_move is None and svc.store.collection == "memsvc_chunks"
        svc.control.set_paused(True)
    finally:
        svc.close()
    return tmp_path


def test_a_node_that_served_minilm_answers_throughout_its_move_to_e5(
    served_minilm: Path, e5: E5Embedder
) -> None:
    svc = start(served_minilm, E5_MODEL_NAME, e5)
    try:
        assert svc.store.collection == "memsvc_chunks__multilingual_e5_small_384"
        move = svc.describe().model_move
        assert move is not None
        assert (move.from_collection, move.conversations, move.left) == ("memsvc_chunks", 3, 3)
        assert move.previous_model_serves and move.from_model == BUNDLED_MODEL_NAME
        assert "Rebuilding the vectors" in svc.describe().model_notice
        assert isinstance(svc.search.previous, SearchService)
        assert svc.search.previous.embedder is not e5  # MiniLM, loaded again
        # nothing is in the new collection yet; searches answer from the one before
        assert svc.store.count(deleted=False) == 0
        assert first_conversation(svc, "when does my passport expire?") == "passport"
        assert first_conversation(svc, "ramen") == "food"
        assert "tomatoes" in texts(svc, "garden", "tomatoes")[0]
        # Milvus Lite restarted (its process holds no collection loaded): answers go on
        assert svc.store.reconnect()  # what the watch does when its ping fails
        assert first_conversation(svc, "ramen") == "food"
        # a delete during the move holds in the collection before too
        svc.deletion.delete("food", TurnRange(0, 0), [], defer_store=True)
        assert all("sushi" not in t for t in texts(svc, "food", "sushi and ramen"))
        # a turn written meanwhile is searchable once its conversation is rebuilt
        svc.ingest.append([turn("garden", 2, "I also planted basil beside the tomatoes.")])
        svc.control.set_paused(False)
        assert svc.control.wait_for_indexed("garden", 2, 120).state == "idle"
        assert any("basil" in t for t in texts(svc, "garden", "basil"))
        wait_moved(svc)
        assert svc.describe().model_move is None
        assert "Rebuilding" not in svc.describe().model_notice
        assert PreviousCollection.recorded(svc.store, "memsvc_chunks") is None  # dropped
        assert svc.search.previous is None
        assert first_conversation(svc, "护照什么时候过期？") == "passport"  # e5 answers
        assert all("sushi" not in t for t in texts(svc, "food", "sushi and ramen"))
    finally:
        svc.close()
    # a later start has nothing to move
    again = start(served_minilm, E5_MODEL_NAME, e5)
    try:
        assert again.model_move is None
        assert again.store.collection == "memsvc_chunks__multilingual_e5_small_384"
        assert first_conversation(again, "when does my passport expire?") == "passport"
    finally:
        again.close()


def test_the_move_back_to_minilm_answers_from_e5s_collection_and_a_purge_holds(
    served_minilm: Path, e5: E5Embedder, embedder: Embedder
) -> None:
    """The reverse: e5's collection served, then MiniLM configured again; a purge during
    the move leaves none of the purged text in the collection before."""
    svc = start(served_minilm, E5_MODEL_NAME, e5)
    try:
        svc.control.set_paused(False)
        wait_moved(svc)
        svc.control.set_paused(True)
    finally:
        svc.close()
    back = start(served_minilm, BUNDLED_MODEL_NAME, embedder)
    try:
        assert back.store.collection == "memsvc_chunks"
        move = back.describe().model_move
        assert move is not None and move.left == 3
        assert move.from_collection == "memsvc_chunks__multilingual_e5_small_384"
        assert first_conversation(back, "护照什么时候过期？") == "passport"  # e5 answers
        back.deletion.delete("passport", TurnRange(0, 0), [], defer_store=True)
        back.deletion.purge_deleted("passport")
        previous = back.search.previous
        assert previous is not None
        rows = previous.store.chunks_of("passport", deleted=None)
        assert not any("2025-02-18" in r.record.text for r in rows)
        assert previous.store.chunks_of("food", deleted=None)  # the rest stays
        back.control.set_paused(False)
        wait_moved(back)
        assert PreviousCollection.recorded(back.store, move.from_collection) is None
        assert all("2025-02-18" not in t for t in texts(back, "passport", "passport expires"))
    finally:
        back.close()


def test_a_move_reversed_before_its_end_drops_the_partial_collection(
    served_minilm: Path, e5: E5Embedder, embedder: Embedder
) -> None:
    """MiniLM -> e5 (held open), then MiniLM again: MiniLM's collection serves as before,
    no move, and e5's partial copy is dropped (a purge since would not reach it)."""
    svc = start(served_minilm, E5_MODEL_NAME, e5)
    try:
        assert svc.model_move is not None and svc.model_move.active
    finally:
        svc.close()
    with capture_logs() as logs:
        back = start(served_minilm, BUNDLED_MODEL_NAME, embedder)
    try:
        dropped = [e["collection"] for e in logs if e["event"] == "collection_abandoned_dropped"]
        assert dropped == ["memsvc_chunks__multilingual_e5_small_384"]
        assert back.model_move is None and back.store.collection == "memsvc_chunks"
        assert PreviousCollection.recorded(back.store, dropped[0]) is None
        back.control.set_paused(False)
        assert back.control.wait_for_indexed("passport", 1, 120).state == "idle"
        assert first_conversation(back, "when does my passport expire?") == "passport"
    finally:
        back.close()


def test_a_move_on_a_postgresql_log(
    tmp_path: Path, e5: E5Embedder, embedder: Embedder, postgres: object
) -> None:
    """The move's bookkeeping (the served collection, each conversation's reconcile) on
    PostgreSQL as on SQLite."""
    backend = {"database_url": postgres.create_database()}  # type: ignore[attr-defined]
    served(tmp_path, embedder, **backend)
    svc = start(tmp_path, E5_MODEL_NAME, e5, **backend)
    try:
        move = svc.describe().model_move
        assert move is not None and (move.conversations, move.left) == (3, 3)
        assert first_conversation(svc, "when does my passport expire?") == "passport"
        svc.control.set_paused(False)
        wait_moved(svc)
        assert PreviousCollection.recorded(svc.store, "memsvc_chunks") is None
        assert first_conversation(svc, "护照什么时候过期？") == "passport"
    finally:
        svc.close()


def test_a_conversation_whose_rebuild_fails_keeps_the_move_open_and_its_answers(
    served_minilm: Path, e5: E5Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild that keeps failing (here the plan of one conversation raises: the subject
    is the move's bookkeeping) leaves that conversation searched in the collection before
    and the move open, counted as left; its next event tries it again, and the move ends."""
    svc = start(served_minilm, E5_MODEL_NAME, e5, index_max_attempts=1, index_backoff_s=0.1)
    plan = svc.projector.plan
    broken = {"garden"}

    def failing_plan(conversation_id: str) -> list[object]:
        if conversation_id in broken:
            raise RuntimeError("the disk says no")
        return plan(conversation_id)

    monkeypatch.setattr(svc.projector, "plan", failing_plan)
    try:
        svc.control.set_paused(False)
        deadline = time.monotonic() + 120
        while (move := svc.describe().model_move) is not None and move.left > 1:
            assert time.monotonic() < deadline, move
            time.sleep(0.2)
        assert svc.control.wait_for_indexed("garden", 1, 30).state == "failed"
        move = svc.describe().model_move
        assert move is not None and move.left == 1  # open, and says what is left
        assert "tomatoes" in texts(svc, "garden", "tomatoes")[0]  # from the collection before
        assert first_conversation(svc, "护照什么时候过期？") == "passport"  # rebuilt: e5
        broken.clear()  # the cause fixed; the next event tries it again
        svc.ingest.append([turn("garden", 2, "I also planted basil beside the tomatoes.")])
        assert svc.control.wait_for_indexed("garden", 2, 120).state == "idle"
        wait_moved(svc)
        assert any("basil" in t for t in texts(svc, "garden", "basil"))
    finally:
        svc.close()
