"""What a replan of one conversation and version reads (memsvc.services.projection):
after a change, only the turns and layout rows from where planning again can start
(memsvc.domain.replanning); everything when the layout was never planned, or no window
before the change allows it."""

from __future__ import annotations

from dataclasses import dataclass

from memsvc.domain.chunking import StoredTurn
from memsvc.domain.records import Conversation, LayoutRow
from memsvc.domain.replanning import LOOKBEHIND_TURNS, resume_turn
from memsvc.ports import LogReader


@dataclass(frozen=True)
class PlanInput:
    # None: the whole conversation; else the turn planning starts again from (the layout's
    # windows before it stay as they are).
    from_turn: int | None
    turns: list[StoredTurn]  # live turns from `from_turn` on
    old: dict[str, LayoutRow]  # the version's layout rows from `from_turn` on
    deleted_turns: list[int]  # deleted turns from `from_turn` on
    seq: int  # the work sequence number these reads reflect


def read_plan_input(r: LogReader, conv: str, version: int, row: Conversation | None) -> PlanInput:
    seq = row.work_seq if row is not None else 0
    planned = row.planned_seq(version) if row is not None else 0
    if planned > 0:
        bounds = [
            b
            for b in (
                r.first_turn_written_since(conv, planned),
                r.first_turn_to_render(conv, version),
            )
            if b is not None
        ]
        if not bounds:  # nothing written since the plan, and all of it stored
            return PlanInput(_AFTER_ALL, [], {}, [], seq)
        bound = min(bounds)
        for back in LOOKBEHIND_TURNS:
            lower = r.live_turn_before(conv, bound, back)
            if lower is None:
                break  # fewer turns than that before the change: plan everything
            turns = r.live_turns(conv, lower)
            old = r.layout(conv, version, lower)
            live = [(x.start_turn, x.end_turn) for x in old.values() if not x.deleted]
            start = resume_turn(turns, live, bound)
            if start is not None:
                return PlanInput(
                    start,
                    [t for t in turns if t.turn_id >= start],
                    {cid: x for cid, x in old.items() if x.start_turn >= start},
                    r.deleted_turn_ids(conv, start),
                    seq,
                )
    return whole_plan_input(r, conv, version, seq)


def whole_plan_input(r: LogReader, conv: str, version: int, seq: int) -> PlanInput:
    return PlanInput(
        None, r.live_turns(conv), r.layout(conv, version), r.deleted_turn_ids(conv), seq
    )


# Past every turn id: the layout is current, nothing to plan again.
_AFTER_ALL = 2**63
