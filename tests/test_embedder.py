from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from memsvc.embedder import (
    BUNDLED_MODEL_NAME,
    Embedder,
    EmbeddingCache,
    embed_passages_cached,
    load_embedder,
)
from memsvc.errors import EmbedderError
from tests.conftest import make_settings


def test_bundled_model_dims_and_normalised(embedder: Embedder) -> None:
    assert embedder.name == BUNDLED_MODEL_NAME and embedder.dim == 384
    assert embedder.info.pooling == "mean"
    vecs = embedder.encode_passages(["a cat sat on the mat", "我的护照在抽屉里"])
    assert vecs.shape == (2, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_lean_query_path_matches_flagembedding(embedder: Embedder) -> None:
    queries = [
        "where is my passport",
        "她喜欢画日落",
        "a much longer query about hiking near Lake Tahoe in spring",
    ]
    ours = embedder.encode_queries(queries)
    reference = np.asarray(embedder._flag.encode_queries(queries), dtype=np.float32)
    cosines = np.sum(ours * reference, axis=1)
    assert np.all(cosines > 0.9999)


def test_passage_path_matches_flagembedding(embedder: Embedder) -> None:
    passages = ["short", "a cat sat on the mat " * 5, "我的护照在抽屉里。" * 10, "long text " * 400]
    ours = embedder.encode_passages(passages)
    reference = np.asarray(embedder._flag.encode_corpus(passages, max_length=512), dtype=np.float32)
    assert np.all(np.sum(ours * reference, axis=1) > 0.9999)


def test_similar_texts_are_closer(embedder: Embedder) -> None:
    q = embedder.encode_queries(["where did I leave my passport"])[0]
    p = embedder.encode_passages(
        ["Your passport is in the desk drawer.", "The weather is sunny today."]
    )
    assert p[0] @ q > p[1] @ q


def test_fallback_to_bundled_model_is_fast_and_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start = time.perf_counter()
    loaded = load_embedder(make_settings(tmp_path, embed_model="BAAI/bge-small-zh-v1.5"))
    assert time.perf_counter() - start < 60  # no network time-out loop
    assert loaded.info.fallback and loaded.name == BUNDLED_MODEL_NAME


def test_no_fallback_is_an_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(RuntimeError, match="fallback is off"):
        load_embedder(make_settings(tmp_path, embed_model=missing, embed_fallback=False))


def test_cache_skips_the_model(tmp_path: Path, embedder: Embedder) -> None:
    cache = EmbeddingCache(tmp_path / "cache.sqlite")
    texts = ["first text", "second text", "first text"]
    first = embed_passages_cached(embedder, cache, texts)
    embedder.fault = RuntimeError("model must not run")
    try:
        again = embed_passages_cached(embedder, cache, texts)
        with pytest.raises(EmbedderError):
            embed_passages_cached(embedder, cache, ["an unseen text"])
    finally:
        embedder.fault = None
    assert np.array_equal(first, again)
    assert np.array_equal(first[0], first[2])


def test_query_batcher_matches_direct_encoding(embedder: Embedder) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from memsvc.embedder import QueryBatcher

    batcher = QueryBatcher(embedder)
    queries = [f"question number {i} about passports and trips" for i in range(16)]
    try:
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(batcher.encode, queries))
    finally:
        batcher.close()
    direct = embedder.encode_queries(queries)
    assert np.all(np.sum(np.stack(got) * direct, axis=1) > 0.9999)
