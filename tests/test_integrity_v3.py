"""Regression tests for the integrity defects of issue 24, one (or more) per defect: deletes
that survive a crash, erasure, one version per conversation, one normal form, deletes by
any chunk id, time filters, and tenants (at the service level; over gRPC in
tests/integration/test_security.py)."""

from __future__ import annotations

import dataclasses
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from memsvc.app import Services, build_services
from memsvc.domain.access import Access, Role
from memsvc.domain.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from memsvc.domain.types import (
    ChunkRecord,
    MemoryEvent,
    SearchFilters,
    SearchMode,
    SearchRequest,
    TimestampRange,
    TurnRange,
)
from memsvc.embedding.model import Embedder
from tests.conftest import EN_TURNS, conversation, make_settings, turn
from tests.support.waiting import until_idle


@pytest.fixture()
def services(services_on_both: Services) -> Services:
    """Every test here runs on both event-log backends (SQLite, PostgreSQL)."""
    return services_on_both


SECRET = "My locker code is 4417-tango."


def live(svc: Services, conv: str) -> dict[str, str]:
    return {c.chunk_id: c.text for c in svc.ingest.list_chunks(conv, False, 1000, "").chunks}


def found(svc: Services, conv: str, query: str, **filters: object) -> str:
    """Every text any default search mode returns for `query` in `conv`, joined."""
    out = []
    for mode in SearchMode:
        req = SearchRequest(query, 100, SearchFilters((conv,), **filters), mode)  # type: ignore[arg-type]
        out += [h.text for h in svc.search.search(req).hits]
    return "\n".join(out)


def sync(svc: Services, events: list[MemoryEvent], **kw: object) -> list[ChunkRecord]:
    built = svc.ingest.build(events, **kw)  # type: ignore[arg-type]
    result = svc.ingest.upsert(built.chunks)
    assert not result.errors, result.errors
    return built.chunks


class Crash(BaseException):
    """The process dies: nothing after this point of the call runs."""


@contextmanager
def crash_on_store_writes(svc: Services) -> Iterator[None]:
    """Every store write raises as if the process died just before it: the log change
    of the call is committed, the store is not touched."""

    def die(*args: object, **kwargs: object) -> None:
        raise Crash()

    store = svc.store
    saved = store.upsert, store.delete
    store.upsert, store.delete = die, die  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        store.upsert, store.delete = saved  # type: ignore[method-assign]


def restart(
    svc: Services, tmp_path: Path, embedder: Embedder, backend: dict[str, object]
) -> Services:
    """A new process on the same data dir (the old one's memory is gone)."""
    svc.close()
    return build_services(make_settings(tmp_path, **backend), embedder=embedder)


# -- a crash undoes a delete -----------------------------------------------------------------
def test_a_crash_between_a_delete_and_the_store_write_is_finished_by_the_next_process(
    tmp_path: Path, embedder: Embedder, backend: dict[str, object]
) -> None:
    svc = build_services(make_settings(tmp_path, **backend), embedder=embedder)
    try:
        sync(svc, conversation("crash-del", [SECRET, *EN_TURNS[1:]]))
        svc.control.set_paused(True)  # the restarted process comes up paused
        with crash_on_store_writes(svc), pytest.raises(Crash):
            svc.deletion.delete("crash-del", TurnRange(0, 0), [])
        # the store still holds the secret live: only the log knows it is deleted
        assert any(SECRET in t for t in live(svc, "crash-del").values())
        svc = restart(svc, tmp_path, embedder, backend)
        # before anyone repairs the store, no search returns it, and it is not idle
        assert "4417" not in found(svc, "crash-del", "locker code tango")
        assert svc.queue.status(["crash-del"])[0].state == "pending"
        assert not svc.control.is_indexed("crash-del", 0)
        svc.control.set_paused(False)
        assert until_idle(svc, "crash-del").state == "idle"
        assert svc.control.is_indexed("crash-del", 0)
        assert not any("4417" in t for t in live(svc, "crash-del").values())
        assert "Biscuit" in found(svc, "crash-del", "puppy named Biscuit")  # neighbours live
    finally:
        svc.close()


