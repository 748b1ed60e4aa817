"""Runtimes for the embedding model's forward pass: torch, or ONNX Runtime on the same weights.

FlagEmbedding loads the model (the loader of record); a backend turns one padded batch of
token ids into pooled, L2-normalised float32 vectors, and on request the token states
they were pooled from (parts of a text pooled on their own: memsvc.embedding.parts). The
ONNX backend is the torch model exported once into the model cache (attention fused where
ONNX Runtime can; pooling and normalisation inside the graph, the token states a second
output), and is used only if it reproduces the torch vectors on a
fixed probe set (cosine >= PARITY_MIN_COSINE): torch's own at a full load, as recorded
beside the export at a start on the export alone (memsvc.embedding.verified_export).
Which one runs each path is measured on the machine (memsvc.embedding.tuning).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import io
import json
import logging
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import structlog

from memsvc.domain.errors import EmbedderError
from memsvc.embedding.cache_files import write_whole

log = structlog.get_logger(__name__)

BackendName = Literal["torch", "onnx"]
PARITY_MIN_COSINE = 0.999
# Bumped when the exported graph changes, so old exports in a cache are not reused.
EXPORT_FORMAT = 3
# Texts the ONNX graph must reproduce: scripts, lengths and padding the service sees.
PARITY_PROBES = (
    "where is my passport?",
    "我下周要去东京，护照放哪了？",
    "[Context: 2026-02-02, Caroline and Melanie discussing adoption, painting]\n"
    "User (Caroline): I adopted a puppy named Biscuit last weekend.",
    "ok",
    "A longer passage about hiking near Lake Tahoe in the spring, " * 12,
    "她喜欢在周末画日落，也喜欢和朋友一起去海边散步。" * 6,
)

# The ONNX export in its directory of the model cache, and torch's vectors of the probe
# texts kept beside it (they verified it).
EXPORT_NAME = "model.onnx"
REFERENCE_NAME = "torch-probes.json"
REFERENCE_FORMAT = 1

# One padded batch: input_ids, attention_mask (and token_type_ids where the model has them).
Batch = Mapping[str, np.ndarray]
# The graph's outputs: the pooled vectors, and the last layer's token states.
POOLED, STATES = "sentence_embedding", "token_embeddings"


class ModelBackend(Protocol):
    """The forward pass of one padded batch to pooled, L2-normalised float32 vectors."""

    name: BackendName

    def encode(self, batch: Batch) -> np.ndarray: ...

    def encode_states(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        """The pooled vectors and the last layer's token states (batch x tokens x dim),
        from one forward pass."""
        ...

    def for_queries(self) -> ModelBackend:
        """The backend for query embeddings: this one, or a runtime of its own."""
        ...


class TorchBackend:
    name: BackendName = "torch"

    def __init__(self, model: Any, pooling: str) -> None:
        import torch

        self._torch = torch
        # FlagEmbedding moves the model on every call; do it once here.
        self._model = model.float().to("cpu").eval()
        self._pooling = pooling

    def encode(self, batch: Batch) -> np.ndarray:
        return self.encode_states(batch)[0]

    def encode_states(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        torch = self._torch
        try:
            with torch.inference_mode():
                inputs = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}
                hidden = self._model(**inputs, return_dict=True).last_hidden_state
                pooled = _pool_torch(torch, hidden, inputs["attention_mask"], self._pooling)
                return pooled.numpy().astype(np.float32), hidden.numpy().astype(np.float32)
        except Exception as exc:
            raise EmbedderError(f"embedding failed: {exc}") from exc

    def for_queries(self) -> TorchBackend:
        """The same model under a lock of its own: a query need not wait behind an
        upsert's passage batches (torch runs forward passes from several threads)."""
        twin = TorchBackend.__new__(TorchBackend)
        twin._torch, twin._model, twin._pooling = self._torch, self._model, self._pooling
        return twin


class OnnxBackend:
    name: BackendName = "onnx"

    def __init__(self, path: Path, threads: int, spin: bool = True) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3  # errors only
        # Idle intra-op threads spin, waiting for more work: right for back-to-back passage
        # batches, wrong for one query, whose spinning threads take the cores from the
        # Milvus searches that run beside and after it (benchmarks/archive/2026-11-25.md, Speed v3).
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        self.path = path
        self.threads = threads
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._inputs = [i.name for i in self._session.get_inputs()]

    def encode(self, batch: Batch) -> np.ndarray:
        return self._run([POOLED], batch)[0]

    def encode_states(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        pooled, states = self._run([POOLED, STATES], batch)
        return pooled, states

    def _run(self, outputs: list[str], batch: Batch) -> list[np.ndarray]:
        # Only the outputs asked for leave the session: token states are copied out only
        # when parts are pooled.
        try:
            feed = {k: np.asarray(batch[k], dtype=np.int64) for k in self._inputs}
            return [np.asarray(o, dtype=np.float32) for o in self._session.run(outputs, feed)]
        except Exception as exc:
            raise EmbedderError(f"embedding failed: {exc}") from exc

    def for_queries(self) -> OnnxBackend:
        """A second session on the same export, not spinning: a query neither waits behind
        an upsert's passage batches nor keeps the cores busy after its forward pass."""
        return OnnxBackend(self.path, self.threads, spin=False)


def _pool_torch(torch: Any, hidden: Any, mask: Any, pooling: str) -> Any:
    if pooling == "mean":
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1)
    else:
        pooled = hidden[:, 0]
    return torch.nn.functional.normalize(pooled, dim=-1)


