"""The model's identity guard: the collection records provider, model, dimension and the
fingerprint of what the model writes. The same vectors under another name are served;
another model (even under the same name) is refused at start, naming both; a new
collection rebuilds everything from the log with the new model."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

from memsvc.app import build_services
from memsvc.domain.errors import FailedPrecondition
from memsvc.domain.types import SearchFilters, SearchRequest
from memsvc.embedding.model import BUNDLED_MODEL_NAME, Embedder
from memsvc.embedding.providers import load_embedder
from tests.conftest import EN_TURNS, ZH_TURNS, conversation, make_settings, remote_settings
from tests.support.embedding_server import (
    InfinityServer,
    bundled_model_dir,
)
from tests.support.launch import free_port
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


def test_another_model_is_refused_naming_both_and_a_new_collection_rebuilds(
    tmp_path: Path, embedder: Embedder, infinity_b: InfinityServer
) -> None:
    first = build_services(make_settings(tmp_path), embedder=embedder)
    first.ingest.append(conversation("c", EN_TURNS + ZH_TURNS))
    until_idle(first, "c")
    stored = first.store.count(deleted=False)
    first.close()

    settings = remote_settings(tmp_path, infinity_b.url, embed_model="model-b")
    model_b = load_embedder(settings)
    with pytest.raises(FailedPrecondition) as refused:
        build_services(settings, embedder=model_b)
    message = str(refused.value)
    assert f"local model {BUNDLED_MODEL_NAME!r}" in message
    assert "openai model 'model-b'" in message
    assert "MEMSVC_COLLECTION" in message

    # The documented way over: a new collection, rebuilt from the log by the new model.
    renamed = remote_settings(
        tmp_path, infinity_b.url, embed_model="model-b", collection="chunks_model_b"
    )
    with capture_logs() as logs:
        rebuilt = build_services(renamed, embedder=model_b)
    try:
        assert any(e["event"] == "store_changed_reindexing" for e in logs)
        assert until_idle(rebuilt, "c", timeout_s=120).state == "idle"
        assert rebuilt.store.count(deleted=False) == stored
        hits = rebuilt.search.search(SearchRequest("酒店", 6, SearchFilters(("c",)))).hits
        assert hits and all(h.chunk_id for h in hits)
    finally:
        rebuilt.close()


def test_new_weights_under_the_same_local_name_are_refused_and_the_cache_forgets(
    tmp_path: Path,
) -> None:
    """A model directory whose weights changed: same name, same dimension, another
    fingerprint. The start is refused (a child `memsvc serve` exits saying why); with a
    new collection it starts, and the cache drops the old weights' vectors."""
    model_dir = tmp_path / "model"
    shutil.copytree(bundled_model_dir(), model_dir)
    data = tmp_path / "data"
    settings = make_settings(data, embed_model=str(model_dir), embed_fallback=False)
    first = build_services(settings)
    first.ingest.append(conversation("c", EN_TURNS))
    until_idle(first, "c")
    first.close()
    perturbed_copy(model_dir)

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "memsvc",
            "serve",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--data-dir",
            str(data),
        ],
        env={
            **_env(),
            "MEMSVC_EMBED_MODEL": str(model_dir),
            "MEMSVC_EMBED_FALLBACK": "false",
            "MEMSVC_METRICS_LISTEN": "",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "cosine" in done.stderr and "MEMSVC_COLLECTION" in done.stderr, done.stderr[-3000:]

    with capture_logs() as logs:
        renamed = build_services(settings.model_copy(update={"collection": "chunks_v2"}))
    try:
        dropped = next(e for e in logs if e["event"] == "embed_cache_model_changed")
        assert dropped["dropped_vectors"] > 0
        assert until_idle(renamed, "c", timeout_s=120).state == "idle"
    finally:
        renamed.close()


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "TQDM_DISABLE": "1"}
