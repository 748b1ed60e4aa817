"""Watches the vector store: notices it going away, reconnects (restarting Milvus Lite's
server process), and tells listeners (health service, index worker) when it changes."""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from memsvc.ports import ChunkStore

log = structlog.get_logger(__name__)


class StoreWatch:
    def __init__(self, store: ChunkStore, interval_s: float) -> None:
        self.store = store
        self.interval_s = interval_s
        self._listeners: list[Callable[[bool], None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-watch", daemon=True)
        self._reported = True

    def on_change(self, listener: Callable[[bool], None]) -> None:
        """`listener(up)` runs on the watch thread whenever the store goes down or up."""
        self._listeners.append(listener)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def check(self) -> bool:
        """One round: ping; if the store is down, report it and reconnect. Returns up."""
        store = self.store
        if not (store.up and store.ping()):
            store.mark_down()
            self._report(False)
            store.reconnect()
        self._report(store.up)
        return store.up

    def _report(self, up: bool) -> None:
        if up == self._reported:
            return
        self._reported = up
        for listener in self._listeners:
            try:
                listener(up)
            except Exception:
                log.exception("store_listener_failed")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.check()
