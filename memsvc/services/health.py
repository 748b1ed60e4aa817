"""Whether the log answers and writes can go through: a database that went away makes calls
UNAVAILABLE until a ping finds it back; a full disk stops writes (DISK_FULL) until a probe
finds space. Reads from the store keep working meanwhile."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from memsvc.domain.errors import DiskFull, LogUnavailable
from memsvc.ports import EventLog

log = structlog.get_logger(__name__)

PROBE_KEY = "disk_probe"
# Free space the data dir's disk needs before writes count as back: a small write can land
# in pages SQLite already holds (its WAL) while the disk is still full.
MIN_FREE_BYTES = 8 * 1024 * 1024


class Health:
    def __init__(self, log_: EventLog, data_dir: Path | None, check_s: float = 1.0) -> None:
        self.log = log_
        self.data_dir = data_dir
        self.check_s = check_s
        self._full_since: float | None = None
        self._log_up = True
        self._guard = threading.Lock()
        self._listeners: list[Callable[[bool], None]] = []
        self._log_listeners: list[Callable[[bool], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watch = threading.Thread(target=self._watch_log, name="log-watch", daemon=True)

    def start(self) -> None:
        self._watch.start()

    @property
    def disk_full(self) -> bool:
        return self._full_since is not None

    @property
    def log_up(self) -> bool:
        return self._log_up

    @property
    def writable(self) -> bool:
        return self._log_up and self._full_since is None

    def on_change(self, listener: Callable[[bool], None]) -> None:
        """`listener(writable)` runs whenever writes stop or resume."""
        self._listeners.append(listener)

    def on_log_change(self, listener: Callable[[bool], None]) -> None:
        """`listener(up)` runs whenever the log goes away or comes back."""
        self._log_listeners.append(listener)

    def observe(self, exc: BaseException) -> None:
        """Called with an error a call or step raised: a lost database marks the log down
        (the watch brings it back); a full disk stops writes until a probe succeeds."""
        if isinstance(exc, LogUnavailable):
            self._set_log(False)
            return
        if not isinstance(exc, DiskFull):
            return
        with self._guard:
            if self._full_since is not None:
                return
            self._full_since = time.time()
            self._thread = threading.Thread(target=self._probe, name="disk-probe", daemon=True)
            self._thread.start()
        log.error("disk_full", error=str(exc)[:300])
        self._report(False)

    def _probe(self) -> None:
        while not self._stop.wait(self.check_s):
            if self.data_dir is not None and _free_bytes(self.data_dir) < MIN_FREE_BYTES:
                continue
            try:
                with self.log.transaction() as tx:
                    tx.set_meta(PROBE_KEY, str(time.time()))
            except DiskFull:
                continue
            except Exception as exc:
                log.warning("disk_probe_failed", error=str(exc)[:300])
                continue
            with self._guard:
                self._full_since = None
            log.info("disk_writable")
            self._report(self.writable)
            return

    def _watch_log(self) -> None:
        while not self._stop.wait(self.check_s):
            self._set_log(self.log.ping())

    def _set_log(self, up: bool) -> None:
        with self._guard:
            if up == self._log_up:
                return
            self._log_up = up
        if up:
            log.info("log_up")
        else:
            log.error("log_down")
        for listener in self._log_listeners:
            try:
                listener(up)
            except Exception:
                log.exception("log_health_listener_failed")
        self._report(self.writable)

    def _report(self, writable: bool) -> None:
        for listener in self._listeners:
            try:
                listener(writable)
            except Exception:
                log.exception("write_health_listener_failed")

    def stop(self) -> None:
        self._stop.set()


def _free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize
