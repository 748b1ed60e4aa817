from __future__ import annotations

import importlib
import math
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memsvc.domain.errors import EmbedderError
from memsvc.embedding.backends import Batch, ModelBackend
from memsvc.embedding.loading import _load_flag_model
from memsvc.embedding.model import (
    BUNDLED_MODEL_NAME,
    Embedder,
    bundled_model_path,
    passage_batches,
)
from memsvc.embedding.providers import load_embedder
from memsvc.services.embedder_watch import EmbedderWatch
from memsvc.services.vectors import embed_passages_cached
from memsvc.storage.sqlite import open_cache
from memsvc.transports.grpc.server import StoppedDuringStartup
from tests.conftest import EN_TURNS, ZH_TURNS, make_settings
from tests.support.faults import failing_model

# the module's shared fixture starts once: every test of it on one worker (make test: loadgroup)
pytestmark = pytest.mark.xdist_group("embedder-module")


def test_bundled_model_dims_and_normalised(embedder: Embedder) -> None:
    assert embedder.name == BUNDLED_MODEL_NAME and embedder.dim == 384
    assert embedder.info.pooling == "mean"
    vecs = embedder.encode_passages(["a cat sat on the mat", "我的护照在抽屉里"])
    assert vecs.shape == (2, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


@pytest.fixture(scope="module")
def flag_model() -> Any:
    """FlagEmbedding's own encoder of the bundled model: the reference for our lean paths
    (and, through them, for the ONNX backend the session's embedder runs on)."""
    path = bundled_model_path()
    return _load_flag_model(str(path), "mean", None, 16)


def test_lean_query_path_matches_flagembedding(embedder: Embedder, flag_model: Any) -> None:
    queries = [
        "where is my passport",
        "她喜欢画日落",
        "a much longer query about hiking near Lake Tahoe in spring",
    ]
    ours = embedder.encode_queries(queries)
    reference = np.asarray(flag_model.encode_queries(queries), dtype=np.float32)
    cosines = np.sum(ours * reference, axis=1)
    assert np.all(cosines > 0.9999)


def test_passage_path_matches_flagembedding(embedder: Embedder, flag_model: Any) -> None:
    passages = ["short", "a cat sat on the mat " * 5, "我的护照在抽屉里。" * 10, "long text " * 400]
    ours = embedder.encode_passages(passages)
    reference = np.asarray(flag_model.encode_corpus(passages, max_length=512), dtype=np.float32)
    assert np.all(np.sum(ours * reference, axis=1) > 0.9999)


@given(
    st.lists(st.integers(1, 600), max_size=60),
    st.integers(1, 32),
    st.integers(1, 2048),
)
def test_passage_batches_cover_every_text_once_within_the_budget(
    lengths: list[int], max_texts: int, max_tokens: int
) -> None:
    lengths = sorted(lengths, reverse=True)
    runs = passage_batches(lengths, max_texts, max_tokens)
    assert [i for a, b in runs for i in range(a, b)] == list(range(len(lengths)))
    for a, b in runs:
        assert 1 <= b - a <= max_texts
        # padded to the run's longest (first) text; only a lone text may exceed the budget
        assert (b - a) * lengths[a] <= max_tokens or b - a == 1


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
    # the multilingual model by default (MEMSVC_EMBED_FALLBACK_MODEL; tests/test_e5.py)
    assert loaded.info.fallback and loaded.name == "intfloat/multilingual-e5-small"
    assert "embed_model_fallback" in capsys.readouterr().out


@pytest.mark.parametrize(
    "step",
    [
        "memsvc.embedding.loading._load_flag_model",
        "memsvc.embedding.backends._checked_onnx",
        "memsvc.embedding.verified_export.OnnxBackend",  # a start on the verified export
    ],
)
def test_a_stop_signal_during_the_load_is_not_taken_for_a_load_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str, embedder: Embedder
) -> None:
    """SIGTERM while the model loaded landed in a fallback's `except Exception`: the server
    loaded the bundled model (or torch) instead, served, and only then stopped."""
    if "verified_export" not in step:  # a full load: the session's record of torch's
        monkeypatch.setattr(  # vectors is not found, so the model is loaded
            "memsvc.embedding.verified_export.recorded_reference", lambda export_dir: None
        )

    module, _, name = step.rpartition(".")
    real = getattr(importlib.import_module(module), name)
    signalled = [False]

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        if not signalled[0]:  # the signal arrives once; a fallback's second try would load
            signalled[0] = True
            raise StoppedDuringStartup("SIGTERM")
        return real(*args, **kwargs)

    monkeypatch.setattr(step, interrupted)
    # (forced: whichever runtimes this machine's record chose, the start is on the export)
    backend = "onnx" if "verified_export" in step else "auto"
    with pytest.raises(StoppedDuringStartup):
        load_embedder(make_settings(tmp_path, embed_backend=backend))


