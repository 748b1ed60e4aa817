"""A start on the verified ONNX export (memsvc.embedding.verified_export): once a full start
has checked the export against torch, and the machine's record puts ONNX on both paths, a
start loads the tokenizer's record and the export only (no FlagEmbedding, no transformers,
no torch), embeds as the full start does, and still checks the export, against torch's
recorded vectors, and the tokenizer, against the recorded ids of the probes; whatever does
not match is a full start, which checks against torch itself and records again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from memsvc.embedding import tuning
from memsvc.embedding.backends import (
    EXPORT_NAME,
    PARITY_PROBES,
    REFERENCE_NAME,
    recorded_reference,
)
from memsvc.embedding.model import BUNDLED_MODEL_NAME, Embedder, bundled_model_path, files_key
from memsvc.embedding.providers import load_embedder
from memsvc.embedding.recorded_tokenizer import RECORD_NAME, read_record
from tests.conftest import make_settings
from tests.support.model_cache import cache_with

# the session model's export is this module's source: one worker (make test: loadgroup)
pytestmark = pytest.mark.xdist_group("embedder-module")

TEXTS = ["where did I leave my passport", "她喜欢画日落", "x", "User (Caroline): hi. " * 40]


def _cache(tmp_path: Path, query: str = "onnx", passage: str = "onnx") -> Path:
    """A model cache holding the session's verified export and torch's vectors of the
    probes, and a record of this machine that chose `query` and `passage`."""
    key = files_key(bundled_model_path(), BUNDLED_MODEL_NAME)
    export_dir = cache_with(tmp_path / "models", (EXPORT_NAME, REFERENCE_NAME, RECORD_NAME)) / key
    cores = tuning.usable_cores()
    machine = tuning.machine_facts(key, {"torch": cores, "onnx": cores})
    chosen = {"query": query, "passage": passage}
    timings = {r: {p: 1.0 if chosen[p] == r else 2.0 for p in chosen} for r in ("torch", "onnx")}
    tuning.save(export_dir / "tuning.json", tuning.Tuning(query, passage, timings, machine, "t"))
    return tmp_path / "models"


def _logged(capsys: pytest.CaptureFixture[str]) -> str:
    out = capsys.readouterr()
    return out.out + out.err


_CHILD = """
import json, sys
from pathlib import Path
from memsvc.config import Settings
from memsvc.embedding.providers import load_embedder
texts = json.loads(sys.argv[3])
e = load_embedder(Settings(listen="127.0.0.1:0", data_dir=Path(sys.argv[1]),
                           embed_model=sys.argv[4], model_cache_dir=Path(sys.argv[2])))
