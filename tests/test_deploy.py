"""deploy/: the compose file, Envoy config and alert rules agree with the server they deploy.

The images cannot be pulled here, so the files are checked for what can go wrong silently:
a setting name the server would refuse, a health check on a service name the server does not
report, a balancer pointing at a port or host that does not exist. `.ci/run` also runs
`docker-compose config` on the file (Debian's docker-compose parses it without a daemon).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from memsvc.config import Settings
from memsvc.storage import datadir
from memsvc.transports.grpc.server import SERVICE_NAME

ROOT = Path(__file__).resolve().parent.parent
FLEET = ROOT / "deploy" / "fleet"


def load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((FLEET / name).read_text())
    assert isinstance(data, dict)
    return data


def test_compose_runs_the_shared_backends_and_every_setting_is_real() -> None:
    compose = load("compose.yaml")
    services = compose["services"]
    assert {"postgres", "etcd", "minio", "milvus", "memsvc", "envoy"} <= set(services)
    env = services["memsvc"]["environment"]
    fields = {f"MEMSVC_{name.upper()}" for name in Settings.model_fields}
    assert set(env) <= fields, set(env) - fields
    # a fleet needs both shared backends; the server parses the values as given
    assert env["MEMSVC_DATABASE_URL"].startswith("postgresql://memsvc@postgres:5432/")
    assert env["MEMSVC_MILVUS_URI"] == "http://milvus:19530"
    settings = Settings.model_validate(
        {k.removeprefix("MEMSVC_").lower(): v for k, v in env.items()}
    )
    assert settings.database_pool_size >= 2 and settings.index_lease_s == 30
    assert services["memsvc"]["deploy"]["replicas"] >= 2
    # secrets the replicas read exist in the file's secrets section
    assert set(services["memsvc"]["secrets"]) <= set(compose["secrets"])
    assert "/run/secrets/pg_password" in " ".join(services["memsvc"]["entrypoint"])


def test_envoy_balances_grpc_over_the_replicas_by_their_health() -> None:
    compose = load("compose.yaml")
    envoy = load("envoy.yaml")
    (cluster,) = envoy["static_resources"]["clusters"]
    (endpoint,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    address = endpoint["endpoint"]["address"]["socket_address"]
    listen_port = int(compose["services"]["memsvc"]["environment"]["MEMSVC_LISTEN"].split(":")[1])
    assert address == {"address": "memsvc", "port_value": listen_port}
    # HTTP/2 upstream (gRPC) and the health check on the name the server reports
    options = cluster["typed_extension_protocol_options"]
    assert "http2_protocol_options" in str(options)
    (check,) = cluster["health_checks"]
    assert check["grpc_health_check"]["service_name"] == SERVICE_NAME
    (listener,) = envoy["static_resources"]["listeners"]
    published = compose["services"]["envoy"]["ports"][0]
    assert published.endswith(f":{listener['address']['socket_address']['port_value']}")


def test_alert_rules_have_severities_and_name_real_metrics() -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus-alerts.yml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"]]
    assert alerts and all(r["labels"]["severity"] in ("page", "ticket") for r in alerts)
    source = (ROOT / "memsvc" / "observability" / "metrics.py").read_text()
    for rule in alerts:
        for name in re.findall(r"memsvc_\w+", rule["expr"]):
            family = re.sub(r"_(bucket|total|count|sum)$", "", name)
            assert f'"{family}"' in source, (rule["alert"], family)
    lag = next(r for r in alerts if r["alert"] == "MemsvcIndexLag")
    assert "memsvc_index_paused) == 0" in lag["expr"]  # no page while deliberately paused


def test_the_image_exports_onnx_at_build_and_exposes_metrics(tmp_path: Path) -> None:
    """The Dockerfile's export step, run as written (the offline model in place of the
    hub's): the cache it fills holds the ONNX graph a start then only loads."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    env = dict(re.findall(r"(MEMSVC_\w+)=(\S+)", dockerfile.split("RUN useradd", 1)[0]))
    assert env["MEMSVC_METRICS_LISTEN"].startswith("0.0.0.0:")
    port = env["MEMSVC_METRICS_LISTEN"].rpartition(":")[2]
    assert re.search(rf"^EXPOSE 50051 {port}$", dockerfile, re.M)
    step = re.search(r'python -c "(.*?)"', dockerfile.split("# Export the ONNX", 1)[1])
    assert step is not None
    cache = tmp_path / "model-cache"
    done = subprocess.run(
        [sys.executable, "-c", step.group(1).replace("/tmp/build", str(tmp_path / "build"))],
        env={
            **os.environ,
            "MEMSVC_MODEL_CACHE_DIR": str(cache),
            "MEMSVC_EMBED_MODEL": "sentence-transformers/all-MiniLM-L6-v2",
            "MEMSVC_EMBED_FALLBACK": "false",
            "TQDM_DISABLE": "1",
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(cache.rglob("model.onnx"))


def test_the_image_has_a_slim_variant_without_torch() -> None:
    """--build-arg EMBEDDER=openai: the base install (no [local] extra, so no torch and no
    model; traces' [otel] in both), the provider set to match; the default build keeps the
    local model."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG EMBEDDER=local$", dockerfile, re.M)
    assert "MEMSVC_EMBED_PROVIDER=${EMBEDDER}" in dockerfile
    assert 'then pip install ".[local,otel]"; else pip install ".[otel]"; fi' in dockerfile
    # torch and the model download run only for the local build
    for step in ("pip install torch==2.13.0", "snapshot_download('BAAI/bge-small-zh-v1.5')"):
        run = dockerfile.rfind("RUN ", 0, dockerfile.index(step))
        assert dockerfile[run:].startswith('RUN if [ "$EMBEDDER" = local ]; then'), step


def test_the_data_dir_of_the_image_user_starts_and_a_root_owned_one_says_why() -> None:
    # The compose file's tmpfs is the image user's (uid 10001); a data dir left to root
    # (Docker's default for a tmpfs) is refused with the fix, not a bare EPERM (issue 40).
    compose = load("compose.yaml")
    image_uid = int(re.search(r"--uid (\d+)", (ROOT / "Dockerfile").read_text())[1])  # type: ignore[index]
    [mount] = compose["services"]["memsvc"]["tmpfs"]
    assert mount.startswith("/data:") and f"uid={image_uid}" in mount and "mode=0700" in mount
    # under /tmp itself: pytest's tmp_path sits in a dir only root may enter
    tmp_path = Path(tempfile.mkdtemp(prefix="memsvc-uid-"))
    owned, rooted = tmp_path / "owned", tmp_path / "rooted"
    owned.mkdir()
    rooted.mkdir(mode=0o777)
    rooted.chmod(0o1777)  # as a fresh tmpfs: root's, world-writable, sticky
    os.chown(owned, image_uid, image_uid)
    tmp_path.chmod(0o755)
    for path, expected in (
        (owned, ""),
        (rooted, f"owned by uid 0 and memsvc runs as uid {image_uid}"),
    ):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the image's user: a child process that drops root
            os.close(read)
            try:
                os.setgid(image_uid)
                os.setuid(image_uid)
                datadir.secure(path)
                message = ""
            except Exception as exc:
                message = str(exc)
            os.write(write, message.encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as reply:
            message = reply.read()
        os.waitpid(pid, 0)
        assert (expected in message) if expected else message == "", message
    assert owned.stat().st_mode & 0o777 == 0o700
    shutil.rmtree(tmp_path)


# -- deploy/k8s ----------------------------------------------------------------------------
K8S = ROOT / "deploy" / "k8s"


def k8s_resources(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]


def test_k8s_manifests_are_valid_against_the_kubernetes_schemas() -> None:
    """Every resource of deploy/k8s against the newest Kubernetes schemas kubernetes-validate
    ships (strict: an unknown field is an error, as a typo would be silently dropped by an
    older kubectl). The ServiceMonitor is a CRD the package has no schema for: checked by
    what it selects below."""
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    kinds: list[str] = []
    for path in sorted(K8S.glob("*.yaml")):
        for resource in k8s_resources(path.name):
            kinds.append(resource["kind"])
            if resource["apiVersion"].startswith("monitoring.coreos.com/"):
                continue
            kubernetes_validate.validate(resource, version, strict=True)
    assert {"StatefulSet", "Deployment", "Service", "Secret", "ServiceMonitor"} <= set(kinds)


def memsvc_container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def test_k8s_workloads_run_memsvc_as_it_expects() -> None:
    """What the schemas cannot see: every MEMSVC_ variable is a real setting with a value the
    server accepts; the probes ask the metrics port for /healthz (alive) and /readyz (ready);
    the pod runs as the image's user with the data dir its own; the tokens file the server
    reads is where the Secret is mounted; the Service's ports reach named container ports."""
    image_uid = int(re.search(r"--uid (\d+)", (ROOT / "Dockerfile").read_text())[1])  # type: ignore[index]
    fields = {f"MEMSVC_{name.upper()}" for name in Settings.model_fields}
    grace = Settings.model_fields["shutdown_grace_s"].default
    workloads = {"embedded.yaml": "StatefulSet", "fleet.yaml": "Deployment"}
    for name, kind in workloads.items():
        resources = {r["kind"]: r for r in k8s_resources(name)}
        workload, service = resources[kind], resources["Service"]
        pod = workload["spec"]["template"]["spec"]
        container = memsvc_container(workload)
        env = {e["name"]: e.get("value") for e in container["env"]}
        memsvc_env = {k: v for k, v in env.items() if k.startswith("MEMSVC_")}
        assert set(memsvc_env) <= fields, set(memsvc_env) - fields
        settings = Settings.model_validate(
            {k.removeprefix("MEMSVC_").lower(): v for k, v in memsvc_env.items()}
        )
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for setting, port_name in (
            (settings.listen, "grpc"),
            (settings.http_listen, "http"),
            (settings.metrics_listen, "metrics"),
        ):
            assert setting == f"0.0.0.0:{ports[port_name]}", (name, setting)
        for probe, path in (
            ("startupProbe", "/healthz"),
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
        ):
            assert container[probe]["httpGet"] == {"path": path, "port": "metrics"}, (name, probe)
        assert pod["securityContext"]["runAsUser"] == image_uid
        assert pod["securityContext"]["fsGroup"] == image_uid  # the data dir is memsvc's
        assert pod["terminationGracePeriodSeconds"] > grace
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["data"] == str(settings.data_dir)
        tokens = next(v for v in pod["volumes"] if v["name"] == "tokens")
        secret = next(r for r in k8s_resources("secret.yaml") if r["kind"] == "Secret")
        assert tokens["secret"]["secretName"] == secret["metadata"]["name"]
        assert settings.auth_tokens_file is not None
        assert settings.auth_tokens_file.parent == Path(mounts["tokens"])
        assert settings.auth_tokens_file.name in secret["stringData"]
        # the Service selects this workload's pods and reaches its named ports
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    # one process per data dir: the embedded StatefulSet never scales past one
    embedded = next(r for r in k8s_resources("embedded.yaml") if r["kind"] == "StatefulSet")
    assert embedded["spec"]["replicas"] == 1
    fleet = next(r for r in k8s_resources("fleet.yaml") if r["kind"] == "Deployment")
    env = {e["name"]: e for e in memsvc_container(fleet)["env"]}
    assert env["MEMSVC_DATABASE_URL"]["value"].startswith("postgresql://memsvc@")
    assert "secretKeyRef" in env["PGPASSWORD"]["valueFrom"]  # no password in the URL


def test_k8s_secret_as_shipped_fails_closed_and_the_monitor_scrapes_metrics() -> None:
    """The Secret ships empty: memsvc refuses an empty tokens file (so an unfilled copy never
    serves anyone on 0.0.0.0). The ServiceMonitor selects both workloads' Services and
    scrapes their metrics port at /metrics."""
    from memsvc.transports.grpc.auth import TokenFileError, parse_tokens

    (secret,) = k8s_resources("secret.yaml")
    with pytest.raises(TokenFileError, match="no tokens"):
        parse_tokens(secret["stringData"]["tokens"], "tokens")
    (monitor,) = k8s_resources("servicemonitor.yaml")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    for name in ("embedded.yaml", "fleet.yaml"):
        service = next(r for r in k8s_resources(name) if r["kind"] == "Service")
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= service["metadata"]["labels"].items(), name
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}, name
