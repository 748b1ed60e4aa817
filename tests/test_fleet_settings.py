"""One fleet, one projection (memsvc.services.fleet), on a real PostgreSQL log shared by two
replicas' records in this process (the subject is the records' bookkeeping; the fleet of
processes is tests/fleet). Issue 62:
- item 6: 45 s of clock skew defeated the check (a replica compared another's `seen` stamp
  with its own wall clock, took a live replica for a dead one, and started with another
  collection);
- item 3: after the store came back empty, each running replica's record kept the store
  identity it started with, so a restarted replica with identical settings was refused
  and crash-looped."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from memsvc.config import Settings
from memsvc.ports import EventLog
from memsvc.services import fleet
from memsvc.services.fleet import FleetMismatch, FleetSettings
from tests.support.postgres import PostgresCluster


@pytest.fixture()
def shared_log(postgres: PostgresCluster) -> Iterator[EventLog]:
    from memsvc.app import open_backend

    backend = open_backend(Settings(database_url=postgres.create_database()))
    yield backend.log
    backend.close()


def projecting(collection: str) -> dict[str, str]:
    return {"collection": collection, "chunking": "6/2/510", "chunk_version": "1"}


def test_a_replica_whose_clock_runs_ahead_still_sees_a_live_one(
    shared_log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    running = FleetSettings(shared_log, "a", lambda: projecting("memsvc_chunks (1)"))
    running.claim()
    # the second replica's machine runs 45 s ahead: whatever its own clock says, the log's
    # time decides a record's age, and the first replica confirmed just now
    skewed = time.time() + 45
    monkeypatch.setattr(fleet, "time", type("Clock", (), {"time": lambda: skewed})(), raising=False)
    other = FleetSettings(shared_log, "b", lambda: projecting("other_collection (2)"))
    with pytest.raises(FleetMismatch, match="another replica of this fleet"):
        other.claim()
    # a record confirmed on the log's clock long ago is stale, whatever anyone's clock
    with shared_log.transaction() as tx:
        tx.set_meta(fleet.PREFIX + "a", fleet._value(projecting("x"), tx.clock() - 31))
    other.claim()


def test_a_restart_into_a_rebuilt_fleet_joins_it(shared_log: EventLog) -> None:
    store = {"identity": "memsvc_chunks (100|a)"}
    running = FleetSettings(shared_log, "a", lambda: projecting(store["identity"]))
    running.claim()
    # the store came back empty: the running replica reconnected to it (a new identity)
    # and its next confirmation records that
    store["identity"] = "memsvc_chunks (200|b)"
    running.confirm()
    restarted = FleetSettings(shared_log, "b", lambda: projecting("memsvc_chunks (200|b)"))
    restarted.claim()  # joins: the same settings as the running replica has now
    stale = FleetSettings(shared_log, "c", lambda: projecting("memsvc_chunks (100|a)"))
    with pytest.raises(FleetMismatch):
        stale.claim()
