"""The gRPC server: listen early (health NOT_SERVING while the model loads), interceptors,
health and reflection, TLS, and `memsvc serve`'s life cycle."""

from __future__ import annotations

import os
import resource
import signal
import threading
import uuid
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from memsvc.app import Services, build_services
from memsvc.config import Settings
from memsvc.domain.errors import FailedPrecondition
from memsvc.domain.limits import MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES
from memsvc.observability import metrics, startup, tracing
from memsvc.storage import datadir
from memsvc.storage.postgres.database import DatabaseUnreachable
from memsvc.storage.sqlite.schema import SchemaTooNew
from memsvc.transports.console import PATH as CONSOLE_PATH
from memsvc.transports.console import console_routes
from memsvc.transports.grpc.auth import (
    AuthInterceptor,
    Denial,
    TokenFileError,
    TokenTable,
    authenticate,
    is_loopback,
)
from memsvc.transports.grpc.calls import SERVICE_NAME
from memsvc.transports.grpc.decoding import DecodeGuard
from memsvc.transports.grpc.servicer import MemoryServicer
from memsvc.transports.grpc.tls import tls_files
from memsvc.transports.http.connect import Gate, Refusal
from memsvc.transports.http.hosts import HostPolicy
from memsvc.transports.http.server import HttpServer, HttpTls, bind
from memsvc.v1 import memory_pb2_grpc as pb_grpc

log = structlog.get_logger(__name__)

# Health of writes alone: NOT_SERVING while the disk is full or the log or store is down
# (reads still SERVING), SERVING while only the embedder is (appends need no model).
WRITES_HEALTH = f"{SERVICE_NAME}.Writes"
# grpcio-reflection serves v1alpha only; v1 (what current grpcurl, Postman and the other
# languages' tools ask first) is the same protocol under another name, served alongside.
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
HANDSHAKE_TIMEOUT_MS = 10_000


def _enable_reflection(server: grpc.Server) -> None:
    """Server reflection under v1alpha and v1 (identical messages, different service)."""
    from grpc_reflection.v1alpha import reflection_pb2 as rpb
    from grpc_reflection.v1alpha import reflection_pb2_grpc

    names = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME, REFLECTION_V1)
    servicer = reflection.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(
        REFLECTION_V1,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=rpb.ServerReflectionRequest.FromString,
                response_serializer=rpb.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1,))


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    servicer: MemoryServicer
    health: health.HealthServicer
    serving: bool = False  # the overall health status, for /readyz
    # A private address of this server for the HTTP bridge (empty: none)
    bridge_target: str = ""

    def mark_ready(self, services: Services) -> None:
        self.servicer.attach(services)

        def check(_: bool) -> None:
            self.set_serving(
                services.store.up and services.health.log_up and services.embedder_watch.up
            )
            # writes need the log and the store, not the model (it runs later, in the worker)
            self.set_writable(services.health.writable and services.store.up)

        check(True)
        # NOT_SERVING while the vector store, the log's database or the embedder is down,
        # SERVING again once all are back.
        services.store_watch.on_change(check)
        services.health.on_log_change(check)
        services.embedder_watch.on_change(check)
        services.health.on_change(check)

    def set_writable(self, writable: bool) -> None:
        self.health.set(
            WRITES_HEALTH,
            health_pb2.HealthCheckResponse.SERVING
            if writable
            else health_pb2.HealthCheckResponse.NOT_SERVING,
        )

    def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        self.serving = serving
        for name in ("", SERVICE_NAME):
            self.health.set(name, status)

    def stop(self, grace: float = 5.0) -> None:
        """Health NOT_SERVING at once, new calls refused, calls in flight get `grace`
        seconds; returns when their handlers have finished (or `grace` + 10 s)."""
        self.set_serving(False)
        self.set_writable(False)
        self.server.stop(grace).wait()
        if not self.servicer.in_flight.wait_idle(10.0):
            log.warning("shutdown_handlers_still_running")


def start_server(
    listen: str,
    workers: int = 40,
    max_waiting_calls: int = 4,
    max_heavy_calls: int = 4,
    tokens: TokenTable | None = None,
    max_embedding_calls: int = 16,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    credentials: grpc.ServerCredentials | None = None,
    reflection_on: bool | None = None,
    bridge: bool = False,
    max_write_calls: int = 8,
) -> RunningServer:
    """Listen now (health NOT_SERVING, RPCs UNAVAILABLE) so probes work during model load.
    With `tokens`, MemoryService calls need a bearer token (health stays open) and
    reflection is off unless `reflection_on`."""
    interceptors: list[Any] = [DecodeGuard()]
    if tokens is not None:
        # the auth check runs on the decoded request, inside the decode guard
        interceptors.append(AuthInterceptor(tokens))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rpc"),
        interceptors=interceptors,
        options=[
            # read whole before any interceptor sees the token: kept small
            ("grpc.max_receive_message_length", max_request_bytes),
            ("grpc.max_send_message_length", MAX_RESPONSE_BYTES),
            # a connection that has not finished its HTTP/2 preface and settings by then is
            # closed (gRPC's default waits 120 s: slow clients would hold descriptors)
            ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
        ],
    )
    servicer = MemoryServicer(
        max_waiting_calls,
        max_heavy_calls,
        max_embedding_calls,
        authenticated=tokens is not None,
        max_write_calls=max_write_calls,
    )
    pb_grpc.add_MemoryServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    for name in ("", SERVICE_NAME, WRITES_HEALTH):
        health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if reflection_on if reflection_on is not None else tokens is None:
        _enable_reflection(server)
    if credentials is not None:
        port = server.add_secure_port(listen, credentials)
    else:
        port = server.add_insecure_port(listen)
    if port == 0:
        raise SystemExit(f"memsvc: cannot listen on {listen}: the address is in use or not ours")
    bridge_target = ""
    if bridge:
        # An abstract Unix socket: no file, gone with the process; calls through it still
        # need a token (the interceptors are the server's).
        bridge_target = f"unix-abstract:memsvc-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        if server.add_insecure_port(bridge_target) == 0:
            raise SystemExit(f"memsvc: cannot open the HTTP bridge at {bridge_target}")
    server.start()
    return RunningServer(server, port, servicer, health_servicer, bridge_target=bridge_target)


def http_gate(tokens: TokenTable) -> Gate:
    """The gRPC check, on an HTTP call's headers, before its body is read."""

    def gate(method: str, authorization: list[str]) -> Refusal | None:
        verdict = authenticate(tokens, method, [("authorization", v) for v in authorization])
        if isinstance(verdict, Denial):
            return verdict.code, verdict.message, verdict.reason
        return None

    return gate


def check_exposure(settings: Settings) -> None:
    """Refuse to serve beyond loopback with nobody authenticated, unless told to."""
    if settings.auth_tokens_file or settings.allow_insecure:
        return
    exposed = [a for a in (settings.listen, settings.http_listen) if a and not is_loopback(a)]
    if not exposed:
        return
    raise SystemExit(
        f"memsvc: refusing to listen on {exposed[0]} without authentication: anyone who"
        " can reach it could read and erase every conversation. Set MEMSVC_AUTH_TOKENS_FILE"
        " (--auth-tokens-file) to a file of 'ROLE TOKEN' lines (and TLS with"
        " MEMSVC_TLS_CERT_FILE / MEMSVC_TLS_KEY_FILE), listen on 127.0.0.1, or set"
        " MEMSVC_ALLOW_INSECURE=true (--allow-insecure) if a network policy protects it."
    )


class StoppedDuringStartup(BaseException):
    """SIGINT or SIGTERM before the service was ready: the start is abandoned (build_services
    closes what it opened), and the process exits cleanly. A BaseException, as
    KeyboardInterrupt is: the model load's fallbacks (`except Exception`: another model, torch
    instead of ONNX) must not swallow it and carry on to serve."""


# Start-up failures with a cause the operator can act on: a one-line message, no traceback.
STARTUP_ERRORS: tuple[type[BaseException], ...] = (
    FailedPrecondition,  # the collection holds another model's vectors
    SchemaTooNew,
    DatabaseUnreachable,
    datadir.DataDirBusy,
)


