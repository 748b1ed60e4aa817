"""The store checked against the log: a store back without its data is rebuilt, WaitForIndexed
says no until the returned store is followed, a replica that missed the loss sees another
store, and a log restored beside a newer store is repaired (issue 37)."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from memsvc.app import Services, build_services
from memsvc.embedding.model import Embedder
from memsvc.observability import metrics
from memsvc.ports import ChunkStore, EventLog, LogReader
from memsvc.services.audit import StoreAudit
from memsvc.storage.milvus.store import MilvusChunkStore
from tests.conftest import EN_TURNS, conversation, make_settings
from tests.support.fleet import MilvusServer
from tests.support.integrity import findable
from tests.support.waiting import until_idle


def deadline_loop(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_3_a_store_back_without_its_data_is_rebuilt(
    tmp_path: Path, embedder: Embedder, backend: dict[str, object]
) -> None:
    """Regression (issue 37, 3): the Milvus server came back at the same URI without its
    data; memsvc re-created the collection but compared identities only at start, so
    WaitForIndexed said true while only turns indexed after the return were findable."""
    server = MilvusServer(tmp_path / "first.db")
    settings = make_settings(tmp_path / "data", milvus_uri=server.uri, store_check_s=0.2, **backend)
    svc = build_services(settings, embedder=embedder)
    try:
        svc.ingest.upsert(svc.ingest.build(conversation("lost", EN_TURNS)).chunks)
        last = len(EN_TURNS) - 1
        assert svc.control.is_indexed("lost", last) and findable(svc, "lost", EN_TURNS[:2])
        server = server.emptied(tmp_path / "second.db")
        # the watch reconnects; the new collection is another store: rebuilt from the log
        deadline_loop(
            lambda: svc.store.up and svc.control.is_indexed("lost", last),
            120,
            "rebuilt",
        )
        assert findable(svc, "lost", EN_TURNS)
    finally:
        svc.close()
        server.stop()


def test_3_indexed_is_no_until_the_returned_store_is_followed(
    tmp_path: Path, embedder: Embedder, backend: dict[str, object]
) -> None:
    """Regression (a lone-clone run of stop 48): between the reconnection to a store that
    came back empty and the audit that follows its new identity, the log still counted the
    old store's chunks, so WaitForIndexed said true while nothing was findable. The watch
    and the audit are held off here (long intervals) to stand in that window."""
    server = MilvusServer(tmp_path / "first.db")
    settings = make_settings(
        tmp_path / "data", milvus_uri=server.uri, store_check_s=60, store_audit_s=3600, **backend
    )
    svc = build_services(settings, embedder=embedder)
    try:
        svc.ingest.upsert(svc.ingest.build(conversation("gap", EN_TURNS)).chunks)
        last = len(EN_TURNS) - 1
        assert svc.control.is_indexed("gap", last)
        server = server.emptied(tmp_path / "second.db")
        assert svc.store.reconnect()  # what the watch does when its ping fails
        assert not findable(svc, "gap", EN_TURNS[:1])
        assert not svc.control.is_indexed("gap", last)
        svc.store_audit.run()  # what the reconnection sets off
        deadline_loop(lambda: svc.control.is_indexed("gap", last), 120, "rebuilt")
        assert findable(svc, "gap", EN_TURNS)
    finally:
        svc.close()
        server.stop()


def test_3_a_replica_that_missed_the_stores_loss_sees_another_store(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Regression (noticed at stop 49): a replica frozen while the Milvus server lost its
    data, resumed after another replica re-created the collection, pinged fine (the
    collection exists) and never reconnected: it kept the old collection's identity, and
    its audit would follow that one back. Its ping now says down: the watch reconnects."""
    server = MilvusServer(tmp_path / "first.db")
    first = MilvusChunkStore(server.uri, "chunks", embedder.identity)
    frozen = MilvusChunkStore(server.uri, "chunks", embedder.identity)
    try:
        assert frozen.identity == first.identity and frozen.ping()
        server = server.emptied(tmp_path / "second.db")
        assert first.reconnect() and first.identity != frozen.identity  # made anew
        assert not frozen.ping()
        assert frozen.reconnect() and frozen.identity == first.identity and frozen.ping()
    finally:
        first.close()
        frozen.close()
        server.stop()


