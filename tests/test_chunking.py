from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from memsvc.domain.chunking import ChunkPolicy, StoredTurn, plan_windows, turn_windows
from memsvc.domain.prefix import KeywordExtractor
from memsvc.domain.rendering import ChunkRenderer
from memsvc.domain.vectors import vector_texts
from memsvc.embedding.model import Embedder
from memsvc.embedding.tokens import estimate_tokens
from tests.conftest import EN_TURNS, ZH_TURNS

GOLDEN = Path(__file__).parent / "golden"


def words(texts: Sequence[str]) -> list[int]:
    """A stand-in token counter for layout tests: one token per character."""
    return [len(t) for t in texts]


def turns(speakers: str, tokens: int = 10) -> list[StoredTurn]:
    """'uaua' -> user/assistant turns 0..n-1."""
    names = {"u": "user", "a": "assistant", "s": "system"}
    return [
        StoredTurn(i, names[s], f"t{i}", f"2026-02-02T10:{i:02d}:00+08:00", tokens=tokens)
        for i, s in enumerate(speakers)
    ]


def spans(windows: Sequence[object]) -> list[tuple[int, int]]:
    return [(w.start_turn, w.end_turn) for w in windows]  # type: ignore[attr-defined]


def test_windows_keep_user_with_reply_and_overlap() -> None:
    policy = ChunkPolicy(max_turns=4, overlap_turns=2)
    assert spans(plan_windows(turns("uaua" * 2), policy, words)) == [(0, 3), (2, 5), (4, 7)]


def test_window_never_splits_an_exchange() -> None:
    # u u a | u a a: exchanges of 3 turns; a window of 4 holds only one of them.
    policy = ChunkPolicy(max_turns=4, overlap_turns=1)
    got = spans(plan_windows(turns("uauuaa"), policy, words))
    assert got == [(0, 1), (2, 5)]


def test_exchange_larger_than_window_is_split_into_turns() -> None:
    policy = ChunkPolicy(max_turns=2, overlap_turns=0)
    got = spans(plan_windows(turns("uaaaa"), policy, words))
    assert got == [(0, 1), (2, 3), (4, 4)]


def test_token_budget_limits_window() -> None:
    policy = ChunkPolicy(max_turns=8, overlap_turns=0, max_tokens=200, prefix_reserve=64)
    # each line costs 60 + 8 = 68 tokens; budget 136 holds one exchange of two turns
    got = spans(plan_windows(turns("uaua", tokens=60), policy, words))
    assert got == [(0, 1), (2, 3)]


def test_oversize_turn_is_split_not_truncated() -> None:
    policy = ChunkPolicy(max_turns=4, overlap_turns=2, max_tokens=120, prefix_reserve=20)
    long = "。".join(f"第{i}句话说的是一些很长的内容" for i in range(30)) + "。"
    t = [
        StoredTurn(0, "user", "短", "2026-02-02T10:00:00+08:00", tokens=1),
        StoredTurn(1, "assistant", long, "2026-02-02T10:01:00+08:00", tokens=len(long)),
        StoredTurn(2, "user", "好", "2026-02-02T10:02:00+08:00", tokens=1),
    ]
    windows = plan_windows(t, policy, words)
    pieces = [w for w in windows if w.start_turn == 1]
    assert len(pieces) > 1
    assert [w.part_index for w in pieces] == list(range(len(pieces)))
    assert all(w.part_count == len(pieces) for w in pieces)
    assert "".join(w.piece for w in pieces).replace(" ", "") == long.replace(" ", "")
    assert all(len(w.piece) <= policy.line_budget - policy.line_overhead for w in pieces)
    assert len({w.chunk_id("c", 1) for w in pieces}) == len(pieces)


def test_turn_ids_far_apart_are_never_one_window() -> None:
    # a turn id of 10**12 beside turn 0 made one chunk of range 0..10**12: hit selection
    # and turn budgets walk a chunk's range, and a search took 23 GB (issue 62, item 13)
    far = [*turns("ua")]
    far += [
        StoredTurn(10**12 + i, t.speaker, t.text, t.timestamp, tokens=10)
        for i, t in enumerate(turns("ua"))
    ]
    assert spans(plan_windows(far, ChunkPolicy(), words)) == [(0, 1), (10**12, 10**12 + 1)]
    # gaps up to MAX_ID_GAP ids (turns deleted between two) stay in one window as before
    near = [
        turns("u")[0],
        StoredTurn(1000, "assistant", "t", "2026-02-02T10:00:00+08:00", tokens=10),
    ]
    assert spans(plan_windows(near, ChunkPolicy(), words)) == [(0, 1000)]


