from __future__ import annotations

import dataclasses
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from memsvc.app import Services
from memsvc.domain.errors import InvalidArgument
from memsvc.domain.limits import MAX_PAYLOAD_CHARS, MAX_TURN_ID
from memsvc.domain.records import LayoutRow
from memsvc.domain.types import (
    ChunkRecord,
    MemoryEvent,
    SearchFilters,
    SearchMode,
    SearchRequest,
    TurnRange,
)
from memsvc.ports import EventLog
from memsvc.services.turns import TurnsDeleted
from tests.conftest import EN_TURNS, ZH_TURNS, conversation, turn
from tests.support.conversations import generate
from tests.support.waiting import until_idle


@pytest.fixture()
def services(services_on_both: Services) -> Services:
    """Every test here runs on both event-log backends (SQLite, PostgreSQL)."""
    return services_on_both


def build_and_upsert(svc: Services, events: list, **kw: object) -> list[ChunkRecord]:  # type: ignore[type-arg]
    result = svc.ingest.build(events, **kw)  # type: ignore[arg-type]
    up = svc.ingest.upsert(result.chunks)
    assert not up.errors, up.errors
    return result.chunks


def live(svc: Services, conv: str, include_deleted: bool = False) -> dict[str, str]:
    page = svc.ingest.list_chunks(conv, include_deleted, 1000, "")
    return {c.chunk_id: c.text for c in page.chunks}


def test_build_is_deterministic_and_replay_is_unchanged(services: Services) -> None:
    events = conversation("c1", ZH_TURNS)
    first = services.ingest.build(events)
    # not yet upserted: a re-send answers with the same pending chunks (crash recovery)
    again = services.ingest.build(events)
    assert again.chunks == first.chunks and again.superseded_chunk_ids == []
    up = services.ingest.upsert(first.chunks)
    assert services.ingest.build(events).chunks == []  # stored: an identical re-send is a no-op
    assert (up.upserted, up.updated, up.unchanged) == (len(first.chunks), 0, 0)
    count = services.store.count()
    replay = services.ingest.upsert(first.chunks)
    assert (replay.upserted, replay.updated, replay.unchanged) == (0, 0, len(first.chunks))
    assert services.store.count() == count
    # a fresh store computes the same ids and texts from the same events
    other = services.ingest.build(conversation("c1-copy", ZH_TURNS))
    assert [c.text for c in other.chunks] == [c.text for c in first.chunks]


def test_incremental_tail_is_superseded(services: Services) -> None:
    events = conversation("c2", EN_TURNS)
    build_and_upsert(services, events[:3])
    tail = set(live(services, "c2"))
    build_and_upsert(services, events[3:])
    now = live(services, "c2")
    assert tail and not tail & set(now)  # the 3-turn tail was replaced
    ranges = sorted(
        (c.metadata.turn_range.start, c.metadata.turn_range.end)
        for c in services.ingest.list_chunks("c2", False, 100, "").chunks
    )
    assert ranges == [(0, 3), (2, 5)]
    # a stale upsert of the superseded tail is refused, not resurrected
    stale = services.ingest.build(conversation("c2b", EN_TURNS[:3])).chunks
    services.ingest.upsert(stale)
    services.ingest.build(conversation("c2b", EN_TURNS)[3:])
    again = services.ingest.upsert(stale)
    assert again.errors and "superseded" in again.errors[0].message


def test_edit_rebuilds_same_ids_with_new_text(services: Services) -> None:
    events = conversation("c3", EN_TURNS)
    before = {c.chunk_id: c.text for c in build_and_upsert(services, events)}
    edited = dataclasses.replace(events[1], text="Congratulations! Is Biscuit a poodle?")
    result = services.ingest.build([edited])
    assert {c.chunk_id for c in result.chunks} <= set(before)
    assert result.chunks and all("poodle" in c.text for c in result.chunks)
    up = services.ingest.upsert(result.chunks)
    assert up.updated == len(result.chunks) and up.upserted == 0


