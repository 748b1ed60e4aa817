"""An install without cloning (issue 40): the pip lines of docs/operations/deploy.md, run as
written in an empty virtual environment outside the repository, then the server they start
called from that environment's own `memsvc` command.

Two substitutions only: the repository's address is this clone as a `git+file` URL (what
pip does with a `git+https` one, without the network), and torch comes from the index the
Makefile uses (`MEMSVC_TEST_TORCH_FROM`, set by `make test-install`), as CI reaches no
other."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import urllib.request
from pathlib import Path

import grpc
import pytest

from tests.support.launch import free_port, wait_serving

pytestmark = pytest.mark.install
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations" / "deploy.md"


def documented_lines() -> list[str]:
    section = DOC.read_text().split("[start:pip]", 1)[1].split("[end:pip]", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_pip_install_from_the_repository_serves_offline(tmp_path: Path) -> None:
    venv_line, torch_line, package_line, serve_line = documented_lines()
    assert venv_line == "python3.11 -m venv memsvc-env"
    assert torch_line.startswith("memsvc-env/bin/pip install torch==2.13.0 ")
    torch_from = os.environ.get("MEMSVC_TEST_TORCH_FROM", "")
    torch_line = re.sub(r"--index-url \S+", torch_from, torch_line).rstrip()
    package_line = re.sub(r"git\+https://\S+?(?=')", f"git+file://localhost{ROOT}", package_line)
    assert f"git+file://localhost{ROOT}'" in package_line
    home = tmp_path / "home"
    home.mkdir()
    # nothing of the repository or its venv reaches the commands
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "TQDM_DISABLE": "1",
    }
    for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONSTRAINT"):
        if key in os.environ:
            env[key] = os.environ[key]
    # pip's configuration (the machine's indexes) lives in files under /etc, kept
    for line in (venv_line, torch_line, package_line):
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert done.returncode == 0, (line, done.stderr[-3000:])
    memsvc = tmp_path / "memsvc-env" / "bin" / "memsvc"
    version = subprocess.run([str(memsvc), "--version"], env=env, capture_output=True, text=True)
    assert version.stdout.split() == ["memsvc", "0.1.0"], version
    located = subprocess.run(
        [
            str(tmp_path / "memsvc-env" / "bin" / "python"),
            "-c",
            "import memsvc; print(memsvc.__file__)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert located.stdout.startswith(str(tmp_path / "memsvc-env")), located.stdout

    args = shlex.split(serve_line.replace("~", str(home)))
    assert args[:2] == ["memsvc-env/bin/memsvc", "serve"]
    port, http_port = free_port(), free_port()
    serve_env = {**env, "MEMSVC_METRICS_LISTEN": ""}
    server = subprocess.Popen(
        [*args, "--listen", f"127.0.0.1:{port}", "--http-listen", f"127.0.0.1:{http_port}"],
        cwd=tmp_path,
        env=serve_env,
    )
    target = ["--target", f"127.0.0.1:{port}"]
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, server)
        example = tmp_path / "conversation.jsonl"
        example.write_text((ROOT / "examples" / "conversation.jsonl").read_text())
        subprocess.run(
            [str(memsvc), "append", str(example), "--wait", *target],
            cwd=tmp_path,
            env=env,
            check=True,
            timeout=300,
            capture_output=True,
        )
        found = subprocess.run(
            [
                str(memsvc),
                "search",
                "who looks after the dog?",
                "--conversation",
                "c1",
                "--json",
                *target,
            ],
            cwd=tmp_path,
            env=env,
            check=True,
            timeout=120,
            capture_output=True,
            text=True,
        )
        hits = json.loads(found.stdout)["hits"]
        assert any("sister" in hit["text"] for hit in hits), hits
        # what the package carries besides code: the OpenAPI description and the console
        base = f"http://127.0.0.1:{http_port}"
        served = json.loads(urllib.request.urlopen(f"{base}/openapi.json", timeout=10).read())
        assert served == json.loads((ROOT / "memsvc" / "v1" / "openapi.json").read_text())
        page = urllib.request.urlopen(f"{base}/console/", timeout=10).read().decode()
        assert "console.js" in page
        script = urllib.request.urlopen(f"{base}/console/console.js", timeout=10)
        assert script.status == 200
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert (home / "memsvc-data").is_dir()  # the documented data dir, nothing elsewhere