def raise_open_file_limit() -> int:
    """The soft limit on open files raised to the hard one (at most 1,048,576): every
    connection holds a descriptor, and a default of 1,024 let slow clients starve the
    server. Returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard if hard != resource.RLIM_INFINITY else 1 << 20, 1 << 20)
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (OSError, ValueError):
            pass
    return soft


def serve(settings: Settings) -> None:
    """`memsvc serve`: everything that can fail at once is checked before the model loads
    (ports, the data dir lock, the tokens file), each failure a one-line error; then load
    model and store and serve until SIGINT/SIGTERM."""
    check_exposure(settings)
    tracing.configure(settings.trace_conversations)
    open_files = raise_open_file_limit()
    # Everything the service writes (event log, cache, Milvus Lite files) is private.
    os.umask(0o077)
    try:
        tokens = TokenTable(settings.auth_tokens_file) if settings.auth_tokens_file else None
    except TokenFileError as exc:
        raise SystemExit(f"memsvc: auth tokens file: {exc}") from None
    tls = tls_files(settings)  # one line naming the setting, before anything loads
    try:
        datadir.lock(settings.data_dir)
    except (datadir.DataDirBusy, OSError) as exc:
        raise SystemExit(f"memsvc: {exc}") from None
    metrics_port = None
    if settings.metrics_listen:
        try:
            metrics_port = metrics.serve_metrics(settings.metrics_listen)
        except OSError as exc:
            raise SystemExit(
                f"memsvc: cannot serve metrics on {settings.metrics_listen}: {exc.strerror}"
                " (MEMSVC_METRICS_LISTEN or --metrics-listen: a second server needs a port"
                " of its own; empty turns metrics off)"
            ) from None
    http_socket = None
    if settings.http_listen:
        try:
            http_socket = bind(settings.http_listen)
        except (OSError, ValueError) as exc:
            raise SystemExit(
                f"memsvc: cannot serve HTTP on {settings.http_listen}:"
                f" {getattr(exc, 'strerror', None) or exc} (MEMSVC_HTTP_LISTEN; empty turns it off)"
            ) from None
    running = start_server(
        settings.listen,
        settings.grpc_workers,
        settings.max_waiting_calls,
        settings.max_heavy_calls,
        tokens=tokens,
        max_embedding_calls=settings.max_embedding_calls,
        max_write_calls=settings.max_write_calls,
        max_request_bytes=settings.max_request_mb * 1024 * 1024,
        credentials=tls.grpc_credentials() if tls is not None else None,
        reflection_on=settings.reflection,
        bridge=http_socket is not None,
    )
    http_server = None
    if http_socket is not None:
        gate = None if tokens is None else http_gate(tokens)
        http_server = HttpServer(
            http_socket,
            running.bridge_target,
            HttpTls(tls.cert, tls.key, tls.client_ca) if tls is not None else None,
            gate,
            max_body=settings.max_request_mb * 1024 * 1024,
            hosts=HostPolicy(
                allowed_hosts=settings.allowed_hosts,
                check_host=tokens is None or is_loopback(settings.http_listen),
                cors_origins=tuple(settings.cors_origins),
            ),
            pages=console_routes() if settings.http_console else (),
        ).start()
        log.info(
            "http_listening",
            address=f"{settings.http_listen.rpartition(':')[0]}:{http_server.port}",
            protocol="connect",
            cors_origins=settings.cors_origins or "none",
            console=f"{CONSOLE_PATH}/" if settings.http_console else "off",
        )
    host = settings.listen.rpartition(":")[0]
    log.info(
        "listening",
        address=f"{host}:{running.port}",
        health="NOT_SERVING until ready",
        auth=tokens is not None,
        tls=settings.tls_cert_file is not None,
        mtls=settings.tls_client_ca_file is not None,
        open_files=open_files,
    )
    if metrics_port is not None:
        log.info("metrics", address=f"{settings.metrics_listen.rpartition(':')[0]}:{metrics_port}")
    stop = threading.Event()
    starting = [True]

    def on_stop(signum: int, _frame: object) -> None:
        stop.set()
        if starting[0]:  # abandon the model load rather than finish it first
            raise StoppedDuringStartup(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_stop)
    if tokens is not None:
        # token rotation without a restart
        signal.signal(signal.SIGHUP, lambda *_: tokens.reload())
    try:
        services = build_services(settings)
        starting[0] = False
    except StoppedDuringStartup as exc:
        log.info("stopped_during_startup", signal=str(exc))
        if http_server is not None:
            http_server.stop(0)
        running.stop(0)
        datadir.unlock(settings.data_dir)
        return
    except STARTUP_ERRORS as exc:
        running.stop(0)
        raise SystemExit(f"memsvc: {exc}") from None
    except Exception:
        running.stop(0)
        raise
    running.mark_ready(services)
    startup.done()
    metrics.SERVICE_GAUGES.read = services.gauges
    metrics.set_build_info(services.describe())
    metrics.READINESS.read = lambda: running.serving
    notice = services.describe().model_notice
    metrics.READINESS.notes = lambda: [notice] if notice else []
    log.info("serving", address=f"{host}:{running.port}", model=services.embedder.name)
    # A signal may be delivered to any thread (ONNX Runtime's and torch's pools do not block
    # them), and Python runs its handlers in the main thread only between bytecodes: a single
    # blocking wait here could sleep through SIGHUP or SIGTERM. Wait in short steps.
    while not stop.wait(0.2):
        pass
    log.info("shutting_down", grace_s=settings.shutdown_grace_s)
    if http_server is not None:
        http_server.stop(settings.shutdown_grace_s)
    running.stop(settings.shutdown_grace_s)
    services.close()
    datadir.unlock(settings.data_dir)
    tracing.shutdown()
    log.info("stopped")