def test_no_fallback_is_an_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(RuntimeError, match="fallback is off"):
        load_embedder(make_settings(tmp_path, embed_model=missing, embed_fallback=False))


def test_an_offline_hub_is_not_dialled(tmp_path: Path) -> None:
    # issue 84: with HF_HUB_OFFLINE set, a start still waited on a connection to the hub
    import socket
    import subprocess
    import sys

    with socket.socket() as hub:
        hub.bind(("127.0.0.1", 0))
        hub.listen()
        hub.settimeout(0.5)
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "HF_ENDPOINT": f"http://127.0.0.1:{hub.getsockname()[1]}",
            "HF_HOME": str(tmp_path / "hf"),
        }
        run = subprocess.run(
            [
                sys.executable,
                "-c",
                "from memsvc.embedding.loading import resolve_model_dir;"
                " resolve_model_dir('org/not-here')",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert "HF_HUB_OFFLINE is set" in run.stderr, run.stderr
        with pytest.raises(TimeoutError):
            hub.accept()  # nothing dialled it


def test_cache_skips_the_model(tmp_path: Path, embedder: Embedder) -> None:
    cache = open_cache(tmp_path)
    texts = ["first text", "second text", "first text"]
    first = embed_passages_cached(embedder, cache, texts)
    with failing_model(embedder, "model must not run"):
        again = embed_passages_cached(embedder, cache, texts)
        with pytest.raises(EmbedderError):
            embed_passages_cached(embedder, cache, ["an unseen text"])
    assert np.array_equal(first, again)
    assert np.array_equal(first[0], first[2])


def test_query_batcher_matches_direct_encoding(embedder: Embedder) -> None:
    from memsvc.embedding.batching import QueryBatcher

    batcher = QueryBatcher(embedder)
    queries = [f"question number {i} about passports and trips" for i in range(16)]
    try:
        with ThreadPoolExecutor(8) as pool:
            got = list(pool.map(batcher.encode, queries))
    finally:
        batcher.close()
    direct = embedder.encode_queries(queries)
    assert np.all(np.sum(np.stack(got) * direct, axis=1) > 0.9999)


# -- backends ----------------------------------------------------------------------------------
PARITY_TEXTS = [
    "where did I leave my passport",
    "她喜欢画日落",
    "User (Caroline): I adopted a puppy named Biscuit. " * 20,
    "x",
]


def test_session_embedder_runs_on_the_measured_runtimes(embedder: Embedder) -> None:
    # auto runs each path on the runtime measured fastest here (tests/test_tuning.py);
    # queries run on a backend of their own, so they never wait behind passage batches
    assert embedder.tuning is not None and not embedder.tuning.forced
    assert embedder.backend.name == embedder.tuning.passage
    assert embedder.query_backend.name == embedder.tuning.query
    assert embedder.runtime_label == embedder.tuning.label()
    assert embedder.query_backend is not embedder.backend


class _HeldBackend:
    """Passage batches wait until released; queries go to the real query session."""

    def __init__(self, real: ModelBackend) -> None:
        self.name = real.name
        self._real = real
        self.entered = threading.Event()
        self.release = threading.Event()

    def encode(self, batch: Batch) -> np.ndarray:
        return self.encode_states(batch)[0]

    def encode_states(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        self.entered.set()
        self.release.wait(60)
        return self._real.encode_states(batch)

    def for_queries(self) -> ModelBackend:
        return self._real.for_queries()


def test_queries_do_not_wait_behind_passage_batches(embedder: Embedder) -> None:
    # A search during a large upsert used to queue on the model lock for the whole upsert.
    real, queries = embedder.backend, embedder.query_backend
    held = _HeldBackend(real)
    embedder.use_backend(held, queries)
    try:
        with ThreadPoolExecutor(1) as pool:
            passages = pool.submit(embedder.encode_passages, ["a long upsert"] * 4)
            assert held.entered.wait(60)
            query = embedder.encode_queries(["where is my passport?"])  # not blocked
            assert not passages.done()
            held.release.set()
            assert passages.result(60).shape == (4, 384)
    finally:
        held.release.set()
        embedder.use_backend(real, queries)
    assert query.shape == (1, 384)


def test_onnx_backend_matches_torch(tmp_path: Path, embedder: Embedder) -> None:
    on_torch = load_embedder(make_settings(tmp_path, embed_backend="torch"))
    assert on_torch.backend.name == "torch"
    for encode in ("encode_passages", "encode_queries"):
        a = getattr(embedder, encode)(PARITY_TEXTS)
        b = getattr(on_torch, encode)(PARITY_TEXTS)
        assert np.min(np.sum(a * b, axis=1)) >= 0.999


def test_fresh_export_is_checked_and_reused(tmp_path: Path) -> None:
    cache = tmp_path / "models"
    first = load_embedder(make_settings(tmp_path, embed_backend="onnx", model_cache_dir=cache))
    exports = list(cache.glob("*/model.onnx"))
    assert first.backend.name == "onnx" and len(exports) == 1
    # ONNX Runtime's fusions made each of MiniLM's six layers one Attention node
    assert _op_types(exports[0]).count("Attention") == 6
    stamp = exports[0].stat().st_mtime_ns
    again = load_embedder(make_settings(tmp_path, embed_backend="onnx", model_cache_dir=cache))
    assert again.backend.name == "onnx" and exports[0].stat().st_mtime_ns == stamp
    # a damaged export (a disk error, a killed copy) is made again, not trusted
    exports[0].write_bytes(b"not a model")
    repaired = load_embedder(make_settings(tmp_path, embed_backend="onnx", model_cache_dir=cache))
    assert repaired.backend.name == "onnx" and exports[0].stat().st_size > 1_000_000
    texts = ["a damaged export is rebuilt"]
    assert np.allclose(repaired.encode_queries(texts), first.encode_queries(texts), atol=1e-5)


def test_a_model_whose_attention_cannot_be_fused_gets_the_plain_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """MPNet's relative attention is no pattern ONNX Runtime's BERT fusions know: the dynamo
    export is made instead, and it reproduces the model."""
    import torch
    from transformers import MPNetConfig, MPNetModel

    model_dir = tmp_path / "tiny-mpnet"
    model_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (model_dir / name).write_bytes((bundled_model_path() / name).read_bytes())
    torch.manual_seed(0)
    config = MPNetConfig(
        vocab_size=30527,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
    )
    MPNetModel(config).save_pretrained(model_dir)
    cache = tmp_path / "models"
    settings = {"embed_model": str(model_dir), "embed_fallback": False, "model_cache_dir": cache}
    on_onnx = load_embedder(make_settings(tmp_path, embed_backend="onnx", **settings))
    on_torch = load_embedder(make_settings(tmp_path, embed_backend="torch", **settings))
    assert on_onnx.backend.name == "onnx" and on_onnx.dim == 32
    logged = capsys.readouterr()
    assert "onnx_fused_export_skipped" in logged.out + logged.err
    (export,) = cache.glob("*/model.onnx")
    assert "Attention" not in _op_types(export)
    a, b = on_onnx.encode_passages(PARITY_TEXTS), on_torch.encode_passages(PARITY_TEXTS)
    assert np.min(np.sum(a * b, axis=1)) >= 0.999


def _op_types(path: Path) -> list[str]:
    import onnx

    return [node.op_type for node in onnx.load(str(path)).graph.node]


def test_unusable_onnx_falls_back_to_torch_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("the model cache cannot live under a file")
    loaded = load_embedder(make_settings(tmp_path, model_cache_dir=blocked / "models"))
    assert loaded.backend.name == "torch"
    out = capsys.readouterr()
    assert "embed_backend_fallback" in out.out + out.err
    with pytest.raises(RuntimeError, match="MEMSVC_EMBED_BACKEND=onnx"):
        load_embedder(
            make_settings(tmp_path, embed_backend="onnx", model_cache_dir=blocked / "models")
        )


def test_a_served_models_tokens_are_counted_like_the_local_ones(embedder: Embedder) -> None:
    """The tokenizer.json of a model served elsewhere counts as the local tokenizer does:
    its exporter's truncation (128) and padding are off (they split every chunk)."""
    from memsvc.embedding.tokens import RemoteTokenizer, estimate_tokens

    texts = [*EN_TURNS, *ZH_TURNS, "word " * 600, "1, 2, 3!!! ok?"]
    exact = RemoteTokenizer.load(str(bundled_model_path()))
    assert exact.count(texts) == embedder.count_tokens(texts)
    # Without a tokenizer the estimate errs high, never low, on text like the service's.
    estimated = RemoteTokenizer().count(texts)
    assert estimated == [estimate_tokens(t) for t in texts]
    assert all(e >= n for e, n in zip(estimated, exact.count(texts), strict=True))


def test_a_failing_local_model_is_down_until_it_answers_again(embedder: Embedder) -> None:
    # readiness follows the model (issue 40): down from a failed forward pass until a
    # probe pass succeeds, however long that takes
    watch = EmbedderWatch(embedder, 0.1)
    assert watch.check() and watch.up
    with failing_model(embedder, "the model's runtime crashed"):
        with pytest.raises(EmbedderError):
            embedder.encode_queries(["where is my passport"])
        assert not watch.check() and not watch.check() and not watch.up
    assert watch.check() and watch.up


@given(st.text(max_size=200))
def test_the_token_estimate_is_the_one_logs_recorded(text: str) -> None:
    """The estimate counted with str methods (estimate-v1 unchanged: logs keep the counts
    they recorded with it) equals its definition, character by character."""
    from memsvc.embedding.tokens import estimate_tokens

    words = re.findall(r"[A-Za-z0-9]+", text)
    ascii_marks = sum(1 for ch in text if ch < "\x80" and not ch.isspace())
    other = sum(1 for ch in text if ch >= "\x80" and not ch.isspace())
    defined = sum(math.ceil(len(w) / 3) for w in words) + ascii_marks - sum(map(len, words))
    assert estimate_tokens(text) == defined + other


def test_forgetting_cached_vectors_looks_them_up_by_key_in_every_model(tmp_path: Path) -> None:
    """Regression (scale v3): a purge forgot its texts' vectors with a delete by text hash
    alone, which read the whole cache for each (0.3-3.9 s of a purge beside a million
    vectors). Now by (model, hash), the key, for every model that holds vectors."""
    import sqlite3

    from memsvc.storage.sql.cache import MODELS

    cache = open_cache(tmp_path)
    vector = np.ones(4, dtype=np.float32)
    for model in ("model-a", "model-b", "model-c"):
        cache.put_many(model, {h: vector for h in ("h1", "h2", "h3")})
    cache.forget(["h1", "h3"])
    for model in ("model-a", "model-b", "model-c"):
        assert set(cache.get_many(model, ["h1", "h2", "h3"])) == {"h2"}
    cache.close()
    db = sqlite3.connect(tmp_path / "embed_cache.sqlite")
    plans = [
        " ".join(str(row[-1]) for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", args))
        for sql, args in (
            (MODELS, ()),
            ("DELETE FROM vectors WHERE model = ? AND text_hash = ?", ("model-a", "h2")),
        )
    ]
    db.close()
    assert all("PRIMARY KEY" in plan for plan in plans), plans
    assert not any("SCAN vectors" in plan for plan in plans), plans
