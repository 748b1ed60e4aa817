"""A fast deterministic OpenAI-compatible embedding server, for benchmarks whose subject is
the log, the store and the service rather than the model (`make bench-scale`).

    python benchmarks/hash_embedder.py --port 8099 [--dim 384]

`POST /v1/embeddings` answers every text with a hashed bag of its words: each lower-cased
word adds ±1 at a position its CRC-32 picks, and the sum is L2-normalised. The same text
always gets the same vector on any machine, texts that share words are near, and a
thousand texts take milliseconds, where the bundled model embeds ~25 chunks a second on 2
cores (1M chunks would take 11 hours). memsvc reaches it through its real remote-embedder
path (`MEMSVC_EMBED_PROVIDER=openai`).
"""

from __future__ import annotations

import argparse
import json
import re
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

WORD = re.compile(r"\w+")


def embed(texts: list[str], dim: int) -> np.ndarray:
    """One unit vector per text: its words hashed into `dim` signed buckets."""
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for row, text in enumerate(texts):
        hashes = np.fromiter(
            (zlib.crc32(w.encode()) for w in WORD.findall(text.lower())), dtype=np.uint32
        )
        if not len(hashes):  # no word: one bucket of the whole text, never a zero vector
            hashes = np.array([zlib.crc32(text.encode())], dtype=np.uint32)
        signs = np.where(hashes & (1 << 31), -1.0, 1.0).astype(np.float32)
        np.add.at(out[row], hashes % dim, signs)
        norm = float(np.linalg.norm(out[row]))
        if norm == 0.0:  # words that cancel out
            out[row, hashes[0] % dim] = 1.0
            norm = 1.0
        out[row] /= norm
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed ACK
    dim = 384

    def do_POST(self) -> None:
        if self.path.rstrip("/") not in ("/v1/embeddings", "/embeddings"):
            self._reply(404, {"error": {"message": f"no route {self.path}"}})
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        texts = body.get("input", [])
        texts = [texts] if isinstance(texts, str) else list(texts)
        vectors = embed(texts, self.dim).round(6).tolist()
        self._reply(
            200,
            {
                "object": "list",
                "model": body.get("model", "hash"),
                "data": [
                    {"object": "embedding", "index": i, "embedding": v}
                    for i, v in enumerate(vectors)
                ],
                "usage": {"prompt_tokens": 0, "total_tokens": 0},
            },
        )

    def _reply(self, status: int, payload: object) -> None:
        data = json.dumps(payload, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per request would be most of the benchmark's output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--dim", type=int, default=384)
    args = parser.parse_args()
    Handler.dim = args.dim
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
