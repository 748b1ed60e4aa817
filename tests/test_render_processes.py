"""Render processes (memsvc.services.render_processes): the windows and records laid out in
another process are the ones this process lays out, with each model family's token
counter sent over; a render process killed mid-load loses no layout; processes that
cannot start are not started again, and a pool that cannot be made is reported as such."""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from structlog.testing import capture_logs

from memsvc.config import Settings
from memsvc.domain.chunking import ChunkPolicy, StoredTurn
from memsvc.domain.layout import PlannedWindow
from memsvc.domain.prefix import KeywordExtractor
from memsvc.domain.rendering import ChunkRenderer
from memsvc.embedding.e5.embedder import E5Embedder
from memsvc.embedding.model import Embedder
from memsvc.embedding.tokens import RemoteTokenizer
from memsvc.observability import metrics
from memsvc.ports import PortableTokenCounts
from memsvc.services import render_processes
from memsvc.services.render_processes import InProcess, RenderProcesses, layouts_for
from tests.support.conversations import generate

POLICY = ChunkPolicy()


def lost_count() -> float:
    return metrics.REGISTRY.get_sample_value("memsvc_render_processes_lost_total") or 0.0


def running() -> float | None:
    return metrics.REGISTRY.get_sample_value("memsvc_render_processes")


def turns_of(conv: str, seed: int, count: Any) -> list[StoredTurn]:
    """Generated turns (named speakers, Chinese, turns long enough to be split)."""
    events = generate(conv, seed, sessions=4, turns_per_session=(6, 14))
    tokens = count([e.text for e in events])
    return [
        StoredTurn(e.turn_id, e.speaker, e.text, e.timestamp, e.participants, e.speaker_name, n)
        for e, n in zip(events, tokens, strict=True)
    ]


def samples(count: Any) -> Iterator[tuple[str, list[StoredTurn]]]:
    for seed in range(6):
        yield f"c{seed}", turns_of(f"c{seed}", seed, count)


def stored_half(windows: Sequence[PlannedWindow]) -> dict[str, str]:
    """The first half of the windows, as if the store held them as rendered."""
    return {w.chunk_id: w.source_hash for w in windows[: len(windows) // 2]}


@pytest.fixture(params=["multilingual-e5-small", "all-MiniLM-L6-v2", "remote, estimated"])
def counting(request: pytest.FixtureRequest) -> PortableTokenCounts:
    if request.param == "multilingual-e5-small":
        e5: E5Embedder = request.getfixturevalue("e5")
        return e5
    if request.param == "all-MiniLM-L6-v2":
        minilm: Embedder = request.getfixturevalue("embedder")
        return minilm
    return _Estimated()


class _Estimated:
    """The remote embedder's counter without a tokenizer file (memsvc.embedding.tokens)."""

    def __init__(self) -> None:
        self.tokens = RemoteTokenizer()

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self.tokens.count(texts)

    def token_counts(self) -> Any:
        return self.tokens.count


def test_render_processes_lay_out_what_this_process_lays_out(
    counting: PortableTokenCounts,
) -> None:
    count = counting.count_tokens  # type: ignore[attr-defined]
    renderer = ChunkRenderer(KeywordExtractor(), count, POLICY)
    here = InProcess(renderer)
    there = RenderProcesses(renderer, counting.token_counts(), 1)
    try:
        laid, split, chinese = 0, 0, 0
        for conv, turns in samples(count):
            for version in (1, 2):
                expected = here.lay_out(conv, version, turns, {})
                assert there.lay_out(conv, version, turns, {}) == expected
                # windows the store holds as they would be rendered are not rendered again
                stored = stored_half(expected)
                again = there.lay_out(conv, version, turns, stored)
                assert again == here.lay_out(conv, version, turns, stored)
                assert [w.record is None for w in again] == [w.chunk_id in stored for w in expected]
                laid += len(expected)
                records = [w.record for w in expected if w.record]
                split += sum(r.metadata.part_count > 1 for r in records)
                chinese += sum(r.text.startswith("[上下文") for r in records)
        assert laid > 100 and split and chinese  # long turns in parts, Chinese windows
    finally:
        there.close()
    assert not multiprocessing.active_children()


def test_a_killed_render_process_loses_no_layout() -> None:
    counter = RemoteTokenizer()
    renderer = ChunkRenderer(KeywordExtractor(), counter.count, POLICY)
    here = InProcess(renderer)
    there = RenderProcesses(renderer, counter.count, 1)
    conv, turns = next(samples(counter.count))
    expected = here.lay_out(conv, 1, turns, {})
    lost = lost_count()
    try:
        assert there.lay_out(conv, 1, turns, {}) == expected
        first = {p.pid for p in multiprocessing.active_children()}
        assert len(first) == 1 and running() == 1
        for pid in first:
            os.kill(pid, signal.SIGKILL)
        # the step in flight lays out here; the next starts a new process
        assert there.lay_out(conv, 1, turns, {}) == expected
        assert lost_count() == lost + 1
        assert there.lay_out(conv, 1, turns, {}) == expected
        now = {p.pid for p in multiprocessing.active_children()}
        assert len(now) == 1 and not now & first
        assert running() == 1
    finally:
        there.close()


class _Unloadable:
    """A token counter that pickles here and cannot be loaded in a render process."""

    def __call__(self, texts: Sequence[str]) -> list[int]:
        return [len(t) for t in texts]

    def __getstate__(self) -> dict[str, Any]:
        return {"broken": True}

    def __setstate__(self, state: dict[str, Any]) -> None:
        raise RuntimeError("this counter does not load here")


def test_render_processes_that_cannot_start_are_not_started_again() -> None:
    counter = _Unloadable()
    renderer = ChunkRenderer(KeywordExtractor(), counter, POLICY)
    there = RenderProcesses(renderer, counter, 1)
    conv, turns = next(samples(counter))
    try:
        expected = InProcess(renderer).lay_out(conv, 1, turns, {})
        assert there.lay_out(conv, 1, turns, {}) == expected
        assert there.lay_out(conv, 1, turns, {}) == expected
        for child in multiprocessing.active_children():
            child.join(10)
        assert not multiprocessing.active_children()
        assert running() == 0  # off: laying out here
    finally:
        there.close()


class _LocalOnly:
    name = "local-only"

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return [len(t) for t in texts]


def test_a_counter_that_stays_here_lays_out_here(e5: E5Embedder) -> None:
    assert isinstance(layouts_for(e5, POLICY, Settings()), InProcess)
    two = Settings(index_render_processes=2)
    assert isinstance(layouts_for(_LocalOnly(), POLICY, two), InProcess)  # type: ignore[arg-type]
    processes = layouts_for(e5, POLICY, Settings(index_render_processes=1))
    try:
        assert isinstance(processes, RenderProcesses)
    finally:
        processes.close()


def test_processes_that_cannot_be_made_lay_out_here_saying_so(
    e5: E5Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reason names what failed: a pool that could not start was reported as a token
    counter that does not pickle."""

    def no_process(*args: object, **kwargs: object) -> None:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(render_processes, "ProcessPoolExecutor", no_process)
    with capture_logs() as logs:
        layouts = layouts_for(e5, POLICY, Settings(index_render_processes=1))
    assert isinstance(layouts, InProcess)
    [said] = [e for e in logs if e["event"] == "render_processes_unavailable"]
    assert said["reason"].startswith("the processes did not start: ")
    assert "Resource temporarily unavailable" in said["reason"]