def test_gap_is_invalid_unless_allowed(services: Services) -> None:
    services.ingest.build(conversation("c4", EN_TURNS[:2]))
    with pytest.raises(InvalidArgument) as err:
        services.ingest.build([turn("c4", 5, "later")])
    assert err.value.field == "events.turn_id"
    result = services.ingest.build([turn("c4", 5, "later")], allow_gaps=True)
    assert result.turn_range == TurnRange(0, 5)


@pytest.mark.parametrize(
    ("events", "field"),
    [
        ([turn("", 0, "x")], "events[0].conversation_id"),
        ([turn("a", 0, "x"), turn("b", 1, "y")], "events[1].conversation_id"),
        ([turn("a", 0, "x"), turn("a", 0, "y")], "events[1].turn_id"),
        ([turn("a", 0, "x", ts="2026-02-02 10:00")], "events[0].timestamp"),
        ([turn("a", 0, "x", speaker="bot")], "events[0].speaker"),
        ([turn("a", -1, "x")], "events[0].turn_id"),
    ],
)
def test_bad_events(services: Services, events: list, field: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidArgument) as err:
        services.ingest.build(events)
    assert err.value.field == field


def test_empty_turns_are_skipped(services: Services) -> None:
    events = conversation("c5", ["hello there", "  \u200b ", "how are you doing today"])
    chunks = services.ingest.build(events).chunks
    assert len(chunks) == 1 and chunks[0].text.count("\n") == 2


def test_partial_batch_writes_good_records(services: Services) -> None:
    good = services.ingest.build(conversation("c6", EN_TURNS)).chunks
    bad_id = dataclasses.replace(good[0], chunk_id="chk_not_the_formula")
    empty = dataclasses.replace(good[1], text=" ")
    too_long = dataclasses.replace(good[1], text="word " * 600)
    result = services.ingest.upsert([bad_id, good[0], empty, too_long])
    assert result.upserted == 1
    messages = " | ".join(e.message for e in result.errors)
    assert len(result.errors) == 3
    assert "records[0].chunk_id" in messages and "records[2].text" in messages
    # not what the server built for that id: refused before the model sees it
    assert [e.reason for e in result.errors] == ["invalid", "invalid", "mismatch"]


def test_delete_then_search_and_rebuild_does_not_resurrect(services: Services) -> None:
    events = conversation("c7", EN_TURNS)
    chunks = build_and_upsert(services, events)
    deleted = services.deletion.delete("c7", TurnRange(0, 0), [])
    assert deleted.deleted == 1 and deleted.events_deleted == 1
    assert services.deletion.delete("c7", TurnRange(0, 0), []).deleted == 0
    req = SearchRequest("adopted a puppy", 10, SearchFilters(conversation_ids=("c7",)))
    for mode in SearchMode:
        hits = services.search.search(dataclasses.replace(req, mode=mode)).hits
        assert all(not h.metadata.deleted for h in hits)
        assert all(h.metadata.turn_range.start != 0 for h in hits)
    with_deleted = dataclasses.replace(req, filters=SearchFilters(("c7",), include_deleted=True))
    hits = services.search.search(with_deleted).hits
    assert any(h.metadata.deleted for h in hits)
    # replaying the old records does not undo the delete
    replay = services.ingest.upsert(chunks)
    assert any("deleted" in e.message for e in replay.errors)
    # a rebuild covers the surviving turns without the deleted one
    rebuilt = services.ingest.build([], conversation_id="c7")
    services.ingest.upsert(rebuilt.chunks)
    texts = live(services, "c7")
    assert texts and all("adopted a puppy" not in t for t in texts.values())
    assert any("golden retriever" in t for t in texts.values())
    # purge removes deleted chunks and events physically
    purged = services.deletion.purge_deleted("c7")
    assert purged[0] >= 1 and purged[1] == 1
    assert all(
        not c.metadata.deleted for c in services.ingest.list_chunks("c7", True, 100, "").chunks
    )


