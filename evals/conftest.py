"""The LoCoMo evaluation: `make eval` (EVAL_FILE=path, default ../shared/eval/locomo-dev.json).

The data (CC BY-NC 4.0) is read from outside the repository and never copied into it. The
figures a check measures (`record_property`) are printed at the end, from whichever worker
ran it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

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


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            for name, value in getattr(report, "user_properties", ()):
                terminalreporter.write_line(f"{name}: {value}")