def checked_onnx(
    reference: TorchBackend,
    model: Any,
    pooling: str,
    max_tokens: int,
    tokenize: Callable[[Sequence[str]], Batch],
    export_dir: Path,
    threads: int,
) -> OnnxBackend:
    """The ONNX export of `model` as a backend, checked against torch on the probe texts;
    raises when the export cannot be made or does not match."""
    backend, cosine = _checked_onnx(
        reference, model, pooling, max_tokens, tokenize, export_dir, threads
    )
    log.info("embed_backend_ready", backend="onnx", parity_min_cosine=round(cosine, 6))
    return backend


def _checked_onnx(
    reference: TorchBackend,
    model: Any,
    pooling: str,
    max_tokens: int,
    tokenize: Callable[[Sequence[str]], Batch],
    export_dir: Path,
    threads: int,
) -> tuple[OnnxBackend, float]:
    """The ONNX backend and its parity with `reference`. An export found in the cache that
    does not load or match (a half-written file, an older exporter) is made again, once."""
    probes = tokenize(PARITY_PROBES)
    expected = reference.encode(probes)
    for attempt in (1, 2):
        path, fresh = exported_model(model, pooling, max_tokens, tokenize, export_dir)
        try:
            backend = OnnxBackend(path, threads)
            cosine = parity(expected, backend.encode(probes))
            if cosine < PARITY_MIN_COSINE:
                raise RuntimeError(
                    f"the ONNX export does not reproduce the torch vectors: lowest cosine"
                    f" {cosine:.6f} < {PARITY_MIN_COSINE} on the probe texts ({path})"
                )
            record_reference(export_dir, expected)
            return backend, cosine
        except Exception:
            if fresh or attempt == 2:
                raise
            path.unlink(missing_ok=True)
    raise AssertionError("unreachable")


def record_reference(export_dir: Path, vectors: np.ndarray) -> None:
    """torch's vectors of the probe texts, beside the export they verified (a start on the
    export alone checks against them: memsvc.embedding.verified_export)."""
    data = {
        "format": REFERENCE_FORMAT,
        "probes": list(PARITY_PROBES),
        "vectors": np.asarray(vectors, dtype=np.float32).tolist(),
    }
    write_whole(export_dir / REFERENCE_NAME, json.dumps(data) + "\n")


def recorded_reference(export_dir: Path) -> np.ndarray | None:
    """The recorded torch vectors of today's probe texts, or None."""
    try:
        data = json.loads((export_dir / REFERENCE_NAME).read_text())
        if data.get("format") != REFERENCE_FORMAT or data.get("probes") != list(PARITY_PROBES):
            return None
        vectors = np.asarray(data["vectors"], dtype=np.float32)
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return vectors if vectors.shape == (len(PARITY_PROBES), vectors.shape[-1]) else None


def parity(a: np.ndarray, b: np.ndarray) -> float:
    """Lowest cosine between matching rows of two sets of L2-normalised vectors."""
    return float(np.min(np.sum(a * b, axis=1)))


def model_files_key(model_dir: Path, name: str, installed_as: str = "") -> str:
    """Identifies the weights without reading them: file names, sizes and modification times
    of the model directory, plus the model name and the versions of the exporting stack
    (the parity check at every load catches anything this misses). `installed_as`: the
    package (name==version) whose files these are, which identifies them wherever it is
    installed: then neither the directory nor the times are part of the key, so a machine
    exports and times a bundled model once, not once per venv (issue 84)."""
    entries = sorted(
        (str(p.relative_to(model_dir)), p.stat().st_size)
        + (() if installed_as else (int(p.stat().st_mtime),))
        for p in model_dir.rglob("*")
        if p.is_file()
    )
    # The versions as installed, not as imported: a start on the export alone imports
    # neither package.
    stack = [EXPORT_FORMAT, version("torch"), version("onnx")]
    where = installed_as or str(model_dir.resolve())
    blob = json.dumps([stack, name, where, entries])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def exported_model(
    model: Any,
    pooling: str,
    max_tokens: int,
    tokenize: Callable[[Sequence[str]], Batch],
    export_dir: Path,
) -> tuple[Path, bool]:
    """`export_dir/model.onnx` and whether it was exported now. Concurrent starts on the
    same cache wait for one export (a file lock); the file appears whole (rename)."""
    target = export_dir / EXPORT_NAME
    if target.is_file():
        return target, False
    export_dir.mkdir(parents=True, exist_ok=True)
    with locked(export_dir / ".lock"):
        if target.is_file():
            return target, False
        log.info("onnx_export", path=str(target))
        partial = export_dir / f".model.onnx.{os.getpid()}"
        try:
            _export(model, pooling, max_tokens, tokenize(PARITY_PROBES), partial)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    return target, True


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive file lock on `path` (other processes wait)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _export(model: Any, pooling: str, max_tokens: int, probes: Batch, path: Path) -> None:
    """The model plus pooling and normalisation as one ONNX graph, batch and sequence
    dynamic. Fused first: ONNX Runtime's BERT fusions turn each layer's attention into one
    Attention node (a short query 12-20 %, passages 3-28 % faster on an AMD EPYC,
    benchmarks/archive/2026-11-27.md). Its pattern matcher knows the TorchScript exporter's
    graph of eager attention, not the dynamo exporter's, so the fused graph is exported that
    way and must reproduce torch on the probes; otherwise the plain dynamo export is kept."""
    try:
        _export_fused(model, pooling, probes, path)
        return
    except Exception as exc:  # any failure of an optional speed-up falls back
        log.info("onnx_fused_export_skipped", reason=str(exc)[:300])
    _export_dynamo(model, pooling, max_tokens, probes, path)