def test_delete_by_chunk_ids_deletes_the_turns_they_cover(services: Services) -> None:
    chunks = build_and_upsert(services, conversation("c8", ZH_TURNS))
    assert [(c.metadata.turn_range.start, c.metadata.turn_range.end) for c in chunks] == [
        (0, 3),
        (2, 5),
    ]
    result = services.deletion.delete("c8", None, [chunks[0].chunk_id, "chk_missing"])
    # turns 0-3 are gone, so (2, 5) goes too; turns 4-5 get a chunk of their own
    assert result.deleted == 2 and result.events_deleted == 4
    assert [(e.chunk_id, e.reason) for e in result.errors] == [("chk_missing", "unknown")]
    texts = live(services, "c8")
    assert len(texts) == 1 and all(ZH_TURNS[t] not in "".join(texts.values()) for t in range(4))
    assert ZH_TURNS[4] in "".join(texts.values())
    # nothing pending: a later build brings nothing back, and the deleted turns re-sent
    # are refused, saying so (issue 37, 8), with nothing written
    assert services.ingest.build([], conversation_id="c8").chunks == []
    with pytest.raises(TurnsDeleted):
        services.ingest.build(conversation("c8", ZH_TURNS))
    assert services.ingest.build([], conversation_id="c8").chunks == []


def test_version_rebuild_search_newest_and_retire(services: Services) -> None:
    events = conversation("c9", EN_TURNS)
    v1 = build_and_upsert(services, events)
    v2 = build_and_upsert(services, [], chunk_version=2, conversation_id="c9")
    assert {c.metadata.chunk_version for c in v2} == {2}
    assert {c.text for c in v2} != set() and not {c.chunk_id for c in v1} & {c.chunk_id for c in v2}
    hits = services.search.search(SearchRequest("puppy", 10, SearchFilters(("c9",)))).hits
    assert hits and {h.metadata.chunk_version for h in hits} == {2}
    old = services.search.search(
        SearchRequest("puppy", 10, SearchFilters(("c9",), chunk_version=1))
    ).hits
    assert old and {h.metadata.chunk_version for h in old} == {1}
    assert services.deletion.retire_version("c9", 1) == len(v1)
    assert {
        c.metadata.chunk_version for c in services.ingest.list_chunks("c9", True, 100, "").chunks
    } == {2}


def test_list_chunks_pages_in_turn_order(services: Services) -> None:
    build_and_upsert(services, conversation("c10", EN_TURNS * 3))
    seen, token = [], ""
    while True:
        page = services.ingest.list_chunks("c10", False, 2, token)
        seen += [c.metadata.turn_range.start for c in page.chunks]
        token = page.next_page_token
        if not token:
            break
    assert seen == sorted(seen) and len(seen) == len(live(services, "c10"))
    with pytest.raises(InvalidArgument):
        services.ingest.list_chunks("c10", False, 2, "garbage!")


def split_invariance(services: Services, convs: list[list[MemoryEvent]], seed: int) -> None:
    """One call per conversation, or many calls of random sizes, or one turn at a time:
    the same live chunks."""
    rng = random.Random(seed)
    patterns = {"one": lambda: 10_000, "random": lambda: rng.randint(1, 7), "single": lambda: 1}
    stores: dict[str, dict[str, list[str]]] = {}
    for name, size in patterns.items():
        for conv in convs[:2] if name == "single" else convs:
            events = [
                dataclasses.replace(e, conversation_id=f"{name}:{e.conversation_id}") for e in conv
            ]
            i = 0
            while i < len(events):
                n = size()
                build_and_upsert(services, events[i : i + n])
                i += n
            got = live(services, events[0].conversation_id)
            stores.setdefault(conv[0].conversation_id, {})[name] = sorted(got.values())
    for conv_id, by_pattern in stores.items():
        # ids embed the conversation id, so compare texts
        for name, texts in by_pattern.items():
            assert texts == by_pattern["one"], (conv_id, name)


def test_split_invariance_on_generated_conversations(services: Services) -> None:
    convs = [generate(f"gen-{seed}", seed, sessions=4) for seed in (1, 2, 3)]
    assert any(len(e.text) > 1500 for c in convs for e in c)  # some turns get split
    split_invariance(services, convs, seed=7)


