"""Slow clients (issue 62, item 7): connections that send their headers a byte at a time,
with no token, were never timed out; with the open-file limit at 1,024, 1,100 of them made
a new gRPC health check and an HTTP call time out. Now an HTTP request's headers must all
arrive within HEADERS_DEADLINE_S, a gRPC connection's HTTP/2 preface within the handshake
time-out, and both listeners answer again once those connections are closed, while the
slow clients still trickle bytes. The server runs as a child process whose open-file limit
is held at 1,024 (so raising it at start cannot help): the subject is file descriptors."""

from __future__ import annotations

import contextlib
import resource
import socket
import threading
import time
from pathlib import Path

import grpc
import httpx2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memsvc.transports.http.server import HEADERS_DEADLINE_S
from tests.support.launch import free_port, start_child, wait_serving

HTTP_SLOW = 600
GRPC_SLOW = 500  # 1,100 in all, past the server's 1,024 open files
HTTP_START = b"POST /memsvc.v1.MemoryService/GetIndexStatus HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
GRPC_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def answers(http_port: int, channel: grpc.Channel) -> bool:
    """A new HTTP call and a new gRPC health check both answer."""
    try:
        reply = httpx2.post(
            f"http://127.0.0.1:{http_port}/memsvc.v1.MemoryService/GetIndexStatus",
            json={"conversationIds": ["x"]},
            timeout=5,
        )
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
    except (httpx2.HTTPError, grpc.RpcError, OSError):
        return False
    return reply.status_code == 200 and health.status == health_pb2.HealthCheckResponse.SERVING


def closed_by_peer(sock: socket.socket, deadline: float) -> bool:
    """Whether the server closes this connection before `deadline` (monotonic)."""
    sock.settimeout(max(0.1, deadline - time.monotonic()))
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False  # still open: nothing came


def test_slow_connections_are_closed_and_the_server_answers_again(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    port, http_port = free_port(), free_port()
    proc = start_child(
        tmp_path / "data", port, "--http-listen", f"127.0.0.1:{http_port}", open_files=1024
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    slow: list[tuple[socket.socket, bytes]] = []
    stop = threading.Event()

    def trickle() -> None:
        # each slow client sends one more byte of its request every second
        sent = 0
        while not stop.wait(1.0):
            for sock, data in slow:
                with contextlib.suppress(OSError):  # closed by the server
                    sock.send(data[sent % len(data) : sent % len(data) + 1])
            sent += 1

    try:
        wait_serving(channel, proc)
        assert answers(http_port, channel)
        for count, target, start in (
            (HTTP_SLOW, http_port, HTTP_START),
            (GRPC_SLOW, port, GRPC_PREFACE),
        ):
            for _ in range(count):
                sock = socket.create_connection(("127.0.0.1", target), timeout=30)
                sock.send(start[:1])
                slow.append((sock, start[1:] if target == port else b"a"))
        threading.Thread(target=trickle, daemon=True).start()
        # held: every descriptor the server has is taken by a slow client
        deadline = time.monotonic() + HEADERS_DEADLINE_S + 60
        while not answers(http_port, channel):
            assert time.monotonic() < deadline, "the slow clients still hold the server"
            assert proc.poll() is None
            time.sleep(1)
        # and the slow clients' connections are gone, though each sent a byte every second
        sample = slow[:50] + slow[GRPC_SLOW : GRPC_SLOW + 50]
        by = time.monotonic() + HEADERS_DEADLINE_S + 20
        assert sum(closed_by_peer(sock, by) for sock, _ in sample) == len(sample)
    finally:
        stop.set()
        for sock, _ in slow:
            sock.close()
        channel.close()
        proc.terminate()
        proc.wait(timeout=60)