def test_a_crash_during_a_purge_is_finished_by_the_next_process(
    tmp_path: Path, embedder: Embedder, backend: dict[str, object]
) -> None:
    svc = build_services(make_settings(tmp_path, **backend), embedder=embedder)
    try:
        sync(svc, conversation("crash-purge", [SECRET, *EN_TURNS[1:]]))
        svc.deletion.delete("crash-purge", TurnRange(0, 0), [])
        with crash_on_store_writes(svc), pytest.raises(Crash):
            svc.deletion.purge_deleted("crash-purge")
        svc = restart(svc, tmp_path, embedder, backend)
        until_idle(svc, "crash-purge")
        assert svc.store.chunks_of("crash-purge", deleted=True) == []
        assert svc.deletion.purge_deleted("crash-purge") == (0, 0)
    finally:
        svc.close()


# -- erasure -----------------------------------------------------------------------------
def files_holding(root: Path, needle: str) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and needle.encode("utf-8") in p.read_bytes()
    )


def test_purged_text_is_in_no_file_after_a_clean_stop(
    tmp_path: Path, embedder: Embedder, backend: dict[str, object]
) -> None:
    svc = build_services(make_settings(tmp_path, **backend), embedder=embedder)
    sync(svc, conversation("erase", [SECRET, *EN_TURNS[1:]]))
    svc.deletion.delete("erase", TurnRange(0, 0), [])
    svc.close()
    assert files_holding(tmp_path, "4417-tango")  # deleted is not erased: still on disk
    svc = build_services(make_settings(tmp_path, **backend), embedder=embedder)
    assert svc.deletion.purge_deleted("erase")[1] == 1
    assert "Biscuit" in found(svc, "erase", "puppy named Biscuit")
    svc.close()
    assert files_holding(tmp_path, "4417-tango") == []
    # what was not purged is all still there
    svc = build_services(make_settings(tmp_path, **backend), embedder=embedder)
    try:
        assert "Biscuit" in found(svc, "erase", "puppy named Biscuit")
    finally:
        svc.close()


# -- one version per conversation ------------------------------------------------------------
def test_a_sync_build_with_the_default_version_after_a_reindex_is_searchable(
    services: Services,
) -> None:
    sync(services, conversation("v-a", EN_TURNS[:4]))
    services.control.reindex(["v-a"], 2)
    assert until_idle(services, "v-a").active_version == 2
    sync(services, [turn("v-a", 4, "The lighthouse keeper plays the cello.")])
    assert services.control.is_indexed("v-a", 4)
    assert "cello" in found(services, "v-a", "lighthouse keeper cello")
    versions = {
        c.metadata.chunk_version for c in services.ingest.list_chunks("v-a", False, 100, "").chunks
    }
    assert 2 in versions


def test_reindex_without_a_version_rebuilds_the_conversations_own(services: Services) -> None:
    sync(services, conversation("v-b", EN_TURNS))
    services.control.reindex(["v-b"], 2)
    until_idle(services, "v-b")
    assert services.control.request_reindex(["v-b"], False, 0, False) == 1
    item = until_idle(services, "v-b")
    assert (item.active_version, item.building_version) == (2, 0)
    services.ingest.append([turn("v-b", 6, "We repainted the boat teal.")])
    assert services.control.wait_for_indexed("v-b", 6, 60) is not None
    assert services.control.is_indexed("v-b", 6)
    assert "teal" in found(services, "v-b", "repainted boat teal")


def test_appends_to_a_conversation_built_with_another_version_are_searchable(
    services: Services,
) -> None:
    sync(services, conversation("v-c", EN_TURNS[:2]), chunk_version=3)
    services.ingest.append([turn("v-c", 2, "My sister collects antique maps.")])
    services.worker.notify()
    assert services.control.wait_for_indexed("v-c", 2, 60) is not None
    assert services.control.is_indexed("v-c", 2)
    hits = services.search.search(SearchRequest("antique maps", 5, SearchFilters(("v-c",)))).hits
    assert hits and hits[0].metadata.chunk_version == 3 and "antique maps" in hits[0].text


def test_retiring_the_searched_version_is_refused(services: Services) -> None:
    sync(services, conversation("v-d", EN_TURNS))
    with pytest.raises(FailedPrecondition, match="searched"):
        services.deletion.retire_version("v-d", 1)
    assert "Biscuit" in found(services, "v-d", "puppy named Biscuit")