def test_server_numbered_appends_never_collide(services_on_both: Services) -> None:
    # assign_turn_ids (MCP agents): concurrent appenders each get the next ids after the
    # conversation's last turn, on both logs; a timestamp left out is the time of receipt
    svc = services_on_both

    def append(i: int) -> list[int]:
        events = [MemoryEvent("auto", 0, "user", f"thought {i}.{k}", "") for k in range(3)]
        result = svc.ingest.append(events, assign_turn_ids=True)
        assert result.accepted == 3 and not result.errors
        return result.turn_ids

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(append, range(8)))
    assert sorted(t for ids in got for t in ids) == list(range(24))
    assert all(ids == list(range(ids[0], ids[0] + 3)) for ids in got)  # each call's in order
    with svc.log.snapshot() as r:
        stored = r.events("auto", range(24))
    assert all(e.timestamp.endswith("+00:00") for e in stored.values())
    # an id given where the server numbers is refused, naming the field
    with pytest.raises(InvalidArgument, match=r"events\[1\]\.turn_id"):
        svc.ingest.append(
            [MemoryEvent("auto", 0, "user", "a", ""), MemoryEvent("auto", 7, "user", "b", "")],
            assign_turn_ids=True,
        )
    # a conversation refused whole reports -1 for its events
    bad = svc.ingest.append(
        [MemoryEvent("auto", 0, "user", "ok", ""), MemoryEvent("x", 0, "robot", "no", "")],
        assign_turn_ids=True,
    )
    assert bad.turn_ids == [24, -1] and bad.errors


def test_turn_ids_are_bounded_and_their_end_refuses_only_its_conversation(
    services_on_both: Services,
) -> None:
    # issue 62, item 12: turn id 2**63-1 made every later server-numbered append to that
    # conversation INTERNAL and lost the other conversation of the same call
    svc = services_on_both
    refused = svc.ingest.append([turn("edge", 2**63 - 1, "too far")], allow_gaps=True)
    assert refused.accepted == 0
    assert "events[0].turn_id: must be 0 to 9,007,199,254,740,991" in refused.errors[0].message
    last = svc.ingest.append([turn("edge", MAX_TURN_ID, "the last id")], allow_gaps=True)
    assert last.accepted == 1 and not last.errors
    both = svc.ingest.append(
        [MemoryEvent("edge", 0, "user", "one more", ""), MemoryEvent("other", 0, "user", "hi", "")],
        assign_turn_ids=True,
    )
    assert both.accepted == 1 and both.turn_ids == [-1, 0]
    assert "no turn ids left" in both.errors[0].message
    with svc.log.snapshot() as r:
        assert list(r.events("other", [0])) == [0]
        assert list(r.events("edge", [MAX_TURN_ID])) == [MAX_TURN_ID]


def test_nul_is_handled_alike_on_both_logs(services_on_both: Services) -> None:
    # issue 62, item 9: a NUL in a turn was INTERNAL on PostgreSQL, and the other
    # conversation of the call was not written; SQLite took it. Now, on both: removed from
    # a turn's text (it means nothing there), refused in a payload (kept exactly as sent)
    svc = services_on_both
    texts = svc.ingest.append([turn("nul", 0, "pass\x00port"), turn("fine", 0, "a turn")])
    assert texts.accepted == 2 and not texts.errors
    payloads = svc.ingest.append(
        [turn("nul", 1, "b", payload="raw\x00item"), turn("fine", 1, "another turn")]
    )
    assert payloads.accepted == 1
    assert "events[0].payload: must not contain U+0000" in payloads.errors[0].message
    with svc.log.snapshot() as r:
        assert r.events("nul", [0])[0].text == "passport"
        assert sorted(r.events("fine", [0, 1])) == [0, 1]
        assert not r.events("nul", [1])


