"""Model caches for tests of a start's own steps: copies of the session's files of the
bundled model (its ONNX export, torch's vectors of the probes, the tokenizer's record, the
machine's timings), so that a test pays only for the steps it is about."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from memsvc.embedding.backends import EXPORT_NAME, REFERENCE_NAME
from memsvc.embedding.model import BUNDLED_MODEL_NAME, bundled_model_path, files_key


def cache_with(cache: Path, names: Sequence[str] = (EXPORT_NAME, REFERENCE_NAME)) -> Path:
    """`cache` holding the session's `names` for the bundled model (by default the export
    and torch's vectors of the probes, no timings: a start there times the runtimes and
    loads the model in full, but does not export it again). Needs the session's model
    (the `embedder` fixture), which made them."""
    key = files_key(bundled_model_path(), BUNDLED_MODEL_NAME)
    shared = Path(os.environ["MEMSVC_MODEL_CACHE_DIR"]) / key
    export_dir = cache / key
    export_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy2(shared / name, export_dir / name)
    return cache
