"""`memsvc serve` (flags override MEMSVC_* environment variables), `memsvc health`, and
the client commands of memsvc.transports.cli.client."""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any

from pydantic import ValidationError

from memsvc.config import Settings, package_version
from memsvc.observability.logs import configure_logging
from memsvc.transports.cli.client import add_client_commands, run_client


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memsvc", description="conversation-memory sidecar")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.add_argument("--version", action="version", version=f"memsvc {package_version()}")
    health = sub.add_parser(
        "health", help="exit 0 if the server is SERVING (the local one by default: HEALTHCHECK)"
    )
    health.add_argument(
        "--target", help="HOST:PORT to check (default: the local server of MEMSVC_LISTEN)"
    )
    health.add_argument("--ca-file", help="PEM CA to trust: check over TLS")
    serve = sub.add_parser("serve", help="run the gRPC server")
    serve.add_argument("--listen", help="HOST:PORT (env MEMSVC_LISTEN, default 127.0.0.1:50051)")
    serve.add_argument("--data-dir", help="data directory (env MEMSVC_DATA_DIR, default ./data)")
    serve.add_argument(
        "--database-url",
        help="postgresql://user@host:port/db shared by replicas; empty = SQLite in the data"
        " dir (env MEMSVC_DATABASE_URL)",
    )
    serve.add_argument("--milvus-uri", help="Milvus server URI (env MEMSVC_MILVUS_URI)")
    serve.add_argument("--collection", help="Milvus collection (env MEMSVC_COLLECTION)")
    serve.add_argument(
        "--embed-provider",
        choices=["local", "openai"],
        help="local = the model in this process; openai = an OpenAI-compatible embedding"
        " server (env MEMSVC_EMBED_PROVIDER, default local)",
    )
    serve.add_argument(
        "--embed-model",
        help="local: hub id or directory; openai: the model name sent (env MEMSVC_EMBED_MODEL)",
    )
    serve.add_argument(
        "--embed-url", help="openai: base URL, {url}/embeddings is called (env MEMSVC_EMBED_URL)"
    )
    serve.add_argument(
        "--embed-fallback",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fall back to the bundled MiniLM model (env MEMSVC_EMBED_FALLBACK, default on)",
    )
    serve.add_argument(
        "--max-turn-chars", type=int, help="characters per turn (MEMSVC_MAX_TURN_CHARS)"
    )
    serve.add_argument("--chunk-version", type=int, help="default chunk_version")
    serve.add_argument("--chunk-max-turns", type=int, help="turns per chunk window at most")
    serve.add_argument("--chunk-overlap-turns", type=int, help="turns shared by neighbours")
    serve.add_argument("--auth-tokens-file", help="'ROLE TOKEN' lines (MEMSVC_AUTH_TOKENS_FILE)")
    serve.add_argument(
        "--reflection",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="gRPC reflection (MEMSVC_REFLECTION; default on, off with auth)",
    )
    serve.add_argument("--tls-cert-file", help="PEM certificate chain (MEMSVC_TLS_CERT_FILE)")
    serve.add_argument("--tls-key-file", help="PEM private key (MEMSVC_TLS_KEY_FILE)")
    serve.add_argument(
        "--tls-client-ca-file", help="require client certificates (MEMSVC_TLS_CLIENT_CA_FILE)"
    )
    serve.add_argument(
        "--allow-insecure",
        action="store_true",
        default=None,
        help="listen beyond loopback without tokens (MEMSVC_ALLOW_INSECURE)",
    )
    serve.add_argument(
        "--http-listen",
        help="HOST:PORT: every RPC over HTTP/JSON too (Connect protocol; MEMSVC_HTTP_LISTEN)",
    )
    serve.add_argument(
        "--metrics-listen", help="Prometheus HOST:PORT, empty = off (MEMSVC_METRICS_LISTEN)"
    )
    serve.add_argument("--log-format", choices=["auto", "json", "console"])
    serve.add_argument("--log-level")
    migrate = sub.add_parser(
        "migrate",
        help="bring the event log's schema to this version and exit (serve does it too)",
    )
    migrate.add_argument("--data-dir", help="data directory (env MEMSVC_DATA_DIR)")
    migrate.add_argument("--database-url", help="PostgreSQL URL (env MEMSVC_DATABASE_URL)")
    tune = sub.add_parser(
        "tune",
        help="time the local model's runtimes on this machine, record the fastest per path"
        " (queries, passages) for the next start, print them",
    )
    tune.add_argument("--data-dir", help="data directory (env MEMSVC_DATA_DIR)")
    tune.add_argument("--json", action="store_true", help="print the record as JSON")
    add_client_commands(sub)
    return parser


def settings_from_args(argv: list[str] | None = None) -> Settings:
    return _settings(build_parser().parse_args(argv))


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {
        k: v for k, v in vars(args).items() if k != "command" and v is not None
    }
    return Settings(**overrides)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "health":
        from memsvc.transports.cli.probe import check_health

        raise SystemExit(0 if check_health(target=args.target, ca_file=args.ca_file) else 1)
    if args.command == "migrate":
        from memsvc.app import migrate_log

        try:
            print(migrate_log(_settings(args)))
        except Exception as exc:  # one line: what failed and why
            raise SystemExit(f"memsvc migrate: {exc}") from None
        raise SystemExit(0)
    if args.command == "tune":
        from memsvc.transports.cli.tune import run_tune

        settings = _settings(argparse.Namespace(data_dir=args.data_dir))
        # progress to stderr (warnings only): stdout is the result
        configure_logging(settings.log_format, "WARNING")
        raise SystemExit(run_tune(settings, args.json))
    if args.command != "serve":
        raise SystemExit(run_client(args))
    try:
        settings = _settings(args)
    except ValidationError as exc:
        for line in invalid_settings(exc):
            print(f"memsvc: {line}", file=sys.stderr)
        raise SystemExit(2) from None
    configure_logging(settings.log_format, settings.log_level)
    # tqdm reads this when imported: FlagEmbedding's progress bars stay off in a server.
    os.environ.setdefault("TQDM_DISABLE", "1")
    from memsvc.transports.grpc.server import serve

    serve(settings)


def invalid_settings(exc: ValidationError) -> list[str]:
    """One line per invalid setting, named as the operator sets it (MEMSVC_MAX_TURN_CHARS),
    with what was given; a rule across settings as it reads."""
    lines = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["loc"]:
            name = f"MEMSVC_{str(error['loc'][0]).upper()}"
            lines.append(f"{name}: {message} (got {error.get('input')!r})")
        else:  # a rule across settings: each named as it is set
            for field in sorted(Settings.model_fields, key=len, reverse=True):
                message = re.sub(rf"\b{field}\b", f"MEMSVC_{field.upper()}", message)
            lines.append(f"invalid settings: {message}")
    return lines


if __name__ == "__main__":
    main()
