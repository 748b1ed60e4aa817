"""One normal form: ids and names are checked, stored, filtered and shown in the form they
are kept in, so two that look identical are never two (issue 24), on both event-log
backends."""

from __future__ import annotations

import dataclasses
import unicodedata
from pathlib import Path

import pytest

from memsvc.app import Services, build_services
from memsvc.domain.errors import InvalidArgument
from memsvc.domain.text import TEXT_FORM, fold_text
from memsvc.domain.types import SearchFilters, SearchMode, SearchRequest
from memsvc.ports import Embedder
from memsvc.services import ingest
from tests.conftest import EN_TURNS, make_settings, turn
from tests.support.integrity import found, live, sync


def test_a_name_is_checked_in_the_form_it_is_stored_in(services_on_both: Services) -> None:
    services = services_on_both  # on both event-log backends
    grows = "\u337f" * 100  # each of these is 4 characters in NFKC: 400 > 256
    with pytest.raises(InvalidArgument) as err:
        services.ingest.build([turn("nf-a", 0, "hello", participants=(grows,))])
    assert err.value.field == "events[0].participants[0]"
    result = services.ingest.append([turn("nf-a", 0, "hello", speaker_name=grows)])
    assert result.accepted == 0 and "events[0].speaker_name" in result.errors[0].message


def test_the_server_stores_every_chunk_it_built_for_a_long_name(services_on_both: Services) -> None:
    services = services_on_both  # on both event-log backends
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


def test_a_filter_on_a_name_as_sent_finds_it(services_on_both: Services) -> None:
    services = services_on_both  # on both event-log backends
    fullwidth = "Ｍａｒｉａ"
    sync(services, [turn("nf-c", 0, "I planted tulips by the fence.", participants=(fullwidth,))])
    assert "tulips" in found(services, "nf-c", "tulips fence", participants=(fullwidth,))
    assert "tulips" in found(services, "nf-c", "tulips fence", participants=("Maria",))


def test_ids_that_differ_only_in_normal_form_are_one_conversation(
    services_on_both: Services,
) -> None:
    services = services_on_both  # on both event-log backends
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


def test_events_of_a_conversation_keep_their_normal_form_in_chunks(
    services_on_both: Services,
) -> None:
    services = services_on_both  # on both event-log backends
    raw = dataclasses.replace(turn("nf-d", 0, "Hi"), speaker_name="  Ａｎａ  ")
    built = services.ingest.build([raw])
    assert "Ana" in built.chunks[0].text and built.chunks[0].metadata.participants == ("Ana",)


def test_turn_text_keeps_full_width_punctuation(services_on_both: Services) -> None:
    # issue 66, item 7: cleaning folded full-width punctuation to ASCII in what chunks show
    # (东京,护照放哪了?), changing what the user wrote; full-width letters and digits still
    # fold, so they are found as typed in ASCII; names still fold (filters match them)
    services = services_on_both  # on both event-log backends
    said = "东京，护照放哪了？我记得放在（蓝色）抽屉里……"
    room = turn("nf-e", 1, "Ｒｏｏｍ ４１７ at ９:３０", participants=("Ana（助手）",))
    sync(services, [turn("nf-e", 0, said), room])
    texts = "\n".join(live(services, "nf-e").values())
    assert said in texts and "Room 417 at 9:30" in texts
    keyword = SearchRequest("护照", 10, SearchFilters(("nf-e",)), SearchMode.KEYWORD)
    assert any(said in h.text for h in services.search.search(keyword).hits)
    by_name = SearchRequest(
        "room 417", 10, SearchFilters(("nf-e",), participants=("Ana(助手)",)), SearchMode.KEYWORD
    )
    assert any("Room 417" in h.text for h in services.search.search(by_name).hits)
    exported, _ = services.ingest.export_events("nf-e", 0, "")
    assert exported[1].text == "Ｒｏｏｍ ４１７ at ９:３０"  # the log keeps the text as sent


def test_a_log_cleaned_in_the_previous_form_is_cleaned_again(
    tmp_path: Path,
    embedder: Embedder,
    backend: dict[str, object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a log written before text form 2 (full-width punctuation folded): the turns the new
    # form changes are cleaned again at start and their conversations rebuilt; the others
    # are left as they are (no work recorded for them)
    said = "东京，护照放哪了？"
    with monkeypatch.context() as old:
        old.setattr(ingest, "clean_text", fold_text)  # what the previous version stored
        first = build_services(make_settings(tmp_path, **backend), embedder=embedder)
        try:
            sync(first, [turn("nf-old", 0, said), turn("nf-old", 1, "好的。")])
            sync(first, [turn("nf-plain", 0, "The espresso machine is broken.")])
            assert "东京,护照放哪了?" in "\n".join(live(first, "nf-old").values())
            plain = live(first, "nf-plain")
            with first.log.transaction() as tx:
                tx.delete_meta("text_form")  # a log from before the form was recorded
        finally:
            first.close()
    second = build_services(make_settings(tmp_path, **backend), embedder=embedder)
    try:
        (untouched,) = second.queue.status(["nf-plain"])
        assert untouched.state == "idle" and untouched.dirty == 0
        assert second.control.wait_for_indexed("nf-old", 1, 120) is not None
        texts = "\n".join(live(second, "nf-old").values())
        assert said in texts and "东京,护照" not in texts
        assert live(second, "nf-plain") == plain
        with second.log.snapshot() as r:
            assert r.events("nf-old", [0])[0].clean_text == said
            assert r.get_meta("text_form") == TEXT_FORM
    finally:
        second.close()
