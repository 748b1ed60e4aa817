"""Records of recently returned chunks, kept so a hybrid search need not read them again.

A hybrid search fuses hundreds of candidates that carry ids and scores only, then reads
the records of the few it returns: a second store round trip (~2.5 ms on Milvus Lite, a
third of a scoped search; benchmarks/archive/2026-11-25.md, Speed v4). A conversation
being talked about is searched again and again, and its best chunks come back each time.
A record is taken from here only where its content hash is the one the log's layout holds
for that chunk now: text and metadata are then those the log says are live, byte for byte
(the hash covers both), so an answer is what a read of an up-to-date store would return.
The deleted flag is outside the hash: searches that may return deleted chunks read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from memsvc.domain.records import StoredChunk
from memsvc.observability import metrics


class RecentRecords:
    """A bounded least-recently-used map of chunk id -> record (without its vector)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._records: OrderedDict[str, StoredChunk] = OrderedDict()
        self._lock = threading.Lock()

    def take(
        self,
        wanted: Sequence[tuple[str, str]],
        usable: Callable[[StoredChunk], bool] | None = None,
    ) -> dict[str, StoredChunk]:
        """The kept records among (chunk id, content hash) pairs, where the hash matches
        and the record is `usable` (one kept without turn lines a search needs is not):
        any other is a miss, to be read."""
        if not self.capacity or not wanted:
            return {}
        found: dict[str, StoredChunk] = {}
        with self._lock:
            for chunk_id, content_hash in wanted:
                kept = self._kept(chunk_id, content_hash)
                if kept is not None and (usable is None or usable(kept)):
                    self._records.move_to_end(chunk_id)
                    found[chunk_id] = kept
        metrics.SEARCH_RECORD_LOOKUPS.labels("hit").inc(len(found))
        metrics.SEARCH_RECORD_LOOKUPS.labels("miss").inc(len(wanted) - len(found))
        return found

    def hold(self, wanted: Sequence[tuple[str, str]]) -> bool:
        """Whether every (chunk id, content hash) pair is kept with that hash (a look,
        not a use: the order of eviction stays)."""
        with self._lock:
            return all(self._kept(cid, h) is not None for cid, h in wanted)

    def _kept(self, chunk_id: str, content_hash: str) -> StoredChunk | None:
        """The record kept for `chunk_id` with that content hash (the lock held)."""
        kept = self._records.get(chunk_id)
        if kept is None or not content_hash or kept.content_hash != content_hash:
            return None
        return kept

    def keep(self, records: Iterable[StoredChunk]) -> None:
        if not self.capacity:
            return
        with self._lock:
            for stored in records:
                if stored.vector is not None:  # MMR reads vectors: 1.5 KiB each, not kept
                    stored = StoredChunk(stored.record, stored.content_hash, None, stored.current)
                self._records[stored.record.chunk_id] = stored
                self._records.move_to_end(stored.record.chunk_id)
            while len(self._records) > self.capacity:
                self._records.popitem(last=False)
