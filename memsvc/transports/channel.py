"""The channel memsvc's own clients (the command line, the MCP gateway) open to a server:
plaintext or TLS trusting a CA file, and receiving responses up to the server's send limit
(MAX_RESPONSE_BYTES), not gRPC's default 4 MiB: one event may be ~8 MB of UTF-8. An append
refused before any work (UNAVAILABLE: starting, or every write slot taken) is sent again
after the server's pushback: appends are idempotent (turn ids, or the idempotency key)."""

from __future__ import annotations

import json

import grpc

from memsvc.domain.limits import MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES

_RETRY_APPENDS = {
    "methodConfig": [
        {
            "name": [{"service": "memsvc.v1.MemoryService", "method": "AppendEvents"}],
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.25s",
                "maxBackoff": "4s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ]
}
OPTIONS = [
    ("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),
    ("grpc.enable_retries", 1),
    ("grpc.service_config", json.dumps(_RETRY_APPENDS)),
    # a request larger than the retry buffer is never sent again (gRPC's default: 256 KiB;
    # an append may be the server's whole 16 MiB request limit)
    ("grpc.per_rpc_retry_buffer_size", 2 * MAX_REQUEST_BYTES),
]


def client_channel(address: str, ca_file: str | None) -> grpc.Channel:
    if ca_file:
        with open(ca_file, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        return grpc.secure_channel(address, creds, options=OPTIONS)
    return grpc.insecure_channel(address, options=OPTIONS)
