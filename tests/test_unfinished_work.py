"""Work a crash leaves behind is finished by the next process: a delete or a purge
committed in the log before the store was written (issue 24), on both event-log backends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from memsvc.app import Services, build_services
from memsvc.domain.types import TurnRange
from memsvc.embedding.model import Embedder
from tests.conftest import EN_TURNS, conversation, make_settings
from tests.support.integrity import SECRET, found, live, sync
from tests.support.waiting import until_idle


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
