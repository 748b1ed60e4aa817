"""Wake-ups within one process (memsvc.ports.Notifier): a condition variable, and a count
of the notifications so far, so that one sent while its waiter was busy is not lost."""

from __future__ import annotations

import threading


class LocalNotifier:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._generation = 0

    @property
    def generation(self) -> int:
        return self._generation

    def notify(self) -> None:
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def wait(self, timeout_s: float, since: int | None = None) -> None:
        with self._changed:
            if since is not None and self._generation != since:
                return  # notified since the caller last looked
            self._changed.wait(timeout_s)
