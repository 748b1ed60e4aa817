"""The HTTP listener (MEMSVC_HTTP_LISTEN): uvicorn in a thread of `memsvc serve`, serving
the Connect bridge. Its socket is bound before the model loads, so a port in use is a
one-line start-up error like the gRPC and metrics ports.

Slow clients (slowloris: headers sent a byte at a time, no token needed) hold a connection
and a file descriptor each; 1,100 of them once starved the process of descriptors, so that
gRPC health checks and HTTP calls timed out. So a request's headers must arrive within
HEADERS_DEADLINE_S of the connection (or of the previous response), however slowly bytes
trickle in; an idle kept-alive connection closes after KEEP_ALIVE_S; and past
MAX_CONNECTIONS open connections new requests get 503 at once, leaving descriptors for
gRPC."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import uvicorn
from starlette.routing import BaseRoute
from uvicorn.protocols.http.h11_impl import H11Protocol

from memsvc.domain.limits import MAX_REQUEST_BYTES, MAX_RESPONSE_BYTES
from memsvc.transports.http.connect import Gate, connect_app
from memsvc.transports.http.hosts import HostPolicy

HEADERS_DEADLINE_S = 10.0
KEEP_ALIVE_S = 5
MAX_CONNECTIONS = 500


class HeadersDeadline(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection whose request headers are not all
    in within HEADERS_DEADLINE_S: a byte now and then does not keep it open (uvicorn's own
    keep-alive timer restarts with every byte, and only runs between requests)."""

    _due: asyncio.TimerHandle | None = None
    _waiting_since: object = None  # the request cycle the deadline was set after

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._set_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._set_deadline()  # the next request's headers on a kept-alive connection

    def handle_events(self) -> None:
        super().handle_events()
        if self._due is not None and self.cycle is not self._waiting_since:
            self._due.cancel()  # a new request's headers are in
            self._due = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._due is not None:
            self._due.cancel()
        super().connection_lost(exc)

    def _set_deadline(self) -> None:
        if self._due is not None:
            self._due.cancel()
        self._waiting_since = self.cycle
        self._due = self.loop.call_later(HEADERS_DEADLINE_S, self._too_slow)

    def _too_slow(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()


@dataclass(frozen=True)
class HttpTls:
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None


def bind(listen: str) -> socket.socket:
    """The listening socket for HOST:PORT (OSError when it cannot be had)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
        sock.listen(128)
    except (OSError, ValueError):
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class HttpServer:
    def __init__(
        self,
        sock: socket.socket,
        bridge_target: str,
        tls: HttpTls | None,
        gate: Gate | None = None,
        max_body: int = MAX_REQUEST_BYTES,
        hosts: HostPolicy | None = None,
        pages: Sequence[BaseRoute] = (),
    ) -> None:
        self.port: int = sock.getsockname()[1]
        self._sock = sock
        self._channel = grpc.insecure_channel(
            bridge_target,
            options=[
                ("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),
                ("grpc.max_send_message_length", MAX_RESPONSE_BYTES),
            ],
        )
        config = uvicorn.Config(
            connect_app(self._channel, gate, max_body, hosts, pages),
            log_level="warning",
            access_log=False,
            lifespan="off",
            http=HeadersDeadline,
            timeout_keep_alive=KEEP_ALIVE_S,
            limit_concurrency=MAX_CONNECTIONS,
            ssl_certfile=str(tls.cert_file) if tls else None,
            ssl_keyfile=str(tls.key_file) if tls else None,
            ssl_ca_certs=str(tls.client_ca_file) if tls and tls.client_ca_file else None,
            ssl_cert_reqs=ssl.CERT_REQUIRED if tls and tls.client_ca_file else ssl.CERT_NONE,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="http", daemon=True
        )

    def start(self) -> HttpServer:
        self._thread.start()
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        self._server.should_exit = True
        self._thread.join(grace_s + 5)
        self._channel.close()
        self._sock.close()
