"""Wake-ups within one process (memsvc.ports.Notifier): a condition variable."""

from __future__ import annotations

import threading


class LocalNotifier:
    def __init__(self) -> None:
        self._changed = threading.Condition()

    def notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def wait(self, timeout_s: float) -> None:
        with self._changed:
            self._changed.wait(timeout_s)
