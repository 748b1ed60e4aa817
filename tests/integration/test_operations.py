"""Operations (issue 14): the command-line client against a real server, the Prometheus
families after real traffic, durable pause and reindex cancellation."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from memsvc.app import Services
from memsvc.domain.types import SearchFilters, SearchRequest
from tests.conftest import EN_TURNS, RUNTIME_LABEL, conversation
from tests.support.launch import free_port, start_child, wait_serving

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conversation.jsonl"


def cli(target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memsvc", *args, "--target", target],
        capture_output=True,
        text=True,
        timeout=300,
    )


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """family name -> {sorted labels: value} for every sample."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


SELECTOR = re.compile(r"\b((?:memsvc|process)_\w+)(?:\{([^}]*)\})?")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
SCRAPE_LABELS = {"job", "instance"}  # added by Prometheus, not by the server


def check_queries(queries: list[str], port: int) -> None:
    """Every series a PromQL query names is one the running server exposes; every label it
    matches or groups by is one of that series' labels, and every value it matches exactly
    is one the server says (seen, named in the family's help, or a boolean's other value):
    a misspelt method or stage would chart nothing, silently."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    labels: dict[str, dict[str, set[str]]] = {}  # series -> label -> values
    helps: dict[str, str] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            helps[sample.name] = family.documentation
            series = labels.setdefault(sample.name, {})
            for label, value in sample.labels.items():
                series.setdefault(label, set()).add(value)
    for query in queries:
        used: set[str] = set()
        for name, matchers in SELECTOR.findall(query):
            assert name in labels, (name, query)
            used |= set(labels[name])
            for label, op, value in MATCHER.findall(matchers):
                if label in SCRAPE_LABELS:
                    continue
                assert label in labels[name], (label, name, query)
                seen = labels[name][label]
                if op in ("=", "!="):
                    known = seen | ({"true", "false"} if seen <= {"true", "false"} else set())
                    said = re.search(rf"\b{re.escape(value)}\b", helps[name])
                    assert value in known or said, (label, value, sorted(seen), query)
        for group in re.findall(r"\bby \(([^)]*)\)", query):
            for label in (g.strip() for g in group.split(",")):
                assert label in used | SCRAPE_LABELS, (label, query)


def dashboard_and_alert_queries() -> list[str]:
    import yaml

    root = Path(__file__).resolve().parents[2]
    dashboard = json.loads((root / "deploy" / "grafana" / "memsvc.json").read_text())
    queries = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    queries += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    rules = yaml.safe_load((root / "deploy" / "prometheus-alerts.yml").read_text())
    queries += [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    return queries


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as res:
            return res.status, res.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_readyz_follows_what_the_server_says() -> None:
    from memsvc.observability import metrics, startup

    port = metrics.serve_metrics("127.0.0.1:0")
    before = metrics.READINESS.read
    try:
        metrics.READINESS.read = lambda: False
        startup.enter("loading the model")  # this process has not served: it is starting
        status, said = get(port, "/readyz")
        assert status == 503 and said.startswith("not ready: starting up, loading the model (")
        assert get(port, "/healthz") == (200, "ok\n")  # alive while not ready
        metrics.READINESS.read = lambda: True
        assert get(port, "/readyz") == (200, "ready\n")
        status, body = get(port, "/metrics")
        assert status == 200 and "memsvc_rpc_duration_seconds" in body
    finally:
        metrics.READINESS.read = before


def total(samples: dict[tuple[tuple[str, str], ...], float], **labels: str) -> float:
    want = set(labels.items())
    return sum(v for k, v in samples.items() if want <= set(k))


def test_cli_and_metrics_against_a_running_server(tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    target = f"127.0.0.1:{port}"
    data = tmp_path / "data"
    proc = start_child(data, port, "--metrics-listen", f"127.0.0.1:{metrics_port}")
    channel = grpc.insecure_channel(target)
    try:
        wait_serving(channel, proc)
        appended = cli(target, "append", str(EXAMPLE), "--wait")
        assert appended.returncode == 0, appended.stderr
        assert "accepted 10, duplicates 0, errors 0" in appended.stdout

        again = cli(target, "append", str(EXAMPLE))
        assert "accepted 0, duplicates 10, errors 0" in again.stdout

        bad = tmp_path / "bad.jsonl"
        lines = EXAMPLE.read_text().splitlines()
        bad.write_text("\n".join([lines[0], "{not json", lines[1].replace("+08:00", "")]) + "\n")
        broken = cli(target, "append", str(bad))
        assert broken.returncode == 1
        said = broken.stderr.splitlines()
        assert said[0].startswith("line 2: expected a JSON object"), said  # names the lines
        # the bad field is named on its own line, not as the request's events[1]
        assert any(s.startswith("line 3: timestamp: not an RFC 3339") for s in said), said
        # line 1 shares the conversation: refused with it, and the reason says so
        assert any(s.startswith("line 1: not written: line 3 of its conv") for s in said), said

        found = cli(target, "search", "what is the dog called?", "--conversation", "c1", "--json")
        assert found.returncode == 0, found.stderr
        hits = json.loads(found.stdout)["hits"]
        assert any("Biscuit" in h["text"] for h in hits)
        table = cli(target, "search", "peanut allergy", "--conversation", "c1")
        assert "peanut" in table.stdout

        status = json.loads(cli(target, "status", "--json").stdout)
        assert status["conversations"][0]["conversation_id"] == "c1"
        assert status["conversations"][0]["state"] == "idle"

        assert "indexing paused" in cli(target, "pause").stdout
        assert (
            "turns deleted 1"
            in cli(target, "delete", "--conversation", "c1", "--turns", "4-4").stdout
        )
        assert "turns erased 1" in cli(target, "purge", "--conversation", "c1", "--yes").stdout
        refused = cli(target, "purge")
        assert refused.returncode == 2  # argparse: one of the two is required
        assert cli(target, "reindex", "--all", "--chunk-version", "2").returncode == 0
        assert "cancelled 1" in cli(target, "reindex", "--all", "--cancel").stdout
        late = tmp_path / "late.jsonl"
        late.write_text(
            json.dumps(
                {
                    "conversation_id": "c1",
                    "turn_id": 10,
                    "speaker": "user",
                    "text": "One more thing while indexing is paused.",
                    "timestamp": "2026-02-03T09:00:00+08:00",
                }
            )
            + "\n"
        )
        assert cli(target, "append", str(late)).returncode == 0

        metrics = scrape(metrics_port)
        for family in (
            "memsvc_rpc_duration_seconds_count",
            "memsvc_chunks_written_total",
            "memsvc_embed_duration_seconds_count",
            "memsvc_embedded_texts_total",
            "memsvc_embed_cache_lookups_total",
            "memsvc_upsert_failures_total",
            "memsvc_index_backlog_turns",
            "memsvc_index_conversations",
            "memsvc_index_oldest_pending_seconds",
            "memsvc_store_up",
        ):
            assert family in metrics, family
        rpc = metrics["memsvc_rpc_duration_seconds_count"]
        assert total(rpc, method="AppendEvents", code="OK") >= 2
        assert total(rpc, method="EmbedDb", code="OK") >= 2
        assert total(rpc, method="PurgeDeleted") >= 1
        written = metrics["memsvc_chunks_written_total"]
        assert total(written, outcome="upserted") >= 3
        assert total(written, outcome="deleted") >= 1 and total(written, outcome="purged") >= 1
        assert total(metrics["memsvc_embedded_texts_total"], kind="passage") >= 3
        assert total(metrics["memsvc_embedded_texts_total"], kind="query") >= 2
        assert metrics["memsvc_store_up"][()] == 1
        stages = metrics["memsvc_stage_duration_seconds_count"]
        for stage in ("embed", "keyword", "dense", "fuse", "verify"):
            assert total(stages, operation="search", stage=stage) >= 2, stage
        # c1 holds a few chunks: the first search took them whole from its dense list (its
        # plan stage said so) and kept them; the second took its hits from those kept
        assert total(stages, operation="search", stage="plan") >= 2
        lookups = metrics["memsvc_search_record_lookups_total"]
        assert total(lookups, result="hit") >= 1
        for stage in ("check", "embed", "store", "bookkeep", "settle"):
            assert total(stages, operation="write", stage=stage) >= 1, stage
        # paused with a turn appended since: the lag is visible
        assert total(metrics["memsvc_index_conversations"]) == 1
        assert total(metrics["memsvc_index_conversations"], state="pending") == 1
        assert metrics["memsvc_index_backlog_turns"][()] > 0
        assert metrics["memsvc_index_oldest_pending_seconds"][()] > 0
        for name, samples in metrics.items():  # bounded labels: no conversation id anywhere
            for labels in samples:
                assert all(v != "c1" for _, v in labels), name
        assert not [name for name in metrics if name.endswith("_created")]
        # what serves, and the process behind it
        [build] = metrics["memsvc_build_info"]
        info = dict(build)
        assert info["model"] == "sentence-transformers/all-MiniLM-L6-v2"
        assert info["dim"] == "384" and info["log"] == "sqlite"
        assert info["fallback"] in ("true", "false") and re.match(RUNTIME_LABEL, info["backend"])
        assert info["version"] and metrics["memsvc_build_info"][build] == 1
        assert metrics["process_resident_memory_bytes"][()] > 0
        assert "python_info" in metrics
        assert metrics["memsvc_rpc_in_flight"][()] == 0  # nothing runs between calls
        assert metrics["memsvc_chunks_stored"][()] >= 3
        # the first append --wait made c1 searchable: one time-to-searchable observed
        assert metrics["memsvc_index_lag_seconds_count"][()] >= 1
        # the Grafana dashboard's and the alert rules' queries chart what this server says
        check_queries(dashboard_and_alert_queries(), metrics_port)
        assert get(metrics_port, "/healthz") == (200, "ok\n")
        assert get(metrics_port, "/readyz") == (200, "ready\n")
        assert get(metrics_port, "/anything")[0] == 404
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=60)

    # paused before the restart: paused after it
    proc = start_child(data, port)
    channel = grpc.insecure_channel(target)
    try:
        wait_serving(channel, proc)
        status = json.loads(cli(target, "status", "--json").stdout)
        assert status["paused"] is True
        assert "indexing running" in cli(target, "resume").stdout
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=60)


def test_cancelled_reindex_keeps_the_old_version_answering(services: Services) -> None:
    built = services.ingest.build(conversation("rx", EN_TURNS))
    services.ingest.upsert(built.chunks)
    services.control.set_paused(True)
    assert services.control.reindex(["rx"], 2) == 1
    services.ingest.build([], chunk_version=2, conversation_id="rx")  # part of v2 laid out
    assert services.control.cancel_reindex([]) == 1
    item = services.queue.status(["rx"])[0]
    assert not item.reindex and item.chunk_version == 1
    versions = {
        c.metadata.chunk_version for c in services.ingest.list_chunks("rx", False, 100, "").chunks
    }
    assert versions == {1}
    services.control.set_paused(False)
    done = services.control.wait_for_indexed("rx", len(EN_TURNS) - 1, 60)
    assert done is not None and services.control.is_indexed("rx", len(EN_TURNS) - 1)
    hits = services.search.search(SearchRequest("Biscuit", 6, SearchFilters(("rx",)))).hits
    assert hits and {h.metadata.chunk_version for h in hits} == {1}


def test_a_data_dir_restored_at_another_path_is_not_reindexed(tmp_path: Path) -> None:
    """Backup = a copy of the stopped data dir (README, Backup and restore); restored at
    another path, it serves at once: nothing re-embedded, nothing re-written."""
    port, metrics_port = free_port(), free_port()
    target = f"127.0.0.1:{port}"
    proc = start_child(tmp_path / "a", port)
    channel = grpc.insecure_channel(target)
    try:
        wait_serving(channel, proc)
        assert cli(target, "append", str(EXAMPLE), "--wait").returncode == 0
    finally:
        channel.close()
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    shutil.copytree(tmp_path / "a", tmp_path / "elsewhere" / "b")
    shutil.rmtree(tmp_path / "a")
    proc = start_child(
        tmp_path / "elsewhere" / "b", port, "--metrics-listen", f"127.0.0.1:{metrics_port}"
    )
    channel = grpc.insecure_channel(target)
    try:
        wait_serving(channel, proc)
        status = json.loads(cli(target, "status", "--json").stdout)
        assert [(c["state"], c["last_indexed_turn"]) for c in status["conversations"]] == [
            ("idle", 9)
        ]
        found = json.loads(
            cli(
                target, "search", "what is the dog called?", "--conversation", "c1", "--json"
            ).stdout
        )
        assert any("Biscuit" in h["text"] for h in found["hits"])
        time.sleep(2)  # a re-index would have started by now
        metrics = scrape(metrics_port)
        assert total(metrics.get("memsvc_chunks_written_total", {}), outcome="upserted") == 0
        assert total(metrics.get("memsvc_embedded_texts_total", {}), kind="passage") == 0
    finally:
        channel.close()
        proc.terminate()
        proc.wait(timeout=60)


def test_sigterm_during_the_model_load_stops_at_once(tmp_path: Path) -> None:
    """SIGTERM while the model loads abandons the load (it used to finish it first): a
    clean exit, the data dir free for the next start. The server has a model cache of its
    own, so this start exports the model and times its runtimes (45 s here, alone): the
    signal lands in the load (regression: with the machine's cache warm the load took a
    second, and a loaded CI machine sent the signal after it)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    port = free_port()
    command = [sys.executable, "-m", "memsvc", "serve", "--listen", f"127.0.0.1:{port}"]
    command += ["--data-dir", str(tmp_path / "data"), "--log-format", "json"]
    env = {
        **os.environ,
        "MEMSVC_EMBED_MODEL": "sentence-transformers/all-MiniLM-L6-v2",
        "MEMSVC_METRICS_LISTEN": "",
        "MEMSVC_MODEL_CACHE_DIR": str(tmp_path / "cache"),
        "TQDM_DISABLE": "1",
    }
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:  # listening, model not loaded yet
            try:
                status = health.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                assert status == health_pb2.HealthCheckResponse.NOT_SERVING
                break
            except grpc.RpcError:
                assert proc.poll() is None
                time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output.decode()[-2000:]
    assert b"stopped_during_startup" in output and b"serving" not in output
    assert b"Traceback" not in output
    second = start_child(tmp_path / "data", port)  # the data dir lock was released
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, second)
    finally:
        second.terminate()
        second.wait(timeout=60)


