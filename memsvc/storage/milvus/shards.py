"""A collection in shards: conversations spread over a fixed number of Milvus collections by
a stable hash of their id, so that what concerns one conversation (a scoped search, the
index step's reads and writes, a purge, an export) runs on one shard's rows.

Milvus Lite 2.5.1 keeps a collection in one growing segment and evaluates a filter on
every row it holds (~25 ns a row): the cost of a call is the rows of the collection it
runs on, and a million chunks in one made a scoped search 5x an empty store's
(benchmarks/archive/2026-11-29.md). In shards, a call pays for its shard's rows; a search
that no conversation limits asks every shard and merges (the same brute-force total).

Shard 0 is the configured collection itself, and its marker records the count: a store of
one shard is the layout before shards, and a store keeps the count it was made with
(another count is another collection, rebuilt from the log: docs/operations/sizing.md).

Loading is lazy (`Residency`): Milvus Lite opens its file in half a second but loads a
collection's rows into memory when asked (~50 us a row), so the node serves at once, loads
shards in the background, and a call on a shard not yet loaded loads it first. With a
memory budget, the shards used least recently are released past it and loaded again when
next used."""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import structlog

from memsvc.domain.bm25 import tenant
from memsvc.domain.records import Candidate
from memsvc.ports import SearchScope

log = structlog.get_logger(__name__)

# Milvus Lite's memory per row held loaded (a 384-dimension vector, its text, sparse
# vector and scalars), on the safe side: 4,136 MiB at 967,890 chunks in 32 shards loaded
# long ago (4,480 a row), ~4,900 a row just after a load (the allocator keeps some of the
# load's own memory a while; benchmarks/RESULTS.md, Scale v3). It holds a collection's
# vectors in blocks of 32,768 rows, the first made with its first row (48 MiB at 384
# dimensions): a shard of ~30,000 rows fills its block.
BYTES_PER_ROW = 5_000


def shard_name(base: str, index: int) -> str:
    return base if index == 0 else f"{base}_shard{index}"


def shard_index(conversation_id: str, count: int) -> int:
    """Stable across processes and versions (Python's hash() is salted per process)."""
    if count == 1:
        return 0
    digest = hashlib.blake2b(conversation_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


@dataclass(frozen=True)
class ShardMap:
    """Which shard holds which conversation: the hash of its id, or with `by_tenant` of its
    tenant (the id up to its first "/": memsvc.domain.bm25.tenant), so that a search of
    one tenant's conversations (a token limited to its prefix) asks one shard. Tenants of
    unequal size make shards of unequal size, and ids without a "/" all share one."""

    base: str
    count: int
    by_tenant: bool = False

    @property
    def names(self) -> list[str]:
        return [shard_name(self.base, i) for i in range(self.count)]

    def of(self, conversation_id: str) -> str:
        key = tenant(conversation_id) if self.by_tenant else conversation_id
        return shard_name(self.base, shard_index(key, self.count))

    def holding(self, conversation_ids: Iterable[str]) -> list[str]:
        """The shards of these conversations (every shard when none is named: a caller
        that does not know whose rows it asks for)."""
        named = list(dict.fromkeys(self.of(c) for c in conversation_ids))
        return named or self.names

    def for_scope(self, scope: SearchScope) -> list[str]:
        """The shards a search must ask: those of the conversations it names; by tenant,
        those of the tenants its prefixes lie in (a prefix with a "/" lies in one: `t07/`
        and `t07/u1` in `t07/`); else all."""
        if scope.filters.conversation_ids:
            return self.holding(scope.filters.conversation_ids)
        prefixes = scope.prefixes
        if self.by_tenant and prefixes and all("/" in p for p in prefixes):
            return list(dict.fromkeys(self.of(p) for p in prefixes))
        return self.names


def first_ask(limit: int, shards: int) -> int:
    """How many candidates a search of several shards asks each for first: twice a shard's
    share of `limit`, and four more. A shard answers in full (`asked_again`) only where its
    share of the best runs past that. Milvus Lite returns what it was asked for, and
    pymilvus decodes each candidate in Python: an unscoped hybrid search of a million
    chunks in 32 shards took 308 ms asking each shard for 300, 275 ms for 40
    (benchmarks/archive/2026-12-06.md, Scale v3)."""
    return min(limit, -(-2 * limit // shards) + 4)


def asked_again(parts: Sequence[Sequence[Candidate]], asked: int, limit: int) -> list[int]:
    """Of shards asked for `asked` candidates each, the ones whose further candidates could
    be among the best `limit` of all: those that returned all they were asked for, the last
    scoring at least the `limit`-th best of all (each of them while fewer came back). So
    the merge is the best `limit` of every shard's rows, as one collection would give."""
    if asked >= limit:
        return []
    scores = sorted((c.score for part in parts for c in part), reverse=True)
    bar = scores[limit - 1] if len(scores) >= limit else float("-inf")
    return [i for i, part in enumerate(parts) if len(part) >= asked and part[-1].score >= bar]


def merged(parts: Iterable[Sequence[Candidate]], limit: int) -> list[Candidate]:
    """The best `limit` of every shard's candidates: their scores are on one scale
    (cosines; BM25 weights the query carries)."""
    return sorted((c for part in parts for c in part), key=lambda c: -c.score)[:limit]


@dataclass
class _Shard:
    loaded: bool = False
    rows: int = 0
    in_use: int = 0
    last_used: float = 0.0


class Residency:
    """Which shards are loaded. `using(names)` loads those not loaded (one at a time, the
    caller waits) and holds them loaded for the block; with a budget, loading one releases
    the idle shards used least recently until the estimate of what is loaded fits.

    `load` and `release` are the store's calls; `rows` counts a loaded shard's rows;
    `held_outside` is the memory the budget holds besides the loaded shards' rows (memsvc's
    own, Milvus Lite's before any row), asked each time room is made: the budget bounds the
    node, not only the shards."""

    def __init__(
        self,
        names: Sequence[str],
        load: Callable[[str], None],
        release: Callable[[str], None],
        rows: Callable[[str], int],
        budget_bytes: int = 0,
        held_outside: Callable[[], int] = lambda: 0,
    ) -> None:
        self._names = list(names)
        self._held_outside = held_outside
        self._load = load
        self._release = release
        self._rows = rows
        self.budget_bytes = budget_bytes
        self._shards = {n: _Shard() for n in self._names}
        self._lock = threading.Lock()
        self._loading = {n: threading.Lock() for n in self._names}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.releases = 0
        self._audit_next = 0  # where the next audit round looks for a shard not loaded
        self._loads = 0  # shard loads in flight

    def mark_loaded(self, name: str) -> None:
        """A shard loaded outside `using` (at creation)."""
        with self._lock:
            self._shards[name].loaded = True
            self._shards[name].last_used = time.monotonic()

    def forget(self) -> None:
        """The store's process restarted: it holds nothing loaded."""
        with self._lock:
            for shard in self._shards.values():
                shard.loaded = False

    @contextlib.contextmanager
    def using(self, names: Sequence[str]) -> Iterator[None]:
        held: list[str] = []
        try:
            for name in names:
                self._acquire(name)
                held.append(name)
            yield
        finally:
            with self._lock:
                now = time.monotonic()
                for name in held:
                    self._shards[name].in_use -= 1
                    self._shards[name].last_used = now

    def _acquire(self, name: str) -> None:
        with self._lock:
            shard = self._shards[name]
            if shard.loaded:
                shard.in_use += 1
                return
        with self._loading[name]:  # one load of a shard at a time; others wait for it
            with self._lock:
                shard = self._shards[name]
                if shard.loaded:
                    shard.in_use += 1
                    return
            self._make_room(name)
            began = time.monotonic()
            with self._lock:
                self._loads += 1
            try:
                self._load(name)
                rows = self._rows(name)
            finally:
                with self._lock:
                    self._loads -= 1
            with self._lock:
                shard.loaded, shard.rows = True, rows
                shard.in_use += 1
        log.info(
            "store_shard_loaded", shard=name, rows=rows, seconds=round(time.monotonic() - began, 2)
        )

    def _make_room(self, keep: str) -> None:
        """Release idle shards, least recently used first, while the loaded ones and `keep`
        (coming, estimated at its size when last loaded, or just written) exceed what the
        budget leaves besides the memory held outside them. A shard being loaded or released
        by another call is passed over."""
        if not self.budget_bytes:
            return
        passed: set[str] = {keep}
        while True:
            room = self.budget_bytes - self._held_outside()
            with self._lock:
                loaded = [(n, s) for n, s in self._shards.items() if s.loaded and n != keep]
                need = sum(s.rows for _, s in loaded) + self._shards[keep].rows
                idle = sorted(
                    (s.last_used, n) for n, s in loaded if not s.in_use and n not in passed
                )
                if need * BYTES_PER_ROW <= room or not idle:
                    return
                victim = idle[0][1]
            if not self._loading[victim].acquire(blocking=False):
                passed.add(victim)
                continue
            try:
                with self._lock:
                    shard = self._shards[victim]
                    if not shard.loaded or shard.in_use:
                        continue  # taken meanwhile
                    shard.loaded = False
                try:
                    self._release(victim)
                    self.releases += 1
                    log.info("store_shard_released", shard=victim, budget=self.budget_bytes)
                except Exception as exc:  # the next load of it loads it again
                    log.warning("store_shard_release_failed", shard=victim, error=str(exc)[:300])
                    passed.add(victim)
            finally:
                self._loading[victim].release()

    def wrote(self, name: str, rows: int) -> None:
        """Rows written to a shard (a replaced row counts again: an estimate on the safe
        side until the shard's next load counts it)."""
        with self._lock:
            self._shards[name].rows += rows
        self._make_room(name)

    @property
    def loading(self) -> bool:
        """A shard load is in flight."""
        with self._lock:
            return self._loads > 0

    def is_loaded(self, name: str) -> bool:
        with self._lock:
            return self._shards[name].loaded

    def audit_round(self) -> list[str]:
        """The shards one round of the store audit reads: every one without a budget (all
        are loaded); with one, those loaded now and the next of the others in turn, so a
        round neither loads every shard nor releases the ones in use, and every shard is
        read within as many rounds as there are shards."""
        with self._lock:
            if not self.budget_bytes:
                return list(self._names)
            loaded = [n for n in self._names if self._shards[n].loaded]
            # a cursor over every shard, not an index into those not loaded (a list that
            # changes between rounds, which could pass one over round after round): the
            # shards it steps past are loaded, so read this round
            count = len(self._names)
            for step in range(count):
                i = (self._audit_next + step) % count
                if not self._shards[self._names[i]].loaded:
                    loaded.append(self._names[i])
                    self._audit_next = (i + 1) % count
                    break
            return loaded

    def progress(self) -> tuple[int, int]:
        """(shards loaded, shards)."""
        with self._lock:
            return sum(s.loaded for s in self._shards.values()), len(self._shards)

    def loaded_rows(self) -> int:
        with self._lock:
            return sum(s.rows for s in self._shards.values() if s.loaded)

    def load_in_background(self) -> None:
        """Load every shard in turn (as far as the budget admits: past it, the first ones
        would only be released again), then stop."""
        if self._thread is not None:
            return
        outside = self._held_outside() if self.budget_bytes else 0
        if outside >= self.budget_bytes > 0:
            log.warning(
                "store_budget_below_node",
                budget_mib=self.budget_bytes >> 20,
                held_outside_mib=outside >> 20,
                effect="no shard stays loaded past the call that uses it: each call loads"
                " its shards (seconds each); raise MEMSVC_STORE_MEMORY_MIB above what"
                " memsvc itself holds",
            )
        self._thread = threading.Thread(target=self._load_all, name="store-shards", daemon=True)
        self._thread.start()

    def _load_all(self) -> None:
        began = time.monotonic()
        for name in self._names:
            if self._stop.is_set():
                return
            if self.budget_bytes and self.loaded_rows() * BYTES_PER_ROW >= (
                self.budget_bytes - self._held_outside()
            ):
                break
            try:
                with self.using([name]):
                    pass
            except Exception as exc:  # the store away: calls load what they need
                log.warning("store_shard_load_failed", shard=name, error=str(exc)[:300])
                return
        loaded, total = self.progress()
        log.info(
            "store_shards_loaded",
            loaded=loaded,
            shards=total,
            seconds=round(time.monotonic() - began, 1),
        )

    def stop(self) -> None:
        self._stop.set()
