"""`memsvc mcp`: the memory tools over MCP, as a client of a running server (stdio for an
agent host's subprocess, streamable HTTP with --listen), and `--print-config`, the entry an
agent host needs to start it."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from memsvc.observability import tracing
from memsvc.transports.cli.connection import err


def add_mcp_command(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "mcp",
        parents=[common],
        help="serve the memory tools over MCP (stdio, or streamable HTTP with --listen)",
    )
    p.add_argument(
        "--listen",
        default=os.environ.get("MEMSVC_MCP_LISTEN", ""),
        help="HOST:PORT: serve MCP over streamable HTTP at /mcp, each request with its own "
        "bearer token (env MEMSVC_MCP_LISTEN); default: stdio with --token",
    )
    p.add_argument("--tls-cert-file", default="", help="PEM chain for the HTTP listener")
    p.add_argument("--tls-key-file", default="", help="PEM key for the HTTP listener")
    p.add_argument(
        "--allowed-origins",
        default=os.environ.get("MEMSVC_MCP_ALLOWED_ORIGINS", ""),
        help="comma-separated browser origins allowed besides loopback ones, e.g."
        " https://app.example.com (env MEMSVC_MCP_ALLOWED_ORIGINS); others get 403",
    )
    p.add_argument(
        "--allow-insecure",
        action="store_true",
        default=os.environ.get("MEMSVC_ALLOW_INSECURE", "").lower() in ("1", "true", "yes"),
        help="serve a non-loopback --listen in front of a memsvc that requires no token"
        " (env MEMSVC_ALLOW_INSECURE)",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the mcpServers entry an agent host needs to start this command (with"
        " this interpreter's absolute path, so it works outside an activated venv) and exit",
    )
    p.set_defaults(run=None)


def run_mcp(args: argparse.Namespace) -> int:
    from memsvc.transports.mcp.gateway import MemoryGateway, Target
    from memsvc.transports.mcp.serve import (
        HttpListen,
        exposure_refusal,
        serve_http,
        serve_stdio,
    )

    if args.print_config:
        from memsvc.transports.mcp.serve import host_config

        print(json.dumps(host_config(args.target, args.ca_file, args.token), indent=2))
        return 0
    # with OTEL_* set, the MCP SDK's span of each tool call (continuing the client's
    # `_meta` trace context) is the parent of the gateway's calls into memsvc
    tracing.configure()
    gateway = MemoryGateway(Target(args.target, args.ca_file))
    try:
        if not args.listen:
            serve_stdio(gateway, args.token)
            return 0
        host, sep, port = args.listen.rpartition(":")
        if not sep or not port.isdigit():
            err.print(f"memsvc mcp: --listen must be HOST:PORT, got {args.listen!r}")
            return 2
        if bool(args.tls_cert_file) != bool(args.tls_key_file):
            err.print("memsvc mcp: --tls-cert-file and --tls-key-file go together")
            return 2
        origins = tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip())
        listen = HttpListen(
            host.strip("[]"),
            int(port),
            args.tls_cert_file,
            args.tls_key_file,
            origins,
            args.allow_insecure,
        )
        refusal = exposure_refusal(gateway, listen)
        if refusal:
            err.print(f"memsvc mcp: {refusal}", markup=False, highlight=False)
            return 2
        serve_http(gateway, listen)
        return 0
    finally:
        gateway.close()
        tracing.shutdown()
