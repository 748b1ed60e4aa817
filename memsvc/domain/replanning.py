"""Where a conversation's layout can be planned again from, after a change.

`plan_windows` walks a run of turns left to right, and what it does at a window's start
depends only on the units (exchanges, or the turns of a split one) from there on. So after a
change whose first changed turn is C (an append, an edit, a delete, a restore: any event the
log wrote since the layout was planned), the windows before some earlier window W stay as
they are, and the rest is `plan_windows` of the turns from W's first turn, when:

- W starts an exchange or a run (its first turn is a user's after someone else's turn, or
  follows a gap of more than MAX_ID_GAP ids), so the units from there are the same whether
  planned from the run's start or from W;
- the walk reached W reading only units entirely before C that no later turn can change:
  it reads at most the unit after W's last turn, so that unit's exchange must be closed (a
  next exchange or run starts) by a turn before C. An appended turn can extend the last
  exchange, and a longer exchange may be split into turns.

Planning a 10,000-turn conversation again after one append then reads a few dozen turns,
not all of them (`benchmarks/RESULTS.md`, ADK adds). The projector checks the first window
planned again against the layout (same id, same source hash) and plans everything when it
differs (another chunk policy, say).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from memsvc.domain.chunking import MAX_ID_GAP, StoredTurn, starts_exchange

# Live turns read back from the first changed turn, in turn, until a window there allows
# planning again: a few windows of plain exchanges, then room for long exchanges (a user's
# turn and many replies or tool calls); else everything is planned.
LOOKBEHIND_TURNS = (16, 256)


def starts_unit_run(prev: StoredTurn, turn: StoredTurn) -> bool:
    """Whether `turn` starts an exchange or a run (after `prev`, the live turn before it)."""
    return turn.turn_id - prev.turn_id > MAX_ID_GAP or starts_exchange(prev, turn)


def resume_turn(
    turns: Sequence[StoredTurn],
    windows: Iterable[tuple[int, int]],
    changed_from: int,
) -> int | None:
    """The first turn of a window of the layout from which planning again gives the
    layout the whole conversation would have, or None (plan everything).

    `turns`: the live turns from some turn on (in turn order, as the log holds them now);
    `windows`: (first, last) turns of the layout's live windows planned before the change;
    `changed_from`: the first turn id the log changed since (or the first window not yet
    stored: planning again must reach it)."""
    index = {t.turn_id: i for i, t in enumerate(turns)}
    for start, end in sorted(set(windows), reverse=True):
        if start >= changed_from:
            continue
        at, last = index.get(start), index.get(end)
        if at is None or last is None or at == 0:
            continue  # the turn before it was not read: cannot tell how it starts
        if not starts_unit_run(turns[at - 1], turns[at]):
            continue
        if _closed_before(turns, last + 1, changed_from):
            return start
    return None


def _closed_before(turns: Sequence[StoredTurn], after: int, changed_from: int) -> bool:
    """Whether the exchange holding turns[after] ends, and the next one starts, at a turn
    before `changed_from`."""
    if after >= len(turns) or turns[after].turn_id >= changed_from:
        return False
    for i in range(after + 1, len(turns)):
        if turns[i].turn_id >= changed_from:
            return False
        if starts_unit_run(turns[i - 1], turns[i]):
            return True
    return False
