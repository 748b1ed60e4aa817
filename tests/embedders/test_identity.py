"""The model's identity guard: the collection records provider, model, dimension and the
fingerprint of what the model writes. The same vectors under another name are served;
another model (even under the same name) gets a collection of its own, rebuilt from the
log while searches answer from the collection before (memsvc.services.model_move)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

from memsvc.app import build_services
from memsvc.domain.types import SearchFilters, SearchRequest
from memsvc.embedding.model import BUNDLED_MODEL_NAME, Embedder
from memsvc.embedding.providers import load_embedder
from tests.conftest import EN_TURNS, ZH_TURNS, conversation, make_settings, remote_settings
from tests.support.embedding_server import (
    InfinityServer,
    bundled_model_dir,
)
from tests.support.waiting import until_idle

pytestmark = pytest.mark.embedders


def perturbed_copy(target: Path, seed: int = 7) -> Path:
    """The bundled model with noise on its weights: a different model of the same
    architecture, dimension and tokenizer."""
    from safetensors.numpy import load_file, save_file

    if not target.exists():
        shutil.copytree(bundled_model_dir(), target)
    weights = load_file(str(target / "model.safetensors"))
    rng = np.random.default_rng(seed)
    for name, value in weights.items():
        if value.dtype.kind == "f":
            weights[name] = value + rng.normal(0, 0.05, value.shape).astype(value.dtype)
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


@pytest.fixture(scope="module")
def infinity_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfinityServer]:
    root = tmp_path_factory.mktemp("model-b")
    model = perturbed_copy(root / "model-b")
    server = InfinityServer(model, "model-b", log=root / "infinity.log").start()
    yield server
    server.stop()


def test_the_local_model_moved_to_a_server_keeps_its_collection(
    tmp_path: Path, embedder: Embedder, infinity: InfinityServer
) -> None:
    first = build_services(make_settings(tmp_path), embedder=embedder)
    first.ingest.append(conversation("c", EN_TURNS))
    until_idle(first, "c")
    identity, stored = first.store.identity, first.store.count(deleted=False)
    first.close()

    remote = load_embedder(remote_settings(tmp_path / "model", infinity.url))
    with capture_logs() as logs:
        moved = build_services(remote_settings(tmp_path, infinity.url), embedder=remote)
    try:
        assert any(e["event"] == "collection_model_alias" for e in logs)
        assert not any(e["event"] == "store_changed_reindexing" for e in logs)
        assert moved.store.identity == identity
        (status,) = moved.queue.status(["c"])
        assert status.state == "idle" and moved.store.count(deleted=False) == stored
        hits = moved.search.search(SearchRequest("puppy breed", 3, SearchFilters(("c",)))).hits
        assert "golden retriever" in hits[0].text
    finally:
        moved.close()


def test_another_model_moves_to_a_collection_of_its_own_rebuilt_from_the_log(
    tmp_path: Path, embedder: Embedder, infinity_b: InfinityServer
) -> None:
    first = build_services(make_settings(tmp_path), embedder=embedder)
    first.ingest.append(conversation("c", EN_TURNS + ZH_TURNS))
    until_idle(first, "c")
    stored = first.store.count(deleted=False)
    first.close()

    settings = remote_settings(tmp_path, infinity_b.url, embed_model="model-b")
    model_b = load_embedder(settings)
    with capture_logs() as logs:
        moved = build_services(settings, embedder=model_b)
    try:
        started = next(e for e in logs if e["event"] == "model_move_started")
        assert f"local model {BUNDLED_MODEL_NAME!r}" in started["previous_model"]
        assert "openai model 'model-b'" in started["model"]
        assert moved.store.collection == "memsvc_chunks__model_b_384"
        assert until_idle(moved, "c", timeout_s=120).state == "idle"
        assert moved.store.count(deleted=False) == stored
        hits = moved.search.search(SearchRequest("酒店", 6, SearchFilters(("c",)))).hits
        assert hits and all(h.chunk_id for h in hits)
    finally:
        moved.close()


def test_new_weights_under_the_same_local_name_move_and_the_cache_forgets(
    tmp_path: Path,
) -> None:
    """A model directory whose weights changed: same name, same dimension, another
    fingerprint. It is another model: a collection of its own, and the cache drops the
    old weights' vectors."""
    model_dir = tmp_path / "model"
    shutil.copytree(bundled_model_dir(), model_dir)
    data = tmp_path / "data"
    settings = make_settings(data, embed_model=str(model_dir), embed_fallback=False)
    first = build_services(settings)
    first.ingest.append(conversation("c", EN_TURNS))
    until_idle(first, "c")
    first.close()
    perturbed_copy(model_dir)

    with capture_logs() as logs:
        moved = build_services(settings)
    try:
        dropped = next(e for e in logs if e["event"] == "embed_cache_model_changed")
        assert dropped["dropped_vectors"] > 0
        # the weights that wrote the collection before are gone: it answers by keywords
        assert moved.store.collection == "memsvc_chunks__model_384"
        move = moved.describe().model_move
        assert move is not None and not move.previous_model_serves
        assert "by keywords" in moved.describe().model_notice
        assert until_idle(moved, "c", timeout_s=120).state == "idle"
    finally:
        moved.close()