def test_a_keyed_write_retried_is_written_once(services_on_both: Services) -> None:
    # issue 62, item 8: MCP add_turns said "re-sending a turn is harmless", but a re-sent
    # call without ids stored the turns twice (also a retry after a time-out that came
    # after the commit). With an idempotency key, a retry returns the first answer.
    svc = services_on_both
    said = [MemoryEvent("keyed", 0, "user", f"note {i}", "") for i in range(3)]
    first = svc.ingest.append(said, assign_turn_ids=True, idempotency_key="k-1")
    assert first.accepted == 3 and first.turn_ids == [0, 1, 2]
    # retries, one after the other and four at once: the first answer, nothing written
    assert svc.ingest.append(said, assign_turn_ids=True, idempotency_key="k-1") == first
    with ThreadPoolExecutor(4) as pool:
        answers = list(
            pool.map(
                lambda _: svc.ingest.append(said, assign_turn_ids=True, idempotency_key="k-1"),
                range(4),
            )
        )
    assert answers == [first] * 4
    # four new writers at once, each with its own key: each written once, in one piece
    with ThreadPoolExecutor(4) as pool:
        fresh = list(
            pool.map(
                lambda i: svc.ingest.append(said, assign_turn_ids=True, idempotency_key=f"n-{i}"),
                range(4),
            )
        )
    assert sorted(r.turn_ids[0] for r in fresh) == [3, 6, 9, 12]
    exported, _ = svc.ingest.export_events("keyed", 0, "")
    assert len(exported) == 15
    # the same key with other events is an error, not the answer to another question
    with pytest.raises(InvalidArgument, match="idempotency_key"):
        svc.ingest.append(said[:1], assign_turn_ids=True, idempotency_key="k-1")
    # keys are kept per set of conversations: another conversation's "k-1" is its own
    other = [MemoryEvent("keyed-other", 0, "user", "hi", "")]
    assert svc.ingest.append(other, assign_turn_ids=True, idempotency_key="k-1").accepted == 1
    # an answer with errors is kept too: the retry says the same, writes nothing
    bad = [MemoryEvent("keyed", 0, "robot", "no", "")]
    refused = svc.ingest.append(bad, assign_turn_ids=True, idempotency_key="k-2")
    assert (
        refused.errors
        and svc.ingest.append(bad, assign_turn_ids=True, idempotency_key="k-2") == refused
    )
    with pytest.raises(InvalidArgument, match="idempotency_key"):
        svc.ingest.append(said, idempotency_key="x" * 129)


def test_payload_comes_back_exactly_and_is_never_searched(services: Services) -> None:
    """MemoryEvent.payload (issue 39): an agent framework's raw item, kept as sent and
    returned by export, never in a chunk or a search; part of the turn's content (a new
    payload is an edit); erased by a purge; checked when it arrives."""
    svc = services
    item = '{"type": "function_call", "name": "lookup_zebra", "arguments": "{\\"q\\": \\"斑马\\"}"}'
    events = [
        MemoryEvent("pl", 0, "user", "Which animal has stripes?", "2026-02-02T10:00:00+00:00"),
        MemoryEvent("pl", 1, "assistant", "[tool call]", "2026-02-02T10:00:01+00:00", payload=item),
        MemoryEvent("pl", 2, "system", "", "2026-02-02T10:00:02+00:00", payload='{"k": []}'),
    ]
    assert svc.ingest.append(events).accepted == 3
    until_idle(svc, "pl", timeout_s=120)
    exported, _ = svc.ingest.export_events("pl", 0, "")
    assert [e.payload for e in exported] == ["", item, '{"k": []}']
    assert all("zebra" not in c for c in live(svc, "pl").values())
    for mode in (SearchMode.KEYWORD, SearchMode.DENSE):
        found = svc.search.search(
            SearchRequest(
                "lookup_zebra", filters=SearchFilters(conversation_ids=("pl",)), mode=mode
            )
        )
        assert all("zebra" not in h.text for h in found.hits)
    # the same payload again is a duplicate; another one is an edit
    assert svc.ingest.append(events[1:2]).duplicates == 1
    edited = dataclasses.replace(events[1], payload=item.replace("zebra", "okapi"))
    assert svc.ingest.append([edited]).accepted == 1
    assert "okapi" in svc.ingest.export_events("pl", 0, "")[0][1].payload
    # over the limit: refused, naming the field
    huge = dataclasses.replace(events[0], turn_id=3, payload="x" * (MAX_PAYLOAD_CHARS + 1))
    bad = svc.ingest.append([huge])
    assert bad.accepted == 0 and "events[0].payload" in bad.errors[0].message
    # a purge erases it with the text
    svc.deletion.delete("pl", TurnRange(1, 1), [])
    svc.deletion.purge_deleted("pl")
    with svc.log.snapshot() as r:
        assert r.events("pl", [1])[1].payload == ""


