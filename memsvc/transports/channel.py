"""The channel memsvc's own clients (the command line, the MCP gateway) open to a server:
plaintext or TLS trusting a CA file, and receiving responses up to the server's send limit
(MAX_RESPONSE_BYTES), not gRPC's default 4 MiB: one event may be ~8 MB of UTF-8."""

from __future__ import annotations

import grpc

from memsvc.domain.limits import MAX_RESPONSE_BYTES

OPTIONS = [("grpc.max_receive_message_length", MAX_RESPONSE_BYTES)]


def client_channel(address: str, ca_file: str | None) -> grpc.Channel:
    if ca_file:
        with open(ca_file, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        return grpc.secure_channel(address, creds, options=OPTIONS)
    return grpc.insecure_channel(address, options=OPTIONS)
