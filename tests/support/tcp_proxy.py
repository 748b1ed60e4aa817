"""A TCP proxy a test controls, to cut a service off the way networks fail: `partition()`
keeps every connection open and silently drops the bytes (a switch that stops forwarding,
a firewall that drops packets: nobody hears a reset), `heal()` forwards again, and
`reset()` closes every connection (a crash on the far side), and `answers_lost()` forwards
requests but drops what comes back (the reply of a call that was done never arrives).
Bytes a partition dropped are lost, as on a network: the connections they belonged to are
broken for good."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._answering = threading.Event()  # the far side's bytes come back
        self._answering.set()
        self._closed = threading.Event()
        self._guard = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()

    def partition(self) -> None:
        """From now on no byte crosses, in either direction; connections stay open."""
        self._forwarding.clear()

    def heal(self) -> None:
        self._forwarding.set()
        self._answering.set()

    def answers_lost(self) -> None:
        """From now on requests reach the far side, and nothing it sends comes back."""
        self._answering.clear()

    def reset(self) -> None:
        # shut down, not closed here: a pipe thread may be about to use the descriptor, and
        # once closed its number is reused by the next accepted connection, whose bytes
        # that thread would then read (seen: a new channel's stream "Socket closed")
        with self._guard:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    @contextmanager
    def partitioned(self) -> Iterator[None]:
        self.partition()
        try:
            yield
        finally:
            self.heal()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        self.reset()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._guard:
                self._sockets += [client, upstream]
            pipes = [
                threading.Thread(target=self._pipe, args=(a, b, gate), daemon=True)
                for a, b, gate in (
                    (client, upstream, self._forwarding),
                    (upstream, client, self._answering),
                )
            ]
            for pipe in pipes:
                pipe.start()
            threading.Thread(
                target=self._close_after, args=(pipes, client, upstream), daemon=True
            ).start()

    @staticmethod
    def _close_after(pipes: list[threading.Thread], *sockets: socket.socket) -> None:
        """Both directions ended: nothing uses the descriptors any more."""
        for pipe in pipes:
            pipe.join()
        for s in sockets:
            s.close()

    def _pipe(self, source: socket.socket, sink: socket.socket, gate: threading.Event) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            if not (self._forwarding.is_set() and gate.is_set()):
                # Partitioned: what arrives is dropped. The sender's kernel saw it delivered
                # (to this proxy), so only a time-out above TCP notices: the harder case.
                continue
            try:
                sink.sendall(data)
            except OSError:
                break
        for s in (source, sink):  # the other direction ends too
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
