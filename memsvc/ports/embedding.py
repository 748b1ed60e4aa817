"""The embedder, the query encoder and the embedding cache."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from memsvc.domain.chunking import TokenCounter
from memsvc.domain.model_identity import ModelIdentity
from memsvc.domain.records import ModelInfo


class Embedder(Protocol):
    """Texts to L2-normalised float32 vectors, and the model's token counts: a model in
    this process or a remote embedding server."""

    info: ModelInfo
    batch_size: int
    identity: ModelIdentity  # provider, name, dimension, fingerprint of what it writes

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    @property
    def tokenizer_id(self) -> str: ...

    def available(self) -> bool:
        """False while a remote server is known to be failing (its circuit open): index
        steps wait for it rather than spend attempts."""
        ...

    def ping(self, timeout_s: float) -> bool:
        """Whether the embedder answers now: a remote server is asked for one short
        embedding unless a call succeeded within the last `timeout_s` (health checks)."""
        ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]: ...

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray: ...

    def probe(self, texts: Sequence[str]) -> np.ndarray:
        """Passage vectors for the model identity's probe texts, left out of the counters
        of callers' work (a restart embeds them and nothing else)."""
        ...

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray: ...


@runtime_checkable
class PartPooling(Protocol):
    """An embedder that also pools parts of a text from the forward pass that embeds it
    (memsvc.embedding.parts): a model in this process. A remote server returns pooled
    vectors only."""

    def encode_passage_parts(
        self, texts: Sequence[str], starts: Sequence[Sequence[int]]
    ) -> tuple[np.ndarray, list[np.ndarray | None]]:
        """Each text's vector and its parts' vectors (part i from character starts[i] to
        the next start); None for a text whose parts cannot be pooled."""
        ...


@runtime_checkable
class PortableTokenCounts(Protocol):
    """An embedder whose token counter another process can take (it pickles), counting
    as its `count_tokens` does: render processes (memsvc.services.render_processes) lay
    out chunks with it."""

    def token_counts(self) -> TokenCounter: ...


class QueryEncoder(Protocol):
    """One query's vector (concurrent queries may share a forward pass)."""

    def encode(self, text: str) -> np.ndarray: ...

    def close(self) -> None: ...


class EmbeddingCache(Protocol):
    """Passage vectors by (model, text hash): unchanged text never runs the model again."""

    def get_many(self, model: str, hashes: Sequence[str]) -> dict[str, np.ndarray]: ...

    def put_many(self, model: str, items: Mapping[str, np.ndarray]) -> None: ...

    def forget(self, hashes: Sequence[str]) -> None:
        """Erase the vectors of these texts, for every model (privacy purge)."""
        ...

    def forget_model(self, model: str) -> int:
        """Drop every vector kept under `model` (another model now answers to the name)."""
        ...

    def erase(self) -> None:
        """Leave no forgotten vector in the cache's files."""
        ...

    def close(self) -> None: ...
