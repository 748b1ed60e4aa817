"""One normal form: ids and names are checked, stored, filtered and shown in the form they
are kept in, so two that look identical are never two (issue 24), on both event-log
backends."""

from __future__ import annotations

import dataclasses
import unicodedata

import pytest

from memsvc.app import Services
from memsvc.domain.errors import InvalidArgument
from tests.conftest import EN_TURNS, turn
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
