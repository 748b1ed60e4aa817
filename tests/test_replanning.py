"""Planning a layout again from a window after a change (memsvc.domain.replanning) gives
the layout of the whole conversation: a property over random conversations and changes
(appends, edits, deletes, turns put into a gap), against `plan_windows` of every turn."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import event, given
from hypothesis import strategies as st

from memsvc.domain.chunking import MAX_ID_GAP, ChunkPolicy, StoredTurn, plan_windows
from memsvc.domain.replanning import LOOKBEHIND_TURNS, resume_turn

POLICIES = [
    ChunkPolicy(),
    ChunkPolicy(max_turns=4, overlap_turns=2, max_tokens=200, turn_unit_tokens=60),
    ChunkPolicy(max_turns=3, overlap_turns=1, max_tokens=160, turn_unit_tokens=40),
]
RULE = "Please always answer me in French from now on."


def count(texts: Sequence[str]) -> list[int]:
    """One token a character: a turn's text and its `tokens` agree."""
    return [len(t) for t in texts]


@st.composite
def a_turn(draw: st.DrawFn, turn_id: int) -> StoredTurn:
    speaker = draw(st.sampled_from(["user", "user", "assistant", "assistant", "system"]))
    kind = draw(st.sampled_from(["short", "short", "short", "long", "rule"]))
    if kind == "rule":
        text = RULE
    else:
        size = draw(st.integers(3, 40) if kind == "short" else st.integers(80, 700))
        text = " ".join(f"w{turn_id}x{i}." for i in range(size // 6 + 1))
    return StoredTurn(
        turn_id, speaker, text, f"2026-03-01T10:{turn_id % 60:02d}:00Z", tokens=len(text)
    )


@st.composite
def conversations(draw: st.DrawFn) -> list[StoredTurn]:
    n = draw(st.integers(LOOKBEHIND_TURNS[0] + 5, LOOKBEHIND_TURNS[0] + 80))
    turns, next_id = [], 0
    for _ in range(n):
        next_id += draw(st.sampled_from([1] * 30 + [2, MAX_ID_GAP + 1]))
        turns.append(draw(a_turn(next_id)))
    return turns


@st.composite
def changed(draw: st.DrawFn, old: list[StoredTurn]) -> tuple[list[StoredTurn], int]:
    """The conversation after one change, and the first turn id it touched."""
    kind = draw(st.sampled_from(["append", "append", "edit", "delete", "insert"]))
    turns = list(old)
    if kind == "append":
        first = old[-1].turn_id + draw(st.sampled_from([1, 1, 1, MAX_ID_GAP + 1]))
        added = [draw(a_turn(first + i)) for i in range(draw(st.integers(1, 6)))]
        return turns + added, first
    at = draw(st.integers(0, len(turns) - 1))
    if kind == "edit":
        turns[at] = draw(a_turn(turns[at].turn_id))
    elif kind == "delete":
        del turns[at]
        return turns, old[at].turn_id
    else:  # a turn put where none was: into a gap, or before the first (else an edit)
        below = turns[at - 1].turn_id if at else -1
        if turns[at].turn_id - below >= 2:
            turns.insert(at, draw(a_turn(below + 1)))
        else:
            turns[at] = draw(a_turn(turns[at].turn_id))
    return turns, turns[at].turn_id


def region(turns: list[StoredTurn], bound: int, back: int) -> list[StoredTurn] | None:
    """The live turns a replan reads: from the `back`-th before `bound` on."""
    before = [t for t in turns if t.turn_id < bound]
    if len(before) < back:
        return None
    lower = before[-back].turn_id
    return [t for t in turns if t.turn_id >= lower]


@given(data=st.data(), policy=st.sampled_from(POLICIES))
def test_planning_again_from_the_resume_turn_is_planning_everything(
    data: st.DataObject, policy: ChunkPolicy
) -> None:
    old = data.draw(conversations())
    new, first_changed = data.draw(changed(old))
    # a replan may start earlier still (a window not yet stored): any bound up to the change
    bound = data.draw(st.sampled_from([first_changed, first_changed, old[len(old) // 2].turn_id]))
    bound = min(bound, first_changed)
    layout = plan_windows(old, policy, count)
    read = region(new, bound, LOOKBEHIND_TURNS[0])
    if read is None:
        event("fewer turns before the change than are read back")
        return
    windows = [(w.start_turn, w.end_turn) for w in layout if w.start_turn >= read[0].turn_id]
    start = resume_turn(read, windows, bound)
    event("planned again from a window" if start is not None else "planned whole")
    if start is None:
        return
    again = plan_windows([t for t in new if t.turn_id >= start], policy, count)
    kept = [w for w in layout if w.start_turn < start]
    assert kept + again == plan_windows(new, policy, count)
    # the projector's check: the first window planned again is the layout's, unchanged
    assert again[0] in layout


def test_an_append_to_a_long_conversation_plans_a_few_turns_again() -> None:
    """One turn after 10,000 plain exchanges: planning starts a few windows back."""
    old = [
        StoredTurn(i, "user" if i % 2 == 0 else "assistant", f"turn {i} said this.", "", tokens=8)
        for i in range(10_000)
    ]
    new = [*old, StoredTurn(10_000, "user", "one more.", "", tokens=4)]
    layout = plan_windows(old, ChunkPolicy(), count)
    read = region(new, 10_000, LOOKBEHIND_TURNS[0])
    assert read is not None
    windows = [(w.start_turn, w.end_turn) for w in layout if w.start_turn >= read[0].turn_id]
    start = resume_turn(read, windows, 10_000)
    assert start is not None and 10_000 - start <= 8
    again = plan_windows([t for t in new if t.turn_id >= start], ChunkPolicy(), count)
    assert [w for w in layout if w.start_turn < start] + again == plan_windows(
        new, ChunkPolicy(), count
    )
