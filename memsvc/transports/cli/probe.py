"""`memsvc health`: a grpc.health.v1 Check against the local server, for container
HEALTHCHECKs, or against `--target`. For the local one it reads the server's own MEMSVC_*
settings: the port from MEMSVC_LISTEN, and with TLS on, trusts MEMSVC_HEALTH_CA_FILE
(default: the server's certificate file) and presents MEMSVC_HEALTH_CLIENT_CERT_FILE /
_KEY_FILE when client certificates are required.
Health needs no token."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _read(var: str, default: str = "") -> bytes | None:
    path = os.environ.get(var, default)
    return Path(path).read_bytes() if path else None


def check_health(
    timeout_s: float = 4.0, target: str | None = None, ca_file: str | None = None
) -> bool:
    """SERVING or not; `target` (with `ca_file` for TLS) checks another server than the
    local one."""
    if target:
        if ca_file:
            creds = grpc.ssl_channel_credentials(root_certificates=Path(ca_file).read_bytes())
            channel = grpc.secure_channel(target, creds)
        else:
            channel = grpc.insecure_channel(target)
        return _check(channel, timeout_s)
    port = os.environ.get("MEMSVC_LISTEN", "127.0.0.1:50051").rpartition(":")[2]
    target = f"127.0.0.1:{port}"
    if os.environ.get("MEMSVC_TLS_CERT_FILE"):
        creds = grpc.ssl_channel_credentials(
            root_certificates=_read("MEMSVC_HEALTH_CA_FILE", os.environ["MEMSVC_TLS_CERT_FILE"]),
            private_key=_read("MEMSVC_HEALTH_CLIENT_KEY_FILE"),
            certificate_chain=_read("MEMSVC_HEALTH_CLIENT_CERT_FILE"),
        )
        channel = grpc.secure_channel(
            target, creds, options=[("grpc.ssl_target_name_override", "localhost")]
        )
    else:
        channel = grpc.insecure_channel(target)
    return _check(channel, timeout_s)


def _check(channel: grpc.Channel, timeout_s: float) -> bool:
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
