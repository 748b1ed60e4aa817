"""Fault injection for tests: a model backend that fails, swapped in for a while."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from memsvc.domain.errors import EmbedderError
from memsvc.embedding.backends import BackendName, Batch
from memsvc.embedding.model import Embedder


class FailingBackend:
    """Every forward pass fails as the real backends report a runtime error."""

    def __init__(self, cause: str, name: BackendName = "torch") -> None:
        self.cause = cause
        self.name = name

    def encode(self, batch: Batch) -> np.ndarray:
        raise EmbedderError(f"embedding failed: {self.cause}")

    def encode_states(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        raise EmbedderError(f"embedding failed: {self.cause}")

    def for_queries(self) -> FailingBackend:
        return self


@contextmanager
def failing_model(embedder: Embedder, cause: str) -> Iterator[None]:
    """The model fails until the block ends."""
    healthy, queries = embedder.backend, embedder.query_backend
    embedder.use_backend(FailingBackend(cause, healthy.name))
    try:
        yield
    finally:
        embedder.use_backend(healthy, queries)
