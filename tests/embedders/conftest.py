"""One Infinity server of the bundled model for the embedders suite (make test-embedders)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.embedding_server import REMOTE_MODEL_NAME, InfinityServer, bundled_model_dir


@pytest.fixture(scope="session")
def infinity(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InfinityServer]:
    log = tmp_path_factory.mktemp("infinity") / "infinity.log"
    server = InfinityServer(bundled_model_dir(), REMOTE_MODEL_NAME, log=log).start()
    yield server
    server.stop()
