"""Late window hits narrowed to the turns that bear on the query.

Short chat turns are searched in windows of a few turns: a window carries the context a
single line lacks. Within a turn budget, though, a window costs all its turns, and the
evidence of a multi-hop question is spread over many windows that the budget cannot hold
whole. So, under a turn budget, the first hits are returned whole, and each later hit of
several turns gives only its `keep` turns nearest the query, by a vector per turn kept
in the store beside the window's (memsvc.domain.records.TurnLines): the window's token
states pooled over the turn's line, from the forward pass that embeds the window
(memsvc.embedding.parts), so it costs no model run and keeps the window's context. On
LoCoMo dev, within 20 turns (benchmarks/archive/2026-11-27.md): recall 0.792 -> 0.816,
multi-hop 0.487 -> 0.561, open-domain 0.504 -> 0.491 (its evidence needs the window's
context, which the first hits keep whole). A long turn is a unit of its own and is never
narrowed. An embedder that cannot pool parts (a remote server) keeps every hit whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memsvc.domain.records import StoredChunk

# Chosen on LoCoMo dev (the archive above): 2 or 4 whole hits first cost multi-hop recall,
# keeping 1 turn costs open-domain recall. That is within 20 turns; within 10, two whole
# hits found more on LoCoMo (e5 0.710 -> 0.719) and on one fact a turn (0.710 -> 0.736,
# above one vector per turn's 0.727), less on MemoryBank across languages
# (benchmarks/archive/2026-12-06.md).
# Whatever the count, a hit that no longer fits the budget whole gives the best of its turns
# that fit (memsvc.services.selection): within 5 turns two narrowed hits left one unused.
WHOLE_FIRST = 3
WHOLE_FIRST_UNDER_20 = 2
KEEP_TURNS = 2


def whole_first(budget: int) -> int:
    """How many first hits a search within `budget` turns (0: none) returns whole."""
    return WHOLE_FIRST_UNDER_20 if 0 < budget < 20 else WHOLE_FIRST


@dataclass(frozen=True)
class Narrowing:
    query: np.ndarray
    budget: int = 0  # the search's turn budget (0: none)
    whole_first: int = -1  # -1: whole_first(budget)
    keep: int = KEEP_TURNS

    def __post_init__(self) -> None:
        if self.whole_first < 0:
            object.__setattr__(self, "whole_first", whole_first(self.budget))

    def applies(self, picked: int, first: int, last: int) -> bool:
        """A hit picked after `picked` others, spanning turns first..last, is narrowed; so
        is a first one that would take over half the budget, starving every later hit (at
        5 turns, one window of 4: benchmarks/archive/2026-12-04.md)."""
        if not self._wider(first, last):
            return False
        over_half = self.budget and (last - first + 1) * 2 > self.budget
        return picked >= self.whole_first or bool(over_half)

    def reads_lines(self, stored: StoredChunk) -> bool:
        """Whether `stored` lacks turn lines it may have: a record kept from a read
        without them (memsvc.services.recent_records) must be read again to be narrowed."""
        span = stored.record.metadata.turn_range
        return stored.turn_lines is None and self._wider(span.start, span.end)

    def _wider(self, first: int, last: int) -> bool:
        """Whether turns first..last are more than a narrowed hit keeps."""
        return last - first + 1 > self.keep

    def turns(self, stored: StoredChunk, keep: int = 0) -> tuple[int, ...] | None:
        """The hit's `keep` (by default `self.keep`) turns nearest the query, in turn order;
        None: all (its store row has no turn lines: one turn, or written before schema 4)."""
        keep = keep or self.keep
        lines = stored.turn_lines
        if lines is None or len(lines.turn_ids) <= keep:
            return None
        scores = lines.vectors @ np.asarray(self.query, dtype=np.float32)
        best = sorted(range(len(lines.turn_ids)), key=lambda i: (-float(scores[i]), i))
        return tuple(sorted(lines.turn_ids[i] for i in best[:keep]))