def test_wide_searches_work_with_many_conversations_mid_migration(services: Services) -> None:
    convs = [f"mig-{i:02d}" for i in range(60)]
    for conv in convs:
        sync(services, [turn(conv, 0, f"Conversation {conv} talks about kayaks.")])
    assert services.control.reindex(convs, 2) == len(convs)
    for conv in convs:
        assert until_idle(services, conv).active_version == 2
    # every conversation now holds version 1 (kept until retired) and version 2
    hits = services.search.search(SearchRequest("kayaks", 100)).hits
    assert len(hits) == 60 and {h.metadata.chunk_version for h in hits} == {2}


# -- one normal form -------------------------------------------------------------------------
def test_a_name_is_checked_in_the_form_it_is_stored_in(services: Services) -> None:
    grows = "\u337f" * 100  # each of these is 4 characters in NFKC: 400 > 256
    with pytest.raises(InvalidArgument) as err:
        services.ingest.build([turn("nf-a", 0, "hello", participants=(grows,))])
    assert err.value.field == "events[0].participants[0]"
    result = services.ingest.append([turn("nf-a", 0, "hello", speaker_name=grows)])
    assert result.accepted == 0 and "events[0].speaker_name" in result.errors[0].message


def test_the_server_stores_every_chunk_it_built_for_a_long_name(services: Services) -> None:
    near = "\u337f" * 60  # 240 characters once normalised
    long_tokens = "鑫" * 256  # 256 characters, one token each
    events = [
        turn(
            "nf-b",
            i,
            EN_TURNS[i],
            speaker_name=long_tokens if i % 2 else near,
            participants=(near,),
        )
        for i in range(6)
    ]
    built = services.ingest.build(events)
    assert 2 <= len(built.chunks) <= 6  # whole turns per chunk, not one per character
    assert not services.ingest.upsert(built.chunks).errors
    assert len(live(services, "nf-b")) == len(built.chunks)


def test_a_filter_on_a_name_as_sent_finds_it(services: Services) -> None:
    fullwidth = "Ｍａｒｉａ"
    sync(services, [turn("nf-c", 0, "I planted tulips by the fence.", participants=(fullwidth,))])
    assert "tulips" in found(services, "nf-c", "tulips fence", participants=(fullwidth,))
    assert "tulips" in found(services, "nf-c", "tulips fence", participants=("Maria",))


def test_ids_that_differ_only_in_normal_form_are_one_conversation(services: Services) -> None:
    composed = unicodedata.normalize("NFC", "café-42")
    decomposed = unicodedata.normalize("NFD", "café-42")
    assert composed != decomposed
    services.ingest.append([turn(decomposed, 0, "The espresso machine is broken.")])
    services.ingest.append([turn(" " + composed + " ", 1, "I will fix it tomorrow.")])
    items = services.queue.status()
    assert [i.conversation_id for i in items] == [composed]
    assert items[0].last_appended_turn == 1
    services.worker.notify()
    indexed, _ = services.control.wait(decomposed, 1, 60_000, None, lambda: True)
    assert indexed
    assert "espresso" in found(services, decomposed, "espresso machine broken")


# -- deleting a hit ----------------------------------------------------------------------------
def test_deleting_a_superseded_tail_by_its_id_deletes_its_turns(services: Services) -> None:
    first = sync(services, conversation("tail", EN_TURNS[:2]))
    tail = first[-1].chunk_id
    sync(services, conversation("tail", EN_TURNS[2:4], start=2))
    assert tail not in live(services, "tail")  # replaced by a longer window
    result = services.deletion.delete("tail", None, [tail])
    assert result.errors == [] and result.events_deleted == 2
    assert "Biscuit" not in found(services, "tail", "puppy named Biscuit")


# -- filters ---------------------------------------------------------------------------------
def test_a_time_range_filter_spans_a_chunks_earliest_to_latest_turn(services: Services) -> None:
    events = [
        turn("tr", 0, "We moved the meeting to the afternoon.", ts="2026-03-01T15:00:00+00:00"),
        turn(
            "tr",
            1,
            "Back-dated note: the morning call was cancelled.",
            ts="2026-03-01T08:00:00+00:00",
        ),
    ]
    sync(services, events)
    chunk = next(iter(services.ingest.list_chunks("tr", False, 10, "").chunks))
    assert chunk.metadata.timestamp_range == TimestampRange(
        "2026-03-01T08:00:00+00:00", "2026-03-01T15:00:00+00:00"
    )
    window = TimestampRange("2026-03-01T07:30:00+00:00", "2026-03-01T08:30:00+00:00")
    assert "morning call" in found(services, "tr", "morning call cancelled", timestamp_range=window)


