"""Which vectors a model writes: provider, model name, dimension and a fingerprint (its
vectors of a few fixed probe texts). Two embedders are interchangeable when their
dimensions and fingerprints agree, whatever their names: the same weights behind a local
runtime and an embedding server agree to cosine >= 0.999, two different models do not
come near. Pure Python (struct's half floats) so every layer may compare identities."""

from __future__ import annotations

import base64
import json
import math
import struct
from dataclasses import dataclass

# The probe texts: English, Chinese, a context-prefixed turn. Changing them changes every
# fingerprint: bump FINGERPRINT_FORMAT with them.
PROBE_TEXTS = (
    "where did I put my passport before the trip?",
    "我下周要去东京，护照放哪了？",
    "[Context: 2026-02-02, Caroline and Melanie discussing adoption]\n"
    "User (Caroline): I adopted a puppy named Biscuit last weekend.",
)
FINGERPRINT_FORMAT = 1
# Runtimes of the same weights (torch, ONNX, a server's kernels) agree to >= 0.999;
# the margin covers half-float storage and servers that batch differently.
SAME_MODEL_MIN_COSINE = 0.99


@dataclass(frozen=True)
class ModelIdentity:
    provider: str  # local | openai
    model: str
    dim: int
    fingerprint: str  # encode_fingerprint(probe vectors); "" = unknown (older records)

    @property
    def cache_key(self) -> str:
        """Cached vectors are kept under this name (the local model's: its name alone,
        as before providers existed)."""
        return self.model if self.provider == "local" else f"{self.provider}:{self.model}"

    def describe(self) -> str:
        return f"{self.provider} model {self.model!r} (dim {self.dim})"

    def to_json(self) -> dict[str, object]:
        return {
            "provider": self.provider,
            "model": self.model,
            "dim": self.dim,
            "fingerprint": self.fingerprint,
        }

    @staticmethod
    def from_json(data: dict[str, object], default_provider: str = "local") -> ModelIdentity:
        return ModelIdentity(
            provider=str(data.get("provider") or default_provider),
            model=str(data.get("model") or ""),
            dim=int(str(data.get("dim") or 0)),
            fingerprint=str(data.get("fingerprint") or ""),
        )


def encode_fingerprint(vectors: list[list[float]]) -> str:
    """Probe vectors as half floats, base64: a few KiB, kept beside what the model wrote."""
    flat = [float(x) for v in vectors for x in v]
    head = json.dumps({"f": FINGERPRINT_FORMAT, "n": len(vectors)}).encode()
    body = struct.pack(f"<{len(flat)}e", *flat)
    return base64.b64encode(struct.pack("<H", len(head)) + head + body).decode()


def decode_fingerprint(text: str) -> tuple[int, list[list[float]]]:
    raw = base64.b64decode(text)
    (n_head,) = struct.unpack_from("<H", raw)
    head = json.loads(raw[2 : 2 + n_head])
    body = raw[2 + n_head :]
    flat = struct.unpack(f"<{len(body) // 2}e", body)
    n = int(head["n"])
    dim = len(flat) // n if n else 0
    return int(head["f"]), [list(flat[i * dim : (i + 1) * dim]) for i in range(n)]


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def fingerprint_agreement(a: str, b: str) -> float | None:
    """The smallest probe cosine of two fingerprints; None when they cannot be compared
    (either unknown, another probe format or dimension)."""
    if not a or not b:
        return None
    try:
        fa, va = decode_fingerprint(a)
        fb, vb = decode_fingerprint(b)
    except (ValueError, KeyError, struct.error):
        return None
    if fa != fb or len(va) != len(vb) or any(len(x) != len(y) for x, y in zip(va, vb, strict=True)):
        return None
    return min(_cosine(x, y) for x, y in zip(va, vb, strict=True))


def mismatch(recorded: ModelIdentity, active: ModelIdentity) -> str | None:
    """Why vectors of `active` may not join those `recorded` wrote; None if they may.
    Recorded without a fingerprint (older versions): names and dimensions must agree."""
    if recorded.dim != active.dim:
        return f"dimension {recorded.dim} recorded, {active.dim} configured"
    agreement = fingerprint_agreement(recorded.fingerprint, active.fingerprint)
    if agreement is None:
        if recorded.model != active.model:
            return "another model name, and no fingerprint recorded to compare vectors"
        return None
    if agreement < SAME_MODEL_MIN_COSINE:
        return (
            f"the models embed the same probe texts differently (cosine {agreement:.3f},"
            f" same model >= {SAME_MODEL_MIN_COSINE})"
        )
    return None