def test_export_reads_only_the_newest_events_when_asked(services: Services) -> None:
    """ExportEvents' `last`: a session's recent items without reading the whole
    conversation (the Agents SDK session asks for them on every run). Deleted turns do not
    count; the window is fixed by the first page; pages follow their token."""
    svc = services
    events = [
        MemoryEvent("tail", i, "user", f"note {i}", f"2026-02-02T10:00:{i:02d}+00:00")
        for i in range(9)
    ]
    assert svc.ingest.append(events).accepted == 9
    svc.deletion.delete("tail", TurnRange(7, 7), [])

    def turns(last: int, page_size: int = 0) -> list[int]:
        out, token = [], ""
        while True:
            page, token = svc.ingest.export_events("tail", page_size, token, last=last)
            out += [e.turn_id for e in page]
            if not token:
                return out
            svc.ingest.append([events[0]])  # a duplicate between pages changes nothing

    assert turns(0) == [0, 1, 2, 3, 4, 5, 6, 8]
    assert turns(3) == [5, 6, 8]  # turn 7 is deleted: the newest three live ones
    assert turns(3, page_size=2) == [5, 6, 8]
    assert turns(1) == [8] and turns(8) == turns(0) and turns(100) == turns(0)
    first, token = svc.ingest.export_events("tail", 1, "", last=2)
    later = MemoryEvent("tail", 9, "user", "note 9", "2026-02-02T10:00:09+00:00")
    assert svc.ingest.append([later]).accepted == 1
    rest, _ = svc.ingest.export_events("tail", 0, token, last=2)
    assert [e.turn_id for e in first + rest] == [6, 8, 9]  # the window began at turn 6
    with pytest.raises(InvalidArgument) as refused:
        svc.ingest.export_events("tail", 0, "", last=-1)
    assert refused.value.field == "last"


def log_written_at_schema(tmp_path: Path, version: int, row: str) -> EventLog:
    """The event log in `tmp_path` as an older memsvc left it: migrated to `version` only,
    holding `row` (an INSERT of that schema); then opened by this one."""
    from memsvc.storage.sqlite import LOG_FILE, open_log
    from memsvc.storage.sqlite.database import SqliteDatabase
    from memsvc.storage.sqlite.schema import LOG_MIGRATIONS, migrate

    old = SqliteDatabase(tmp_path / LOG_FILE)
    with old.transaction() as sql:
        assert migrate(sql, LOG_MIGRATIONS[:version], "old log") == version
        sql.run(row)
    log, _, _ = open_log(tmp_path)
    return log


def test_layout_rows_of_the_previous_schema_may_be_standing_instructions(
    tmp_path: Path,
) -> None:
    """Layout rows written before they marked standing instructions (schema 3) count as
    possible ones, so searches of their conversations keep asking the store for rules;
    rows written since say what they are."""
    log = log_written_at_schema(
        tmp_path,
        3,
        "INSERT INTO layout (chunk_id, conversation_id, chunk_version, start_turn,"
        " end_turn, source_hash, text_hash) VALUES ('c-old', 'old', 1, 0, 1, 's', 't')",
    )
    with log.transaction() as tx:
        tx.put_layout([LayoutRow("c-new", "new", 1, 0, 1, "s", "t", standing=False)])
    with log.snapshot() as r:
        assert r.layout_rows(["c-old"])["c-old"].standing
        assert not r.layout_rows(["c-new"])["c-new"].standing
        assert r.may_hold_standing(["old"]) and r.may_hold_standing(["old", "new"])
        assert not r.may_hold_standing(["new"]) and not r.may_hold_standing(["absent"])
        assert r.may_hold_standing()


def test_a_log_of_the_previous_schema_gains_payloads(tmp_path: Path) -> None:
    """An event log written before payloads (schema 2) opens: its events have none."""
    log = log_written_at_schema(
        tmp_path,
        2,
        "INSERT INTO events (conversation_id, turn_id, speaker, speaker_name, text,"
        " clean_text, timestamp, participants, tokens) VALUES"
        " ('old', 0, 'user', '', 'hi', 'hi', '2026-01-01T00:00:00+00:00', '[]', 1)",
    )
    with log.snapshot() as r:
        assert r.events("old", [0])[0].payload == "" and r.events("old", [0])[0].text == "hi"


