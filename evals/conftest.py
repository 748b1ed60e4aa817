"""The LoCoMo evaluation: `make eval` (EVAL_FILE=path, default ../shared/eval/locomo-dev.json).

The data (CC BY-NC 4.0) is read from outside the repository and never copied into it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evals.locomo import Conversation, load_locomo
from tests.conftest import embedder, services  # noqa: F401  (fixtures shared with tests/)

DEFAULT_EVAL_FILE = Path(__file__).resolve().parents[2] / "shared" / "eval" / "locomo-dev.json"


@pytest.fixture(scope="session")
def locomo() -> list[Conversation]:
    path = Path(os.environ.get("EVAL_FILE") or DEFAULT_EVAL_FILE)
    if not path.is_file():
        pytest.fail(
            f"LoCoMo evaluation file not found: {path}. Set EVAL_FILE=/path/to/locomo-dev.json"
            " (make eval EVAL_FILE=...).",
            pytrace=False,
        )
    return load_locomo(path)
