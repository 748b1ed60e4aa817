"""A start from a verified ONNX export: the tokenizer and the export, without torch's copy
of the model.

The first start on a machine loads the model with FlagEmbedding, exports it to ONNX,
checks the export against torch on the probe texts and times both runtimes
(memsvc.embedding.tuning). What torch gave for the probes is kept beside the export
(`torch-probes.json`). When the machine's record says ONNX serves both paths (or
MEMSVC_EMBED_BACKEND=onnx), a later start loads neither FlagEmbedding (its import alone is
4-5 s of CPU: it pulls in peft and transformers' training code) nor torch's weights. The
export must still reproduce torch's vectors of the probes, as recorded, as it must
reproduce torch's own at a full start. The record sits in the export's directory, keyed
by the model's files and the exporting stack (backends.model_files_key): other weights or
another torch mean a full start. Anything missing or not matching is a full start too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import structlog

from memsvc.embedding.backends import (
    EXPORT_NAME,
    PARITY_MIN_COSINE,
    PARITY_PROBES,
    Batch,
    OnnxBackend,
    parity,
    recorded_reference,
)
from memsvc.embedding.tuning import Runtimes, Tuning, log_choice, machine_facts, recorded

log = structlog.get_logger(__name__)


def onnx_runtimes(
    wanted: str,
    export_dir: Path,
    tokenize: Callable[[Sequence[str]], Batch],
    threads: Mapping[str, int],
) -> Runtimes | None:
    """Both paths on the verified export, or None when the start must load the model: no
    export or no record of torch's vectors, a tuning for this machine that does not put
    ONNX on both paths, or an export that no longer reproduces the record."""
    target = export_dir / EXPORT_NAME
    reference = recorded_reference(export_dir)
    if wanted == "torch" or reference is None or not target.is_file():
        return None
    machine = machine_facts(export_dir.name, threads)
    if wanted == "onnx":
        tuning = Tuning("onnx", "onnx", {}, machine, "", forced=True)
    else:
        known = recorded(export_dir / "tuning.json", machine, ("torch", "onnx"))
        if known is None or (known.query, known.passage) != ("onnx", "onnx"):
            return None
        tuning = known
    try:
        backend = OnnxBackend(target, threads["onnx"])
        cosine = parity(reference, backend.encode(tokenize(PARITY_PROBES)))
    except Exception as exc:  # a half-written or foreign file: the full start makes it again
        log.info("embed_export_unverified", path=str(target), reason=str(exc)[:300])
        return None
    if cosine < PARITY_MIN_COSINE:
        log.info("embed_export_unverified", path=str(target), parity_min_cosine=cosine)
        return None
    log.info(
        "embed_backend_ready",
        backend="onnx",
        parity_min_cosine=round(cosine, 6),
        against="torch's recorded vectors",
    )
    if not tuning.forced:
        log_choice(tuning, fresh=False)
    return Runtimes(backend, backend.for_queries(), tuning)
