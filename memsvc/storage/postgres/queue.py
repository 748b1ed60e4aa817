"""The index queue on a database several processes share."""

from __future__ import annotations

from memsvc.storage.sql.queue import SqlIndexQueue


class SharedIndexQueue(SqlIndexQueue):
    def release_stale_leases(self) -> int:
        """Nothing to release at start: another replica's live leases are not stale, and a
        dead one's lapse (MEMSVC_INDEX_LEASE_S) and are taken over."""
        return 0
