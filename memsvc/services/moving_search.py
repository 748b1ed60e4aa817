"""Searches during a model move (memsvc.services.model_move): each conversation is searched
where it is whole, the previous collection (with its own model) until its rebuild is done,
the new collection after; without a move, the search service alone.

A search naming conversations asks each collection for its own; one that does not (a
tenant's, everyone's) asks both and keeps of each the hits of its conversations. Merged
hits are ordered by score and cut to the request's top_k and turn budget again: fused
scores of both lists lie in [0, 1] in either collection, a dense search's cosines are the
model's own (the two models' differ in range), so a ranking across the two is approximate
while the move lasts, and exact again once it ends."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import structlog

from memsvc.domain import validation
from memsvc.domain.access import FULL, Access
from memsvc.domain.errors import MemsvcError, StoreUnavailable
from memsvc.domain.types import Hit, SearchMode, SearchRequest, SearchResult
from memsvc.services.model_move import ModelMove
from memsvc.services.search import SearchService, SearchTuning, in_order
from memsvc.services.standing_rules import STANDING_TOP_K

log = structlog.get_logger(__name__)


class MovingSearch:
    """SearchService's calls, routed by a move while one lasts."""

    def __init__(
        self,
        current: SearchService,
        move: ModelMove | None = None,
        previous: SearchService | None = None,
    ) -> None:
        self.current = current
        self.move = move
        self.previous = previous

    @property
    def tuning(self) -> SearchTuning:
        return self.current.tuning

    # the embedding calls are the serving model's
    def embed_query(self, query: str) -> np.ndarray:
        return self.current.embed_query(query)

    def embed_batch(
        self,
        texts: Sequence[str],
        is_query: bool,
        caller_waiting: Callable[[], bool] = lambda: True,
    ) -> np.ndarray:
        return self.current.embed_batch(texts, is_query, caller_waiting)

    def close(self) -> None:
        self.current.close()
        if self.previous is not None:
            self.previous.close()

    def end_move(self) -> None:
        """The move is done: the new collection answers alone."""
        previous, self.previous = self.previous, None
        if previous is not None:
            previous.close()

    def search(self, req: SearchRequest, access: Access = FULL) -> SearchResult:
        move, previous = self.move, self.previous
        if move is None or previous is None or not move.active:
            return self.current.search(req, access)
        named = validation.search_filters(req.filters).conversation_ids
        if named:
            unmoved = move.unmoved(list(named))
            if not unmoved:
                return self.current.search(req, access)
            if len(unmoved) == len(set(named)):
                return self._previous(previous, req, access)
            rebuilt = [c for c in named if c not in unmoved]
            ours = self.current.search(_only(req, rebuilt), access)
            theirs = self._previous(previous, _only(req, sorted(unmoved)), access)
            return _merged(req, ours, theirs.hits, theirs.standing)
        ours = self.current.search(req, access)
        theirs = self._previous(previous, req, access)
        convs = [h.metadata.conversation_id for h in ours.hits + theirs.hits]
        convs += [h.metadata.conversation_id for h in ours.standing + theirs.standing]
        unmoved = move.unmoved(sorted(set(convs)))

        def moved(hits: list[Hit]) -> list[Hit]:
            return [h for h in hits if h.metadata.conversation_id not in unmoved]

        def left(hits: list[Hit]) -> list[Hit]:
            return [h for h in hits if h.metadata.conversation_id in unmoved]

        ours = replace(ours, hits=moved(ours.hits), standing=moved(ours.standing))
        return _merged(req, ours, left(theirs.hits), left(theirs.standing))

    def _previous(
        self, previous: SearchService, req: SearchRequest, access: Access
    ) -> SearchResult:
        """The previous collection's answer: by keywords when its model could not load. A
        call that fails there is tried once more after opening the collection again (a
        restarted Milvus Lite process holds it unloaded); if that fails too, or the move
        ended meanwhile, the new collection answers alone."""
        move = self.move
        assert move is not None
        if not move.previous_model_serves:
            req = replace(req, mode=SearchMode.KEYWORD)
        try:
            return previous.search(req, access)
        except StoreUnavailable as exc:
            failure: Exception = exc
        except MemsvcError:  # the request's own error: the same in either collection
            raise
        except Exception as exc:  # Milvus's own (a collection not loaded, or dropped)
            failure = exc
        log.warning("previous_collection_search_failed", error=str(failure)[:300])
        if move.previous.reopen():
            return previous.search(req, access)
        move.check()
        return self.current.search(req, access)


def _only(req: SearchRequest, conversation_ids: list[str]) -> SearchRequest:
    return replace(req, filters=replace(req.filters, conversation_ids=tuple(conversation_ids)))


def _merged(
    req: SearchRequest, ours: SearchResult, hits: list[Hit], standing: list[Hit]
) -> SearchResult:
    """Both answers' hits by score, within the request's top_k and turn budget."""
    ranked = sorted(ours.hits + hits, key=lambda h: -h.score)
    kept: list[Hit] = []
    budget = req.turn_budget
    used = sum(_turns(h) for h in ours.standing + standing) if budget else 0
    for h in ranked:
        if len(kept) >= ours.top_k:
            break
        if budget and used + _turns(h) > budget:
            continue
        used += _turns(h)
        kept.append(h)
    rules = sorted(ours.standing + standing, key=lambda h: -h.score)[:STANDING_TOP_K]
    return replace(ours, hits=in_order(kept, req.order), standing=rules)


def _turns(hit: Hit) -> int:
    if hit.turns:
        return len(hit.turns)
    return hit.metadata.turn_range.end - hit.metadata.turn_range.start + 1
