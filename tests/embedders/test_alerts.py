"""The alert rules fire on a real outage (issue 40): a real Prometheus (Debian's package)
scrapes a real memsvc whose embedding server is killed for longer than
MemsvcEmbedderDown's `for`, with deploy/prometheus-alerts.yml loaded unchanged. Only the
scrape and evaluation intervals are short, so the outage's minute is the test's minute."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from tests.support.embedding_server import InfinityServer, quick_failing_remote_env
from tests.support.fleet import until
from tests.support.launch import free_port, start_child, wait_serving

pytestmark = pytest.mark.embedders
RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus-alerts.yml"
ALERT = "MemsvcEmbedderDown"


class Prometheus:
    """`prometheus` scraping one target every second, the rule file evaluated every second."""

    def __init__(self, tmp_path: Path, target: str) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus not found: apt-get install prometheus (.ci/run does)"
        self.port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(RULES)],
                    "scrape_configs": [
                        {"job_name": "memsvc", "static_configs": [{"targets": [target]}]}
                    ],
                }
            )
        )
        self.log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=self.log,
        )
        until(self.ready, 60, "prometheus ready")

    def get(self, path: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.loads(reply.read())

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                return True
        except OSError:
            return False

    def alerts(self) -> dict[str, str]:
        """alert name -> state (pending | firing) of the alerts active now."""
        active = self.get("/api/v1/alerts")["data"]["alerts"]
        return {a["labels"]["alertname"]: a["state"] for a in active}

    def scraped(self) -> bool:
        targets = self.get("/api/v1/targets")["data"]["activeTargets"]
        return bool(targets) and targets[0]["health"] == "up"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def rule_for_s(name: str) -> float:
    rules = yaml.safe_load(RULES.read_text())
    (rule,) = [r for g in rules["groups"] for r in g["rules"] if r["alert"] == name]
    text = str(rule["for"])
    return float(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]


def test_the_embedder_alert_fires_on_an_outage_longer_than_its_for_and_only_then(
    tmp_path: Path, infinity: InfinityServer
) -> None:
    port, metrics_port = free_port(), free_port()
    server = start_child(
        tmp_path / "data",
        port,
        env=quick_failing_remote_env(infinity.url, metrics_port),
    )
    prometheus = Prometheus(tmp_path, f"127.0.0.1:{metrics_port}")
    hold_s = rule_for_s(ALERT)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, server)
        until(prometheus.scraped, 60, "memsvc scraped")
        time.sleep(3)  # a few evaluations of a healthy server: nothing is active
        assert prometheus.alerts() == {}
        infinity.kill()
        killed = time.monotonic()
        until(lambda: prometheus.alerts().get(ALERT) == "pending", 30, "pending")
        # pending, not firing, while the outage is shorter than `for`
        while time.monotonic() - killed < hold_s - 10:
            assert prometheus.alerts().get(ALERT) == "pending"
            time.sleep(2)
        until(lambda: prometheus.alerts().get(ALERT) == "firing", 40, "firing", prometheus.alerts)
        assert time.monotonic() - killed >= hold_s
        # the one alert of this outage: the others watch what still works
        assert set(prometheus.alerts()) == {ALERT}, prometheus.alerts()
        infinity.start()
        until(lambda: ALERT not in prometheus.alerts(), 60, "resolved", prometheus.alerts)
    finally:
        prometheus.close()
        server.terminate()
        server.wait(timeout=60)
        if infinity.proc is None or infinity.proc.poll() is not None:
            infinity.start()