def _pooled_module(model: Any, pooling: str) -> Any:
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
            inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
            if token_type_ids is not None:
                inputs["token_type_ids"] = token_type_ids
            hidden = self.model(**inputs, return_dict=True).last_hidden_state
            return _pool_torch(torch, hidden, attention_mask, pooling), hidden

    return Pooled().eval()


def _example_inputs(probes: Batch) -> tuple[list[str], tuple[Any, ...]]:
    """The graph's input names (token_type_ids where the model has them) and the probes as
    the torch tensors an exporter traces."""
    import torch

    names = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in probes]
    return names, tuple(torch.from_numpy(np.asarray(probes[k], dtype=np.int64)) for k in names)


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporters report progress on stdout and warn about internals: not ours to show.
    ONNX Runtime's optimizer logs under its modules' bare names (fusion_base, onnx_model...)."""
    spec = importlib.util.find_spec("onnxruntime")
    fusions = Path(spec.origin).parent / "transformers" if spec and spec.origin else None
    names = [p.stem for p in fusions.glob("*.py")] if fusions else []
    quiet = [logging.getLogger(n) for n in ("torch.onnx", *names)]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)


def _export_fused(model: Any, pooling: str, probes: Batch, path: Path) -> None:
    import onnxruntime as ort
    import torch
    from onnxruntime.transformers.optimizer import optimize_model

    names, args = _example_inputs(probes)
    traced = path.with_name(path.name + ".traced")
    previous = model.config._attn_implementation
    try:
        with _quiet_exporter():
            model.set_attn_implementation("eager")
            pooled = _pooled_module(model, pooling)
            with torch.no_grad():
                expected = pooled(*args)[0].numpy()
            torch.onnx.export(
                pooled,
                args,
                str(traced),
                input_names=names,
                output_names=[POOLED, STATES],
                dynamic_axes={k: {0: "batch", 1: "sequence"} for k in [*names, STATES]},
                opset_version=17,
                dynamo=False,
            )
            fused = optimize_model(
                str(traced),
                model_type="bert",
                num_heads=model.config.num_attention_heads,
                hidden_size=model.config.hidden_size,
                opt_level=0,
            )
            if not fused.get_fused_operator_statistics().get("Attention"):
                raise RuntimeError("no attention was fused")
            fused.save_model_to_file(str(path))
    finally:
        model.set_attn_implementation(previous)
        traced.unlink(missing_ok=True)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    got = session.run([POOLED], {k: np.asarray(probes[k], dtype=np.int64) for k in names})[0]
    cosine = parity(expected, np.asarray(got, dtype=np.float32))
    if cosine < PARITY_MIN_COSINE:
        raise RuntimeError(f"the fused export does not reproduce torch: cosine {cosine:.6f}")


def _export_dynamo(model: Any, pooling: str, max_tokens: int, probes: Batch, path: Path) -> None:
    """The unfused graph, by the dynamo exporter: the TorchScript one gave wrong outputs
    with transformers 5 on the model as loaded (its default attention)."""
    import torch

    names, args = _example_inputs(probes)
    batch_dim = torch.export.Dim("batch")
    seq_dim = torch.export.Dim("sequence", max=max_tokens)
    with _quiet_exporter():
        program = torch.onnx.export(
            _pooled_module(model, pooling),
            args,
            input_names=names,
            output_names=[POOLED, STATES],
            dynamic_shapes={k: {0: batch_dim, 1: seq_dim} for k in names},
            dynamo=True,
            verbose=False,
        )
    if program is None:
        raise RuntimeError("torch.onnx.export returned no program")
    program.save(str(path))