def test_4_a_log_restored_beside_a_newer_store_is_repaired(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Regression (issue 37, 4): a log backup restored beside a newer store left every
    live turn unfindable, with WaitForIndexed true, and nothing repaired it."""
    data = tmp_path / "data"
    svc = build_services(make_settings(data), embedder=embedder)
    svc.ingest.upsert(svc.ingest.build(conversation("rs", EN_TURNS[:3])).chunks)
    svc.close()
    backup = tmp_path / "backup.sqlite"
    with sqlite3.connect(data / "events.sqlite") as source, sqlite3.connect(backup) as copy:
        source.backup(copy)
    svc = build_services(make_settings(data), embedder=embedder)
    later = [f"{t} (told again, later)" for t in EN_TURNS]
    svc.ingest.upsert(svc.ingest.build(conversation("rs", later)).chunks)  # edits all
    svc.close()
    for leftover in data.glob("events.sqlite*"):
        leftover.unlink()
    with sqlite3.connect(backup) as source, sqlite3.connect(data / "events.sqlite") as copy:
        source.backup(copy)
    svc = build_services(make_settings(data), embedder=embedder)
    try:
        until_idle(svc, "rs", timeout_s=120)
        assert svc.control.is_indexed("rs", 2)
        assert findable(svc, "rs", EN_TURNS[:3])  # the log's turns, as the log has them
        stored = {c.record.text for c in svc.store.chunks_of("rs")}
        assert not any("told again, later" in t for t in stored)
    finally:
        svc.close()


class StepBetweenReads:
    """The store as the audit sees it, with an index step landing right after the audit
    has read every row and before it reads the log (what the worker does at size, where
    reading the store takes seconds)."""

    def __init__(self, store: ChunkStore, step: Callable[[], None]) -> None:
        self.store = store
        self.step = step

    def digests(
        self, conversation_id: str | None = None, part: str | None = None
    ) -> dict[str, tuple[str, str, bool]]:
        rows = self.store.digests(conversation_id, part)
        if conversation_id is None:
            self.step()
        return rows

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)


class PartsRead:
    """The store, recording which parts the audit reads."""

    def __init__(self, store: ChunkStore) -> None:
        self.store = store
        self.parts: list[str] = []

    def digests(
        self, conversation_id: str | None = None, part: str | None = None
    ) -> dict[str, tuple[str, str, bool]]:
        if part is not None:
            self.parts.append(part)
        return self.store.digests(conversation_id, part)

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)


def test_a_step_during_the_audit_is_not_taken_for_a_store_out_of_line(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Regression (scale v2): under load, a conversation indexed between the audit's read of
    the store and its read of the log looked out of line, and was rebuilt for nothing (and
    WaitForIndexed said false for it meanwhile). A store truly out of line still is."""
    svc = build_services(make_settings(tmp_path, index_workers=0), embedder=embedder)
    try:
        svc.ingest.append(conversation("racing", EN_TURNS[:3]))
        step = lambda: svc.worker.process(svc.queue.lease(None, 60.0, 10, "a worker"))  # noqa: E731
        audit = StoreAudit(
            svc.log, StepBetweenReads(svc.store, step), svc.locks, svc.notifier, 3600
        )
        assert audit.run() == []
        assert svc.queue.status(["racing"])[0].state == "idle"
        assert svc.control.is_indexed("racing", 2)
        svc.store.delete([c.record.chunk_id for c in svc.store.chunks_of("racing")][:1])
        assert audit.run() == ["racing"]  # lost for real: reconciled
    finally:
        svc.close()


def two_indexed_in_each_shard(svc: Services) -> list[str]:
    """Conversations, two in each shard of the store, appended and indexed."""
    convs: list[str] = []
    for i in range(200):
        if sum(svc.store.part_of(c) == svc.store.part_of(f"t/c{i}") for c in convs) < 2:
            convs.append(f"t/c{i}")
    for conv in convs:
        svc.ingest.append(conversation(conv, EN_TURNS[:2]))
    while items := svc.queue.lease(None, 60.0, 12, "a worker"):
        svc.worker.process(items)
    return convs


def test_an_audit_under_a_memory_budget_reads_a_shard_at_a_time_and_finds_each(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Scale v3: a store in shards whose memory budget holds one shard is audited without
    undoing the budget (each round reads the shards loaded and one more), and a row lost
    from any shard is still found, within as many rounds as there are shards."""
    from memsvc.storage.milvus.shards import BYTES_PER_ROW

    shards = 4
    svc = build_services(
        make_settings(tmp_path, index_workers=0, store_shards=shards), embedder=embedder
    )
    try:
        store = svc.store
        convs = two_indexed_in_each_shard(svc)
        assert len({store.part_of(c) for c in convs}) == shards
        store.residency.budget_bytes = BYTES_PER_ROW  # room for one shard at a time
        store.residency.wrote(store.part_of(convs[-1]), 0)  # which makes room for it
        assert store.residency.progress()[0] == 1
        recording = PartsRead(store)
        audit = StoreAudit(svc.log, recording, svc.locks, svc.notifier, 3600)
        assert audit.run() == []
        lost = convs[0]
        store.delete([c.record.chunk_id for c in store.chunks_of(lost)][:1], [lost])
        rounds = []
        for _ in range(shards):
            recording.parts = []
            found = audit.run()
            rounds.append(recording.parts)
            assert store.residency.progress()[0] == 1  # the budget held
            if found:
                break
        assert found == [lost] and store.part_of(lost) in rounds[-1]
        assert all(len(parts) == 2 for parts in rounds)  # the one loaded, and one more
    finally:
        svc.close()


ROUNDS = "memsvc_store_audit_seconds_count"


class LayoutsRead:
    """The log, recording the conversations of each layout the audit reads."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.reads: list[set[str]] = []

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[object]:
        with self.log.snapshot() as r:
            yield _LayoutsRecorded(r, self.reads)

    def __getattr__(self, name: str) -> object:
        return getattr(self.log, name)


class _LayoutsRecorded:
    def __init__(self, reader: LogReader, reads: list[set[str]]) -> None:
        self.reader = reader
        self.reads = reads

    def layout_digests(
        self, conversation_ids: Sequence[str] | None = None
    ) -> dict[str, tuple[str, str, bool, bool]]:
        rows = (
            self.reader.layout_digests()
            if conversation_ids is None
            else self.reader.layout_digests(conversation_ids)
        )
        self.reads.append({row[0] for row in rows.values()})
        return rows

    def __getattr__(self, name: str) -> object:
        return getattr(self.reader, name)


def test_an_audit_holds_one_shard_and_its_layout_at_a_time(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Scale v3: an audit of a store in shards compares one shard's rows with the layout of
    that shard's conversations at a time: at a million chunks it held both whole, the
    store's rows and the log's (memsvc ~120 MiB more after each round), a node's memory
    growing with its store. A row lost from any shard is still found in one round."""
    shards = 4
    svc = build_services(
        make_settings(tmp_path, index_workers=0, store_shards=shards), embedder=embedder
    )
    try:
        store = svc.store
        convs = two_indexed_in_each_shard(svc)
        log = LayoutsRead(svc.log)
        parts = PartsRead(store)
        audit = StoreAudit(log, parts, svc.locks, svc.notifier, 3600)  # type: ignore[arg-type]
        rounds = metrics.REGISTRY.get_sample_value(ROUNDS, {"outcome": "ok"}) or 0.0
        assert audit.run() == []
        assert metrics.REGISTRY.get_sample_value(ROUNDS, {"outcome": "ok"}) == rounds + 1
        assert len(parts.parts) == shards and len(log.reads) == shards
        for part, read in zip(parts.parts, log.reads, strict=True):
            assert read == {c for c in convs if store.part_of(c) == part}
        lost = convs[-1]
        store.delete([c.record.chunk_id for c in store.chunks_of(lost)][:1], [lost])
        assert audit.run() == [lost]
    finally:
        svc.close()