def test_a_time_range_starting_after_it_ends_is_invalid(services: Services) -> None:
    backwards = TimestampRange("2026-03-02T00:00:00+00:00", "2026-03-01T00:00:00+00:00")
    with pytest.raises(InvalidArgument) as err:
        services.search.search(SearchRequest("x", 5, SearchFilters(timestamp_range=backwards)))
    assert err.value.field == "filters.timestamp_range"


# -- tenants ---------------------------------------------------------------------------------
ACME_READER = Access(Role.READER, ("acme/",))
ACME_WRITER = Access(Role.WRITER, ("acme/",))


def test_a_prefix_limited_token_reaches_only_its_conversations(services: Services) -> None:
    sync(services, conversation("acme/1", EN_TURNS))
    sync(services, conversation("other/1", [t.replace("Biscuit", "Pepper") for t in EN_TURNS]))
    services.ingest.append([turn("acme/2", 0, "Biscuit chewed the sofa.")])
    denied = [
        lambda: services.search.search(
            SearchRequest("puppy", 5, SearchFilters(("other/1",))), ACME_READER
        ),
        lambda: services.ingest.list_chunks("other/1", False, 10, "", 0, ACME_READER),
        lambda: services.control.wait("other/1", 0, 100, None, lambda: True, ACME_READER),
        lambda: services.control.status(["other/1"], ACME_READER),
        lambda: services.deletion.delete("other/1", None, [], ACME_WRITER),
        lambda: services.ingest.append([turn("other/1", 6, "x")], access=ACME_WRITER),
        lambda: services.ingest.build([turn("other/1", 6, "x")], access=ACME_WRITER),
    ]
    for call in denied:
        with pytest.raises(PermissionDenied) as err:
            call()
        assert err.value.reason == "CONVERSATION_NOT_ALLOWED"
    # its searches and status without conversation ids span its own prefixes only
    services.worker.notify()
    services.control.wait_for_indexed("acme/2", 0, 60)
    hits = services.search.search(SearchRequest("puppy named", 20), ACME_READER).hits
    assert hits and {h.metadata.conversation_id for h in hits} <= {"acme/1", "acme/2"}
    assert [i.conversation_id for i in services.control.status((), ACME_READER)] == [
        "acme/1",
        "acme/2",
    ]
    page, _ = services.control.status_page(0, "", [], "", ACME_READER)  # GetIndexStatus's
    assert [i.conversation_id for i in page] == ["acme/1", "acme/2"]
    assert services.control.totals(ACME_READER).conversations == 2
    # an unlimited reader still needs admin to search everything
    with pytest.raises(PermissionDenied) as err:
        services.search.search(SearchRequest("puppy", 5), Access(Role.READER))
    assert err.value.reason == "ADMIN_REQUIRED"


def test_reading_deleted_text_needs_admin(services: Services) -> None:
    sync(services, conversation("acme/del", [SECRET, *EN_TURNS[1:]]))
    services.deletion.delete("acme/del", TurnRange(0, 0), [])
    audit = SearchFilters(("acme/del",), include_deleted=True)
    for access in (ACME_READER, Access(Role.WRITER)):
        with pytest.raises(PermissionDenied):
            services.search.search(SearchRequest("locker code", 5, audit), access)
        with pytest.raises(PermissionDenied):
            services.ingest.list_chunks("acme/del", True, 10, "", 0, access)
    hits = services.search.search(SearchRequest("locker code", 5, audit)).hits
    assert any("4417" in h.text for h in hits)


def test_events_of_a_conversation_keep_their_normal_form_in_chunks(services: Services) -> None:
    raw = dataclasses.replace(turn("nf-d", 0, "Hi"), speaker_name="  Ａｎａ  ")
    built = services.ingest.build([raw])
    assert "Ana" in built.chunks[0].text and built.chunks[0].metadata.participants == ("Ana",)
