"""One fleet, one projection: replicas sharing a log must share the store it is projected
into and the chunking that plans it.

Two replicas with different collections each mark turns indexed that the other cannot
find (WaitForIndexed true on one, a miss on the other); two with different chunking
re-plan each other's conversations back and forth. So the settings that decide the
projection (the store's identity, the chunk policy, the default chunk version) are
recorded in the log with the time a replica last confirmed them. A replica that starts
with other settings while the recorded ones are confirmed recently (a running replica
holds them) refuses to start, naming both; when no replica has confirmed them for
STALE_S (every replica was stopped: a deliberate change), it records its own, and the
usual start-up steps follow (a new collection is rebuilt from the log). Running
replicas confirm theirs every BEAT_S."""

from __future__ import annotations

import json
import threading
import time

import structlog

from memsvc.domain.errors import FailedPrecondition
from memsvc.ports import EventLog

log = structlog.get_logger(__name__)

FLEET_KEY = "fleet_settings"
BEAT_S = 5.0
STALE_S = 30.0


class FleetMismatch(FailedPrecondition):
    """At start: a running replica of this fleet projects with other settings."""


class FleetSettings:
    def __init__(self, events: EventLog, settings: dict[str, str]) -> None:
        self.events = events
        self.settings = settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="fleet-settings", daemon=True)

    def claim(self) -> None:
        """At start (under the bootstrap lock): record ours, or refuse if a running replica
        holds others."""
        with self.events.transaction() as tx:
            recorded = _read(tx.get_meta(FLEET_KEY))
            now = time.time()
            if recorded is not None and recorded["settings"] != self.settings:
                age = now - float(str(recorded["seen"]))
                if age < STALE_S:
                    raise FleetMismatch(
                        f"another replica of this fleet (confirmed {age:.0f} s ago) projects"
                        f" with {_describe(recorded['settings'])}; this one has"
                        f" {_describe(self.settings)}. Replicas sharing a database must share"
                        " MEMSVC_COLLECTION (and Milvus server), the chunking settings and"
                        " MEMSVC_CHUNK_VERSION: start this one with the same settings, or stop"
                        f" every replica (for {STALE_S:.0f} s) before changing them."
                    )
                log.warning(
                    "fleet_settings_changed",
                    was=_describe(recorded["settings"]),
                    now=_describe(self.settings),
                )
            tx.set_meta(FLEET_KEY, json.dumps({"settings": self.settings, "seen": now}))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                with self.events.transaction() as tx:
                    recorded = _read(tx.get_meta(FLEET_KEY))
                    if recorded is None or recorded["settings"] == self.settings:
                        tx.set_meta(
                            FLEET_KEY, json.dumps({"settings": self.settings, "seen": time.time()})
                        )
                        continue
                log.error(
                    "fleet_settings_conflict",
                    recorded=_describe(recorded["settings"]),
                    mine=_describe(self.settings),
                    effect="another replica started with other settings after this one:"
                    " their writes undo each other's; stop one of them",
                )
            except Exception as exc:  # the log away: the health watch reports it
                log.debug("fleet_beat_failed", error=str(exc)[:200])


def _read(value: str | None) -> dict[str, object] | None:
    if not value:
        return None
    try:
        found = json.loads(value)
    except ValueError:
        return None
    return found if isinstance(found, dict) and "settings" in found else None


def _describe(settings: object) -> str:
    if not isinstance(settings, dict):
        return str(settings)
    return ", ".join(f"{k} {v}" for k, v in sorted(settings.items()))
