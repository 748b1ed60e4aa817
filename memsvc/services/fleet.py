"""One fleet, one projection: replicas sharing a log must share the store it is projected
into and the chunking that plans it.

Two replicas with different collections each mark turns indexed that the other cannot
find (WaitForIndexed true on one, a miss on the other); two with different chunking
re-plan each other's conversations back and forth. So each running replica records, in
the log, the settings that decide the projection (the store's identity, the chunk policy,
the default chunk version) and confirms them every BEAT_S; a clean stop removes its
record. A replica that starts with other settings than a replica confirmed within
STALE_S refuses to start, naming both. To change them, stop every replica first (a
killed one's record goes stale after STALE_S), then start them with the new settings: the
usual start-up steps follow (a new collection is rebuilt from the log).
Each confirmation records the settings as they are now: a store that came back empty (and
was rebuilt from the log) has a new identity, which every replica's record takes once that
replica reconnects to it, so a replica restarting into the rebuilt fleet joins it. Stamps
are the database's time, never a replica's own clock: a replica whose clock runs ahead
must not take a live replica's record for a dead one's."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import structlog

from memsvc.domain.errors import FailedPrecondition
from memsvc.ports import EventLog

log = structlog.get_logger(__name__)

PREFIX = "fleet_replica:"
BEAT_S = 5.0
STALE_S = 30.0


class FleetMismatch(FailedPrecondition):
    """At start: a running replica of this fleet projects with other settings."""


class FleetSettings:
    def __init__(
        self, events: EventLog, owner: str, settings: Callable[[], dict[str, str]]
    ) -> None:
        self.events = events
        self.key = PREFIX + owner
        self.settings = settings  # what this replica projects with, now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="fleet-settings", daemon=True)

    def claim(self) -> None:
        """At start (under the bootstrap lock): refuse if a running replica projects with
        other settings, else record ours."""
        mine = self.settings()
        with self.events.transaction() as tx:
            now = tx.clock()
            for key, value in tx.meta_with_prefix(PREFIX).items():
                other = _read(value)
                if other is None or key == self.key:
                    continue
                age = now - other[1]
                if age >= STALE_S:
                    tx.delete_meta(key)  # a replica killed long ago
                elif other[0] != mine:
                    raise FleetMismatch(
                        f"another replica of this fleet ({key[len(PREFIX) :]}, confirmed"
                        f" {age:.0f} s ago) projects with {_describe(other[0])}; this one has"
                        f" {_describe(mine)}. Replicas sharing a database must share"
                        " MEMSVC_COLLECTION (and Milvus server), the chunking settings and"
                        " MEMSVC_CHUNK_VERSION: start this one with the same settings, or stop"
                        " every replica before changing them."
                    )
            tx.set_meta(self.key, _value(mine, now))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """A clean stop: the record goes (another replica may then change the settings)."""
        self._stop.set()
        try:
            with self.events.transaction() as tx:
                tx.delete_meta(self.key)
        except Exception as exc:  # the log away: the record goes stale by itself
            log.debug("fleet_record_not_removed", error=str(exc)[:200])

    def confirm(self) -> None:
        """Record this replica's settings as they are now, stamped with the log's time."""
        with self.events.transaction() as tx:
            tx.set_meta(self.key, _value(self.settings(), tx.clock()))

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                self.confirm()
            except Exception as exc:  # the log away: the health watch reports it
                log.debug("fleet_beat_failed", error=str(exc)[:200])


def _value(settings: dict[str, str], now: float) -> str:
    return json.dumps({"settings": settings, "seen": now})


def _read(value: str) -> tuple[dict[str, str], float] | None:
    try:
        found = json.loads(value)
        return dict(found["settings"]), float(found["seen"])
    except (ValueError, KeyError, TypeError):
        return None


def _describe(settings: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(settings.items()))
