"""Standing instructions and preferences beside a search's hits (chunks tagged
`instruction`, memsvc.domain.standing): where to look for them, a store search of their
own (memsvc.services.search), and which of those found to return."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from memsvc.domain.records import Candidate
from memsvc.domain.types import Hit
from memsvc.observability.metrics import stage
from memsvc.ports import EventLog, SearchScope
from memsvc.services.selection import Coverage, HitSelector, span_of

# Standing instructions returned beside the hits at most, and the cosine with the query
# one needs (unrelated texts score ~0.0-0.15 with MiniLM or bge-small).
STANDING_TOP_K = 3
STANDING_MIN_SCORE = 0.25
# Under a turn budget, one standing instruction per this many of its turns (one at least):
# three rules took 3 of a 5-turn budget's turns, and BEAM dev's main questions found 0.428
# within 5 turns against one vector per turn's 0.531 (0.532 since; benchmarks/archive).
BUDGET_TURNS_PER_RULE = 5
# A search naming no conversation looks for standing instructions in the conversations
# holding some when they are at most this many (their ids in one filter), else everywhere.
STANDING_NARROWED_AT_MOST = 100


class StandingRules:
    def __init__(self, log: EventLog, selector: HitSelector) -> None:
        self.log = log
        self.selector = selector

    def scope(self, scope: SearchScope) -> SearchScope | None:
        """Where to look for the standing instructions in scope; None: the log holds none
        there. A scope naming no conversation is narrowed to the conversations holding
        some, when they are few: a store in shards then asks their shards alone, not each
        of its shards (a call each, ~1 ms before any row is compared; ~50 ms at a million
        chunks in 32 shards)."""
        named = scope.filters.conversation_ids
        with stage("search", "standing"), self.log.snapshot() as r:
            if named:
                return scope if r.may_hold_standing(named) else None
            holding = r.standing_conversations(scope.prefixes, STANDING_NARROWED_AT_MOST + 1)
        if not holding:
            return None
        if len(holding) > STANDING_NARROWED_AT_MOST:
            return scope
        return replace(scope, filters=replace(scope.filters, conversation_ids=tuple(holding)))

    def given(self, rules: Sequence[Candidate], audit: bool, coverage: Coverage) -> dict[str, Hit]:
        """The standing instructions to return, by chunk id: the log holds them live, they
        clear the floor, and their turns fit the budget (then counted in it)."""
        near = {c.chunk_id: c for c in rules if c.stored and c.score >= STANDING_MIN_SCORE}
        live = self.selector.verified({cid: c.stored for cid, c in near.items() if c.stored}, audit)
        given: dict[str, Hit] = {}
        most = STANDING_TOP_K
        if coverage.budget:  # a small budget keeps most of its turns for the hits
            most = min(most, max(1, coverage.budget // BUDGET_TURNS_PER_RULE))
        for cid, c in near.items():
            stored = live.get(cid)
            if stored is None or len(given) >= most:
                continue
            new = coverage.new_turns(span_of(stored))
            if not new or not coverage.fits(new):
                continue
            coverage.turns.update(new)
            given[cid] = Hit(cid, c.score, stored.record.text, stored.record.metadata)
        return given
