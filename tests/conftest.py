"""Shared fixtures: the real bundled model (loaded once), real Milvus Lite in temp dirs."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

os.environ.setdefault("TQDM_DISABLE", "1")
# One ONNX export of the bundled model for every server the tests start (in-process and
# child processes), kept between runs: an export takes ~10 s, the parity check at each load
# still guards it. Tests of the export itself use their own cache dirs.
os.environ.setdefault(
    "MEMSVC_MODEL_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"memsvc-test-model-cache-{os.getuid()}"),
)

from memsvc.app import Services, build_services
from memsvc.config import Settings
from memsvc.domain.types import MemoryEvent
from memsvc.embedding.e5 import E5Embedder
from memsvc.embedding.model import BUNDLED_MODEL_NAME, Embedder
from memsvc.embedding.providers import load_embedder
from tests.support.postgres import PostgresCluster

# Machines here are shared and their speed varies up to 3x: Hypothesis's own timing checks
# (200 ms an example, slow input generation) are timing assertions there. A lone make test
# beside a CI run failed once on "input generation is slow" (one draw took 1.3 s).
hypothesis_settings.register_profile(
    "memsvc", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile("memsvc")

# What serves the local model's two paths (status, memsvc_build_info): one runtime, or each
# path's when the measurement chose two (memsvc.embedding.tuning).
RUNTIME_LABEL = r"^(onnx|torch)$|^query=(onnx|torch),passage=(onnx|torch)$"


def make_settings(data_dir: Path, **kw: object) -> Settings:
    base: dict[str, object] = {
        "listen": "127.0.0.1:0",
        "data_dir": data_dir,
        "embed_model": BUNDLED_MODEL_NAME,
        "log_format": "json",
    }
    base.update(kw)
    return Settings(**base)  # type: ignore[arg-type]


def remote_settings(data_dir: Path, url: str, **kw: object) -> Settings:
    """The bundled model served by an OpenAI-compatible server (Infinity in tests), with
    its tokenizer for exact token counts."""
    from tests.support.embedding_server import REMOTE_MODEL_NAME, bundled_model_dir

    base: dict[str, object] = {
        "embed_provider": "openai",
        "embed_url": url,
        "embed_model": REMOTE_MODEL_NAME,
        "embed_tokenizer": str(bundled_model_dir()),
    }
    base.update(kw)
    return make_settings(data_dir, **base)


@pytest.fixture(scope="session")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Embedder:
    """The bundled model in this process; or, with MEMSVC_TEST_EMBED_URL set (make
    test-embedders), the same model behind a real OpenAI-compatible server, so the same
    search and integrity suites run through either provider."""
    url = os.environ.get("MEMSVC_TEST_EMBED_URL")
    if url:
        return load_embedder(remote_settings(tmp_path_factory.mktemp("model"), url))  # type: ignore[return-value]
    return load_embedder(make_settings(tmp_path_factory.mktemp("model")))  # type: ignore[return-value]


@pytest.fixture(scope="session")
def e5(tmp_path_factory: pytest.TempPathFactory) -> E5Embedder:
    """The bundled multilingual model in this process (multilingual-e5-small)."""
    loaded = load_embedder(
        make_settings(tmp_path_factory.mktemp("e5"), embed_model="multilingual-e5-small")
    )
    assert isinstance(loaded, E5Embedder)
    return loaded


@pytest.fixture()
def services(tmp_path: Path, embedder: Embedder) -> Iterator[Services]:
    svc = build_services(make_settings(tmp_path), embedder=embedder)
    yield svc
    svc.close()


# -- both event-log backends -------------------------------------------------------------------
_CLUSTERS: list[PostgresCluster] = []  # the worker's `postgres`, once a test has used it


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    """A real PostgreSQL server (one per pytest worker), started on first use."""
    cluster = PostgresCluster().start()
    _CLUSTERS.append(cluster)
    yield cluster
    _CLUSTERS.remove(cluster)
    cluster.destroy()


@pytest.fixture(autouse=True)
def _drop_the_tests_databases() -> Iterator[None]:
    """Drops the databases a test made once it is done (its other fixtures are torn down
    first): kept, a suite's ~300 filled a CI machine's disk. A module's shared server keeps
    its database: wider fixtures are set up before this one, so theirs were made before."""
    made_before = {id(c): len(c.created) for c in _CLUSTERS}
    yield
    for cluster in _CLUSTERS:
        cluster.drop_databases(cluster.created[made_before.get(id(cluster), 0) :])


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> dict[str, object]:
    """Settings of an event-log backend: SQLite in the data dir, or a new PostgreSQL
    database (the same one for every start within the test)."""
    if request.param == "sqlite":
        return {}
    cluster: PostgresCluster = request.getfixturevalue("postgres")
    return {"database_url": cluster.create_database()}


@pytest.fixture()
def services_on_both(
    tmp_path: Path, embedder: Embedder, backend: dict[str, object]
) -> Iterator[Services]:
    svc = build_services(make_settings(tmp_path, **backend), embedder=embedder)
    yield svc
    svc.close()


def turn(
    conv: str,
    turn_id: int,
    text: str,
    speaker: str | None = None,
    ts: str | None = None,
    **kw: object,
) -> MemoryEvent:
    return MemoryEvent(
        conversation_id=conv,
        turn_id=turn_id,
        speaker=speaker or ("user" if turn_id % 2 == 0 else "assistant"),
        text=text,
        timestamp=ts or f"2026-02-02T10:{turn_id % 60:02d}:00+08:00",
        **kw,  # type: ignore[arg-type]
    )


ZH_TURNS = [
    "我下周要去东京旅行，护照放哪里了？",
    "你的护照在书桌左边的抽屉里。",
    "谢谢！我还想订一家新宿附近的酒店。",
    "好的，我帮你看看新宿附近的酒店。",
    "我喜欢安静一点的房间。",
    "明白了，我会优先选择安静的房间。",
]
EN_TURNS = [
    "Hi! I just adopted a puppy named Biscuit.",
    "Congratulations! What breed is Biscuit?",
    "She's a golden retriever. I'm planning to take her hiking next week.",
    "That sounds fun. Remember to bring water for her.",
    "My favorite trail is near Lake Tahoe.",
    "Lake Tahoe is beautiful in the spring.",
]


def conversation(conv: str, texts: list[str], start: int = 0) -> list[MemoryEvent]:
    return [turn(conv, start + i, t) for i, t in enumerate(texts)]
