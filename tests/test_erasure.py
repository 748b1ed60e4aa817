"""Erasure: purged text is in no file after a clean stop, and no cached vector derived
from a purged turn survives, even one a write was embedding during the purge (issues 24
and 37), on both event-log backends."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from memsvc.app import Services, build_services
from memsvc.domain.hashing import text_hash
from memsvc.domain.types import TurnRange
from memsvc.domain.vectors import gist
from memsvc.embedding.model import Embedder
from tests.conftest import EN_TURNS, conversation, make_settings
from tests.support.integrity import SECRET, found, sync


def files_holding(root: Path, needle: str) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and needle.encode("utf-8") in p.read_bytes()
    )


LONG_SECRET = (
    "My locker code is 4417-tango and the spare key is under the blue flowerpot by the door."
    " I am writing this down here so that I will not forget it again next week, because"
    " last time I had to call the building manager twice and wait for an hour in the rain"
    " before anyone came with the master key to open the locker room for me. The gym itself"
    " is on the third floor, next to the laundry, and the lockers are numbered from the"
    " window side; mine is the last one in the second row, with a dent in the door. If I"
    " lose the code again, the manager keeps a copy in the office safe behind reception,"
    " and the cleaning staff can let me in on weekday mornings before nine o'clock."
)


def cached(services: Services, texts: list[str]) -> set[str]:
    key = services.embedder.identity.cache_key
    return set(services.cache.get_many(key, [text_hash(t) for t in texts]))


def turn_texts(embedder: Embedder, text: str) -> list[str]:
    """The texts a single turn's vector is made of (memsvc.domain.vectors)."""
    return [text, gist(text, 64, embedder.count_tokens)]


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


def test_the_log_says_which_conversation_waits_for_a_purge(
    tmp_path: Path, embedder: Embedder, backend: dict[str, object]
) -> None:
    """What a one-conversation purge asks the log (scale v2: it used to list every
    conversation with deleted turns, a read that grows with the log, to test one)."""
    svc = build_services(make_settings(tmp_path, **backend), embedder=embedder)
    try:
        sync(svc, conversation("waits", EN_TURNS[:3]))
        sync(svc, conversation("other", EN_TURNS[:3]))
        svc.deletion.delete("waits", TurnRange(1, 1), [])
        with svc.log.snapshot() as r:
            assert r.holds_deleted("waits") and not r.holds_deleted("other")
            assert r.conversations_with_deleted() == ["waits"]
        svc.deletion.purge_deleted("waits")
        with svc.log.snapshot() as r:
            assert not r.holds_deleted("waits") and r.conversations_with_deleted() == []
    finally:
        svc.close()


def test_a_purge_forgets_the_vectors_of_a_turns_head_and_gist(
    services_on_both: Services, embedder: Embedder
) -> None:
    svc = services_on_both
    built = svc.ingest.build(conversation("pg", ["Hi there.", LONG_SECRET]))
    assert any(c.metadata.turn_range == TurnRange(1, 1) for c in built.chunks)  # a turn unit
    svc.ingest.upsert(built.chunks)
    texts = turn_texts(embedder, LONG_SECRET)
    assert cached(svc, texts) == {text_hash(t) for t in texts}
    svc.deletion.delete("pg", TurnRange(1, 1), [])
    svc.deletion.purge_deleted("pg")
    assert cached(svc, texts) == set()


def test_12_a_write_embedding_during_a_purge_does_not_put_its_vector_back(
    services_on_both: Services, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (issue 37, 12): a step that was embedding while a purge ran put the
    purged text's vector back in the embedding cache, where it survived a clean stop."""
    svc = services_on_both
    built = svc.ingest.build(conversation("race", ["Hi there.", LONG_SECRET]))
    embedding, release = threading.Event(), threading.Event()
    real = embedder.encode_passages
    secret_texts: list[str] = []

    def slow(texts: list[str]) -> object:
        out = real(texts)
        if any("4417-tango" in t for t in texts):
            secret_texts.extend(t for t in texts if "4417-tango" in t)
            embedding.set()
            assert release.wait(60)
        return out

    monkeypatch.setattr(embedder, "encode_passages", slow)
    outcome: list[object] = []
    writer = threading.Thread(target=lambda: outcome.append(svc.ingest.upsert(built.chunks)))
    writer.start()
    assert embedding.wait(60)
    svc.deletion.delete("race", None, [])
    svc.deletion.purge_deleted("race")
    release.set()
    writer.join(60)
    assert outcome, "the write finished"
    assert secret_texts and cached(svc, secret_texts) == set()
    assert not any("4417-tango" in c.record.text for c in svc.store.chunks_of("race", deleted=None))
