"""The model's identity (pure parts) and the remote client's request shaping, without a
server (the server-backed tests are tests/embedders, make test-embedders)."""

from __future__ import annotations

import email.utils
import http.server
import json
import threading
import time
from typing import ClassVar

import httpx
import numpy as np
import pytest

from memsvc.domain.errors import EmbedderUnavailable
from memsvc.domain.model_identity import (
    ModelIdentity,
    decode_fingerprint,
    encode_fingerprint,
    fingerprint_agreement,
    mismatch,
)
from memsvc.embedding.remote import RemoteConfig, RemoteEmbedder, _retry_after
from memsvc.embedding.tokens import RemoteTokenizer


def vectors(seed: int, n: int = 3, dim: int = 16) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    return [list(v / np.linalg.norm(v)) for v in rng.normal(size=(n, dim))]


def test_fingerprints_survive_half_floats_and_compare_by_cosine() -> None:
    a = vectors(1)
    fmt, back = decode_fingerprint(encode_fingerprint(a))
    assert fmt == 1 and np.allclose(back, a, atol=1e-3)
    agreement = fingerprint_agreement(encode_fingerprint(a), encode_fingerprint(a))
    assert agreement == pytest.approx(1.0, abs=1e-4)
    other = fingerprint_agreement(encode_fingerprint(a), encode_fingerprint(vectors(2)))
    assert other is not None and other < 0.9
    assert fingerprint_agreement("", encode_fingerprint(a)) is None
    assert (
        fingerprint_agreement(encode_fingerprint(a), encode_fingerprint(vectors(1, dim=8))) is None
    )


def test_mismatch_names_what_differs() -> None:
    fp = encode_fingerprint(vectors(1))
    recorded = ModelIdentity("local", "m", 16, fp)
    assert mismatch(recorded, ModelIdentity("openai", "served-m", 16, fp)) is None
    assert "dimension 16 recorded, 8" in (
        mismatch(recorded, ModelIdentity("local", "m", 8, fp)) or ""
    )
    changed = ModelIdentity("local", "m", 16, encode_fingerprint(vectors(3)))
    assert "cosine" in (mismatch(recorded, changed) or "")
    # Recorded before fingerprints: the names decide, as they did.
    old = ModelIdentity("local", "m", 16, "")
    assert mismatch(old, changed) is None
    assert "no fingerprint" in (mismatch(old, ModelIdentity("openai", "x", 16, fp)) or "")
    assert ModelIdentity("local", "m", 16, "").cache_key == "m"
    assert ModelIdentity("openai", "m", 16, "").cache_key == "openai:m"


def test_passages_go_out_in_batches_by_count_and_by_tokens() -> None:
    client = RemoteEmbedder(
        RemoteConfig("http://127.0.0.1:9", "m", batch_size=4, batch_tokens=30, max_tokens=20),
        RemoteTokenizer(),
        16,
    )
    try:
        texts = ["abc"] * 9 + ["x" * 300] * 3  # 1 token each, then 100 (counted as 20, the cap)
        batches = client._batches(texts)
        assert [len(b) for _, b in batches] == [4, 4, 2, 1, 1]
        assert [start for start, _ in batches] == [0, 4, 8, 10, 11]
        assert [t for _, b in batches for t in b] == texts
    finally:
        client.close()


def test_retry_after_is_read_as_seconds_or_a_date() -> None:
    assert _retry_after(httpx.Headers({"Retry-After": "2.5"})) == 2.5
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= (_retry_after(httpx.Headers({"Retry-After": later})) or 0) <= 31
    assert _retry_after(httpx.Headers({"Retry-After": "soon"})) is None
    assert _retry_after(httpx.Headers()) is None


class _CannedEmbeddings(http.server.BaseHTTPRequestHandler):
    """An embeddings endpoint answering each request with the class's `indexes`."""

    indexes: ClassVar[list[int]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        texts = body["input"]
        data = [
            {"index": i, "embedding": vectors(len(texts[0]) + n, 1)[0]}
            for n, i in enumerate(self.indexes or range(len(texts)))
        ]
        payload = json.dumps({"data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("indexes", [[0, 0, 2], [0, 1], [0, 1, 2, 3], [1, 2, 3]])
def test_an_answer_whose_indexes_are_not_each_text_once_is_refused(indexes: list[int]) -> None:
    """Regression (issue 37, 5): duplicate `index` values were sorted and accepted, storing
    one chunk with another's vector."""
    handler = type("Canned", (_CannedEmbeddings,), {"indexes": indexes})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = RemoteEmbedder(
        RemoteConfig(f"http://127.0.0.1:{server.server_port}/v1", "m", max_retries=0),
        RemoteTokenizer(),
        16,
    )
    try:
        with pytest.raises(EmbedderUnavailable, match=r"each of 0\.\.n-1 exactly once"):
            client.encode_passages(["a", "b", "c"])
    finally:
        client.close()
        server.shutdown()


def test_an_answer_in_another_order_is_put_back_in_request_order() -> None:
    handler = type("Canned", (_CannedEmbeddings,), {"indexes": [2, 0, 1]})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = RemoteEmbedder(
        RemoteConfig(f"http://127.0.0.1:{server.server_port}/v1", "m", max_retries=0),
        RemoteTokenizer(),
        16,
    )
    try:
        got = client.encode_passages(["a", "b", "c"])
    finally:
        client.close()
        server.shutdown()
    sent = [vectors(1 + n, 1)[0] for n in range(3)]  # the n-th item sent carries index [2,0,1][n]
    assert np.allclose(got[2], sent[0], atol=1e-6) and np.allclose(got[0], sent[1], atol=1e-6)
