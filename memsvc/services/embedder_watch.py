"""Whether the embedder answers, for readiness and memsvc_embedder_up.

Every search but a keyword one and every index step needs the model; a remote server that
died must not leave /readyz at 200 and health SERVING while those calls fail. The watch asks
the embedder every `interval_s` (a remote one is sent one short request unless a call just
succeeded), so an outage is seen without traffic, and stays seen for as long as it lasts, not
only during the circuit's cooling-off windows. Appends still go through meanwhile: the
`writes` health service does not follow the embedder."""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from memsvc.ports import Embedder

log = structlog.get_logger(__name__)


class EmbedderWatch:
    def __init__(self, embedder: Embedder, interval_s: float) -> None:
        self.embedder = embedder
        self.interval_s = interval_s
        self._up = True
        self._listeners: list[Callable[[bool], None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="embedder-watch", daemon=True)

    @property
    def up(self) -> bool:
        """Down from a failed check until one succeeds, and at once while a remote
        embedder's circuit is open (a call just failed), before the next check."""
        return self._up and self.embedder.available()

    def on_change(self, listener: Callable[[bool], None]) -> None:
        """`listener(up)` runs on the watch thread whenever the embedder stops or resumes
        answering."""
        self._listeners.append(listener)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def check(self) -> bool:
        up = self.embedder.ping(self.interval_s)
        if up != self._up:
            self._up = up
            if up:
                log.info("embedder_up")
            else:
                log.error("embedder_down", model=self.embedder.name)
            for listener in self._listeners:
                try:
                    listener(up)
                except Exception:
                    log.exception("embedder_listener_failed")
        return up

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.check()
