"""Wake-ups across processes (memsvc.ports.Notifier): NOTIFY on the log's database, a
LISTEN on a connection of this process wakes its idle workers and WaitForIndexed callers.
A lost LISTEN connection is reopened; meanwhile waits still end on their time-outs (the
callers poll), so a notification is a speed-up, never needed for correctness.

`listen=False` (MEMSVC_DATABASE_LISTEN=false) is for proxies that drop notifications and for
fleets where NOTIFY's fan-out costs more than polling: workers on other replicas then find
new work by polling (every 0.5 s). `make bench-fleet` measures the difference."""

from __future__ import annotations

import threading

import psycopg
import structlog

from memsvc.storage.postgres.database import PostgresDatabase
from memsvc.storage.sqlite.notify import LocalNotifier

log = structlog.get_logger(__name__)

CHANNEL = "memsvc_work"


class PgNotifier:
    def __init__(self, database: PostgresDatabase, listen: bool = True) -> None:
        self.database = database
        self.listen = listen
        self._local = LocalNotifier()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="pg-listen", daemon=True)
        if listen:
            self._thread.start()

    def notify(self) -> None:
        self._local.notify()
        if not self.listen:
            return
        try:
            self.database.execute_outside(f"NOTIFY {CHANNEL}")
        except Exception as exc:  # a wake-up is a speed-up: waiters poll anyway
            log.debug("notify_failed", error=str(exc)[:200])

    @property
    def generation(self) -> int:
        return self._local.generation

    def wait(self, timeout_s: float, since: int | None = None) -> None:
        self._local.wait(timeout_s, since)

    def _listen(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.database.url, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=0.5):
                            self._local.notify()
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.warning("listen_reconnecting", error=str(exc)[:200])
                self._stop.wait(1.0)

    def close(self) -> None:
        self._stop.set()
        if self.listen:
            self._thread.join(timeout=5)