def test_layout_depends_only_on_turns() -> None:
    """Windows closed in a prefix stay the same as the conversation grows; only the tail moves."""
    policy = ChunkPolicy(max_turns=4, overlap_turns=2)
    full = turns("uaua" * 5)
    final = spans(plan_windows(full, policy, words))
    for n in range(1, len(full)):
        prefix = spans(plan_windows(full[:n], policy, words))
        assert prefix[:-1] == [s for s in final if s[1] < n][: len(prefix) - 1]


def test_source_hash_changes_with_content() -> None:
    policy = ChunkPolicy()
    a = plan_windows(turns("ua"), policy, words)[0]
    b = plan_windows(
        [*turns("u"), StoredTurn(1, "assistant", "edited", "2026-02-02T10:01:00+08:00")],
        policy,
        words,
    )[0]
    assert a.source_hash(1, policy) != b.source_hash(1, policy)
    assert a.source_hash(1, policy) != a.source_hash(2, policy)


def _render_all(
    texts: list[str], embedder: Embedder, names: bool = False
) -> list[dict[str, object]]:
    stored = []
    for i, text in enumerate(texts):
        speaker = "user" if i % 2 == 0 else "assistant"
        stored.append(
            StoredTurn(
                i,
                speaker,
                text,
                f"2026-02-0{2 + i // 4}T10:{i:02d}:00+08:00",
                participants=("Ana", "Bot") if names else (),
                speaker_name=("Ana" if speaker == "user" else "Bot") if names else "",
                tokens=embedder.count_tokens([text])[0],
            )
        )
    policy = ChunkPolicy()
    renderer = ChunkRenderer(KeywordExtractor(), embedder.count_tokens, policy)
    out = []
    for w in plan_windows(stored, policy, embedder.count_tokens):
        r = renderer.render("golden", w, 1)
        out.append(
            {
                "chunk_id": r.chunk_id,
                "text": r.text,
                "turn_range": [r.metadata.turn_range.start, r.metadata.turn_range.end],
                "participants": list(r.metadata.participants),
                "speakers": list(r.metadata.speakers),
                "intent_tag": r.metadata.intent_tag,
            }
        )
    return out


@pytest.mark.providers
@pytest.mark.parametrize(
    ("name", "texts", "names"),
    [("zh", ZH_TURNS, False), ("en", EN_TURNS, False), ("en_named", EN_TURNS, True)],
)
def test_golden_chunks(name: str, texts: list[str], names: bool, embedder: Embedder) -> None:
    got = _render_all(texts, embedder, names)
    path = GOLDEN / f"chunks_{name}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, ensure_ascii=False, indent=2) + "\n")
    assert got == json.loads(path.read_text())


@pytest.mark.providers
def test_rendered_chunks_fit_the_model(embedder: Embedder) -> None:
    long_turns = ["word " * 300, "词语" * 400, "short reply"]
    for chunk in _render_all(long_turns, embedder):
        assert embedder.count_tokens([str(chunk["text"])])[0] + 2 <= 512


@pytest.mark.providers
def test_each_turn_is_labelled_in_its_own_language(embedder: Embedder) -> None:
    # issue 66: a mixed English/Chinese chunk labelled every turn 用户(Ana) / 助手
    texts = [
        "我们下周去东京，护照和签证都准备好了吗？",
        "Yes, both are in the blue folder on your desk.",
        "太好了，谢谢！",
        "You're welcome, have a good trip to Tokyo.",
    ]
    lines = _render_all(texts, embedder, names=True)[0]["text"].splitlines()  # type: ignore[union-attr]
    assert lines[1].startswith("用户(Ana): ") and lines[3].startswith("用户(Ana): ")
    assert lines[2].startswith("Assistant (Bot): ") and lines[4].startswith("Assistant (Bot): ")


def test_a_long_turn_is_counted_a_few_times_over_not_once_a_part() -> None:
    """The index step splits a long turn when it plans its conversation and again when it
    makes the parts' vectors, and asks each part for the turn's gist: counting the whole
    turn for each of its 212 parts was 231 times its length in counted characters (a
    tenth of an index step's CPU on the remote path); now 8 times."""
    counted: list[int] = []

    def counting(texts: Sequence[str]) -> list[int]:
        counted.append(sum(map(len, texts)))
        return [estimate_tokens(t) for t in texts]

    text = " ".join(
        f"Sentence {i} says a thing about topic {i % 7}, and more." for i in range(2500)
    )
    turn = StoredTurn(0, "assistant", text, "2024-01-01T00:00:00Z", tokens=estimate_tokens(text))
    policy = ChunkPolicy()
    planned = plan_windows([turn], policy, counting)
    parts = turn_windows(turn, policy, counting)
    assert parts == planned and len(parts) > 150
    for part in parts:
        assert vector_texts(part, policy, counting) == vector_texts(
            part, policy, estimate_tokens_of
        )
    assert sum(counted) <= 16 * len(text)


def estimate_tokens_of(texts: Sequence[str]) -> list[int]:
    return [estimate_tokens(t) for t in texts]