print(json.dumps({
    "loaded": sorted(
        m for m in ("FlagEmbedding", "peft", "transformers", "torch") if m in sys.modules
    ),
    "runtime": e.runtime_label, "tokenizer": e.tokenizer_id, "info": repr(e.info),
    "fingerprint": e.identity.fingerprint,
    "queries": e.encode_queries(texts).tolist(), "passages": e.encode_passages(texts).tolist(),
}))
"""


def test_a_start_on_the_verified_export_loads_neither_transformers_nor_torch_and_embeds_alike(
    tmp_path: Path, embedder: Embedder
) -> None:
    cache = _cache(tmp_path)
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            str(tmp_path),
            str(cache),
            json.dumps(TEXTS),
            BUNDLED_MODEL_NAME,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "torch's recorded vectors" in run.stdout + run.stderr  # still checked
    child = json.loads(run.stdout.splitlines()[-1])
    assert child["loaded"] == [] and child["runtime"] == "onnx"
    # the full start on the same export: the same model, to the last bit
    (cache / files_key(bundled_model_path(), BUNDLED_MODEL_NAME) / REFERENCE_NAME).unlink()
    full = load_embedder(make_settings(tmp_path, model_cache_dir=cache))
    assert (child["tokenizer"], child["info"]) == (full.tokenizer_id, repr(full.info))
    assert child["fingerprint"] == full.identity.fingerprint
    assert np.allclose(child["queries"], full.encode_queries(TEXTS), atol=1e-6)
    assert np.allclose(child["passages"], full.encode_passages(TEXTS), atol=1e-6)


def test_an_export_that_does_not_reproduce_the_record_is_checked_against_torch(
    tmp_path: Path, embedder: Embedder, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = _cache(tmp_path)
    export_dir = next(cache.iterdir())
    torch_vectors = recorded_reference(export_dir)
    assert torch_vectors is not None and torch_vectors.shape[0] == len(PARITY_PROBES)
    record = json.loads((export_dir / REFERENCE_NAME).read_text())
    record["vectors"] = (-torch_vectors).tolist()  # what another model would have given
    (export_dir / REFERENCE_NAME).write_text(json.dumps(record))
    capsys.readouterr()
    loaded = load_embedder(make_settings(tmp_path, model_cache_dir=cache))
    logged = _logged(capsys)
    assert "embed_export_unverified" in logged and "torch's recorded vectors" not in logged
    assert loaded.runtime_label == "onnx"  # the export matched torch itself: kept
    rewritten = recorded_reference(export_dir)
    assert rewritten is not None and np.allclose(rewritten, torch_vectors, atol=1e-6)
    # with the record whole again, the next start is on the export alone
    load_embedder(make_settings(tmp_path, model_cache_dir=cache))
    assert "torch's recorded vectors" in _logged(capsys)


@pytest.mark.parametrize(
    ("query", "passage", "backend"),
    [("torch", "onnx", "auto"), ("onnx", "torch", "auto"), ("onnx", "onnx", "torch")],
)
def test_a_path_on_torch_loads_the_model(
    tmp_path: Path,
    embedder: Embedder,
    capsys: pytest.CaptureFixture[str],
    query: str,
    passage: str,
    backend: str,
) -> None:
    cache = _cache(tmp_path, query, passage)
    capsys.readouterr()
    loaded = load_embedder(make_settings(tmp_path, model_cache_dir=cache, embed_backend=backend))
    assert "torch's recorded vectors" not in _logged(capsys)
    if backend == "torch":
        assert loaded.runtime_label == "torch"
    else:
        assert (loaded.query_backend.name, loaded.backend.name) == (query, passage)


def test_a_forced_onnx_start_needs_no_record_of_the_machine(
    tmp_path: Path, embedder: Embedder, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = _cache(tmp_path, "torch", "torch")  # a record of torch: MEMSVC_EMBED_BACKEND wins
    capsys.readouterr()
    loaded = load_embedder(make_settings(tmp_path, model_cache_dir=cache, embed_backend="onnx"))
    assert "torch's recorded vectors" in _logged(capsys)
    assert loaded.runtime_label == "onnx" and loaded.tuning is not None and loaded.tuning.forced


def _damaged_records() -> list[tuple[str, object]]:
    return [
        ("stack", {"transformers": "0.0.1", "tokenizers": "0.0.1"}),  # another install
        ("probe_ids", [[101, 102]] * len(PARITY_PROBES)),  # ids it no longer gives
        ("backend", "{not a tokenizer"),
        ("format", 0),
    ]


@pytest.mark.parametrize(("field", "value"), _damaged_records(), ids=lambda x: str(x)[:12])
def test_a_tokenizer_record_that_does_not_hold_is_a_full_start_that_records_again(
    tmp_path: Path,
    embedder: Embedder,
    capsys: pytest.CaptureFixture[str],
    field: str,
    value: object,
) -> None:
    cache = _cache(tmp_path)
    export_dir = next(cache.iterdir())
    whole = read_record(export_dir)
    assert whole is not None
    data = json.loads((export_dir / RECORD_NAME).read_text())
    data[field] = value
    (export_dir / RECORD_NAME).write_text(json.dumps(data))
    capsys.readouterr()
    loaded = load_embedder(make_settings(tmp_path, model_cache_dir=cache))
    assert "torch's recorded vectors" not in _logged(capsys)  # the full start
    assert loaded.tokenizer_id == embedder.tokenizer_id
    assert read_record(export_dir) == whole  # written again by the full start