def test_a_log_of_the_previous_schema_counts_its_tenants_keyword_statistics(
    tmp_path: Path,
) -> None:
    """A log written before it kept keyword statistics per tenant (schema 6) opens with
    them counted from its live turns: a deleted turn's words count nowhere."""
    from memsvc.domain import bm25

    rows = [("acme/1", 0, "Biscuit the puppy", 0), ("acme/1", 1, "puppy zqgone", 1)]
    rows += [("acme/1", 4, "a puppy", 0), ("beta/1", 0, "the puppy again", 0)]
    log = log_written_at_schema(
        tmp_path,
        6,
        "INSERT INTO events (conversation_id, turn_id, speaker, speaker_name, text,"
        " clean_text, timestamp, participants, tokens, deleted) VALUES "
        + ", ".join(
            f"('{c}', {t}, 'user', '', '{x}', '{x}', '2026-01-01T00:00:00+00:00', '[]', 3, {d})"
            for c, t, x, d in rows
        ),
    )
    puppy, gone = bm25.term_id("puppi"), bm25.term_id("zqgone")
    acme = bm25.Tenants(names=frozenset({"acme/"}))
    with log.snapshot() as r:
        # documents are blocks of four turns: acme/1 has two
        assert r.term_frequencies(acme, [puppy, gone]) == (2, {puppy: 2})
        assert r.term_frequencies(bm25.EVERYONE, [puppy, gone]) == (3, {puppy: 3})


def test_a_log_of_the_previous_schema_finds_layout_rows_by_their_first_turn(
    tmp_path: Path,
) -> None:
    """A log written before its layout was indexed by first turn (schema 7) opens with the
    indexes, and its rows answer the replan's and the index step's questions as before."""
    rows = [("c-0", 0, 1, 1, "h0"), ("c-1", 2, 3, 0, ""), ("c-2", 4, 5, 1, "")]
    log = log_written_at_schema(
        tmp_path,
        7,
        "INSERT INTO layout (chunk_id, conversation_id, chunk_version, start_turn, end_turn,"
        " source_hash, text_hash, indexed, content_hash) VALUES "
        + ", ".join(f"('{c}', 'old', 1, {a}, {b}, 's', 't', {i}, '{h}')" for c, a, b, i, h in rows),
    )
    with log.snapshot() as r:
        assert sorted(r.layout("old", 1, from_turn=2)) == ["c-1", "c-2"]
        assert r.first_unindexed_turn("old", 1) == 2
        assert r.first_turn_to_render("old", 1) == 2
        indexes = {
            str(row[0]) for row in r.sql.rows("SELECT name FROM sqlite_master WHERE type = 'index'")
        }
    assert {"layout_start", "layout_unstored", "layout_unhashed"} <= indexes


def test_export_reads_only_the_turns_asked_for(services: Services) -> None:
    """ExportEvents' `turn_range`: the turns a search hit covers (an adapter gives each its
    own memory), without reading the rest; deleted turns left out; pages follow tokens."""
    svc = services
    events = [
        MemoryEvent("span", i, "user", f"note {i}", f"2026-02-02T10:00:{i:02d}+00:00")
        for i in range(12)
    ]
    assert svc.ingest.append(events).accepted == 12
    svc.deletion.delete("span", TurnRange(5, 5), [])

    def turns(start: int, end: int, page_size: int = 0) -> list[int]:
        out, token = [], ""
        while True:
            page, token = svc.ingest.export_events(
                "span", page_size, token, turns=TurnRange(start, end)
            )
            out += [e.turn_id for e in page]
            if not token:
                return out

    assert turns(3, 7) == [3, 4, 6, 7]
    assert turns(3, 7, page_size=1) == [3, 4, 6, 7]
    assert turns(5, 5) == [] and turns(11, 40) == [11] and turns(0, 0) == [0]
    for bad, field in ((TurnRange(4, 3), "turn_range"), (TurnRange(-1, 3), "turn_range.start")):
        with pytest.raises(InvalidArgument) as refused:
            svc.ingest.export_events("span", 0, "", turns=bad)
        assert refused.value.field == field
