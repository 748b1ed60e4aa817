"""Files of the model cache (the export's tuning, tokenizer and reference records): each
written whole, by a rename, so that a reader (another server starting on the same cache)
never sees half of one. A cache that cannot be written costs work at the next start (a
measurement, a full load), nothing more."""

from __future__ import annotations

import os
from pathlib import Path


def write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file beside it (best effort)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(text)
        os.replace(partial, path)
    except OSError:
        pass