def test_a_first_start_logs_json_lines_only(tmp_path: Path) -> None:
    """The ONNX export at a first start printed ~110 plain lines into the JSON log."""
    port = free_port()
    command = [sys.executable, "-m", "memsvc", "serve", "--listen", f"127.0.0.1:{port}"]
    command += ["--data-dir", str(tmp_path / "data"), "--log-format", "json"]
    env = {
        **os.environ,
        "MEMSVC_EMBED_MODEL": "sentence-transformers/all-MiniLM-L6-v2",
        "MEMSVC_EMBED_BACKEND": "onnx",
        "MEMSVC_MODEL_CACHE_DIR": str(tmp_path / "model-cache"),  # empty: the export runs
        "MEMSVC_METRICS_LISTEN": "",
        "TQDM_DISABLE": "1",
    }
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            wait_serving(channel, proc)  # type: ignore[arg-type]
    finally:
        proc.terminate()
        output, _ = proc.communicate(timeout=120)
    lines = [line for line in output.decode().splitlines() if line.strip()]
    events = [json.loads(line)["event"] for line in lines]  # every line is a JSON object
    assert "onnx_export" in events and "serving" in events and events[-1] == "stopped"


def test_searching_an_empty_store_logs_no_error(tmp_path: Path) -> None:
    """Regression: a hybrid search before the first chunk answered OK with no hits, but
    the Milvus Lite server printed a failed assertion and pymilvus an ERROR traceback for
    its BM25 search over nothing, so a new deployment's log began with errors that were
    not. Then, once rows exist, keyword searches find them."""
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "memsvc", "serve", "--listen", f"127.0.0.1:{port}"),
                *("--data-dir", str(tmp_path / "data")),
            ],
            env={
                **os.environ,
                "MEMSVC_EMBED_MODEL": "sentence-transformers/all-MiniLM-L6-v2",
                "MEMSVC_METRICS_LISTEN": "",
                "TQDM_DISABLE": "1",
            },
            stdout=out,
            stderr=out,
        )
    target = f"127.0.0.1:{port}"
    try:
        with grpc.insecure_channel(target) as channel:
            wait_serving(channel, proc)
        for mode in ("hybrid", "keyword"):
            found = json.loads(
                cli(target, "search", "who looks after the dog?", "--mode", mode, "--json").stdout
            )
            assert found["hits"] == []
        assert cli(target, "append", str(EXAMPLE), "--wait").returncode == 0
        found = json.loads(cli(target, "search", "Biscuit", "--mode", "keyword", "--json").stdout)
        assert any("Biscuit" in hit["text"] for hit in found["hits"])
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    text = log.read_text()
    assert "NaN or Inf" not in text and "Traceback" not in text, text[-3000:]
    assert '"level": "error"' not in text
