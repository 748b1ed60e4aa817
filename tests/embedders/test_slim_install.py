"""The slim install (`pip install memsvc`, no `[local]` extra): no torch, no model; it
serves with MEMSVC_EMBED_PROVIDER=openai, and says what to install for the local model."""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import grpc
import pytest

from tests.support.embedding_server import REMOTE_MODEL_NAME, InfinityServer
from tests.support.launch import free_port, wait_serving

pytestmark = pytest.mark.embedders
ROOT = Path(__file__).resolve().parents[2]


def test_the_slim_install_serves_through_a_server_without_torch(
    tmp_path: Path, infinity: InfinityServer
) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python, memsvc = env_dir / "bin" / "python", env_dir / "bin" / "memsvc"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(ROOT)],
        check=True,
        timeout=1200,
    )
    for heavy in ("torch", "FlagEmbedding", "onnxruntime", "transformers"):
        probe = subprocess.run([str(python), "-c", f"import {heavy}"], capture_output=True)
        assert probe.returncode != 0, f"{heavy} is installed by the slim install"

    env = {**os.environ, "TQDM_DISABLE": "1", "MEMSVC_METRICS_LISTEN": ""}
    env.pop("PYTHONPATH", None)
    # The default provider needs the extra, and says so.
    local = subprocess.run(
        [
            str(memsvc),
            "serve",
            "--data-dir",
            str(tmp_path / "local"),
            "--listen",
            f"127.0.0.1:{free_port()}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert local.returncode != 0 and "memsvc[local]" in local.stderr, local.stderr[-2000:]

    port = free_port()
    remote_env = {
        **env,
        "MEMSVC_EMBED_PROVIDER": "openai",
        "MEMSVC_EMBED_URL": infinity.url,
        "MEMSVC_EMBED_MODEL": REMOTE_MODEL_NAME,
    }
    server = subprocess.Popen(
        [
            str(memsvc),
            "serve",
            "--data-dir",
            str(tmp_path / "data"),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        env=remote_env,
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, server)
        events = tmp_path / "turns.jsonl"
        events.write_text(
            '{"conversation_id": "trip", "turn_id": 0, "speaker": "user",'
            ' "text": "My passport is in the left desk drawer.",'
            ' "timestamp": "2026-02-02T10:00:00Z"}\n'
        )
        target = ["--target", f"127.0.0.1:{port}"]
        cli = {**env}
        subprocess.run(
            [str(memsvc), "append", str(events), "--wait", *target],
            env=cli,
            check=True,
            timeout=120,
        )
        found = subprocess.run(
            [
                str(memsvc),
                "search",
                "where is the passport",
                "--conversation",
                "trip",
                "--json",
                *target,
            ],
            env=cli,
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "left desk drawer" in found.stdout
        status = subprocess.run(
            [str(memsvc), "status", *target],
            env=cli,
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "openai" in status.stdout
    finally:
        server.terminate()
        server.wait(timeout=60)
