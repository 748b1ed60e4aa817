"""The read path: query embedding, dense / keyword / hybrid search, dedup and MMR.

Scores (higher = more similar, comparable within one response):
- dense: cosine similarity of query and chunk vectors, in [-1, 1].
- keyword: BM25 score of the chunk text for the query, >= 0, unbounded; its statistics are
  the tenants' the search spans (memsvc.domain.bm25).
- hybrid (score fusion, the default): sum over the dense and keyword lists of
  w * score / best score of that list (0 for a list the chunk is not in), divided by the
  sum of the weights, so a chunk best in both lists scores 1.0.
- hybrid with MEMSVC_SEARCH_FUSION=rrf: reciprocal-rank fusion, sum of w / (60 + rank),
  divided by the sum of the weights over 61 (rank 1 in both lists scores 1.0).
With MMR the selection changes, the scores do not: hits stay sorted by score (or by
time, when the request asks for time order).

Beside the hits, a search returns the standing instructions and preferences that apply
(chunks tagged `instruction`, memsvc.domain.standing): the best few by cosine with the
query, above a floor. They are a list of their own rather than a boost: a rule is about
how to answer, not about the topic asked, so it ranks below the topic's turns however
relevant it is, and boosting every rule would push topic turns out of the budget for
queries no rule governs (benchmarks/archive/2026-11-25.md, Retrieval v3).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from memsvc.domain import bm25, validation
from memsvc.domain.access import FULL, Access
from memsvc.domain.errors import Cancelled, InvalidArgument
from memsvc.domain.limits import MAX_BATCH_TEXTS, MAX_QUERY_CHARS, MAX_TOP_K, MAX_TURN_BUDGET
from memsvc.domain.records import Candidate, Scored, StoredChunk
from memsvc.domain.standing import INSTRUCTION_TAG
from memsvc.domain.terms import matched_terms
from memsvc.domain.types import (
    Explanation,
    Hit,
    SearchMode,
    SearchOrder,
    SearchRequest,
    SearchResult,
)
from memsvc.observability.metrics import stage
from memsvc.ports import ChunkStore, Embedder, EventLog, PartPooling, QueryEncoder, SearchScope
from memsvc.services.fusion import (
    UNRELATED_TEXTS,
    dedup_text,
    mmr_select,
    rrf_fuse,
    score_fuse,
    unrelated_similarity,
)
from memsvc.services.narrowing import Narrowing
from memsvc.services.recent_records import RecentRecords
from memsvc.services.selection import Coverage, HitSelector, within
from memsvc.services.standing_rules import STANDING_TOP_K, StandingRules

DEFAULT_TOP_K = 6
# Candidates per list in hybrid mode. A chunk missing from one list gets nothing from it,
# so the pool should hold most of a conversation's chunks: on LoCoMo dev (~270 chunks a
# conversation) recall within 20 turns was 0.745 / 0.774 / 0.791 with 40 / 100 / 300.
# Candidates are ids and scores only: ~1 ms more per search than 40.
HYBRID_POOL = 300
# Candidates MMR chooses from (their vectors are read).
MMR_POOL = 40


class Fusion(StrEnum):
    SCORE = "score"
    RRF = "rrf"


@dataclass(frozen=True)
class SearchTuning:
    default_mode: SearchMode = SearchMode.HYBRID
    dense_weight: float = 1.0
    keyword_weight: float = 1.0
    fusion: Fusion = Fusion.SCORE


class SearchService:
    def __init__(
        self,
        store: ChunkStore,
        log: EventLog,
        embedder: Embedder,
        queries: QueryEncoder,
        tuning: SearchTuning,
        recent: RecentRecords,
    ) -> None:
        self.store = store
        self.log = log
        self.embedder = embedder
        self.tuning = tuning
        self.queries = queries
        self.selector = HitSelector(store, log, recent)
        self.standing = StandingRules(log, self.selector)
        # Turn lines are written only by an embedder that pools parts: with any other,
        # a window has none, and asking for them would only read it again on each search.
        self._pools_parts = isinstance(embedder, PartPooling)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="keyword")
        self._unrelated_score: float | None = None

    def _unrelated(self) -> float:
        """The model's cosine of unrelated texts (memsvc.services.fusion), measured at the
        first hybrid search: the floor of the dense list's scores in score fusion."""
        if self._unrelated_score is None:
            texts = list(UNRELATED_TEXTS)
            self._unrelated_score = unrelated_similarity(
                self.embedder.encode_queries(texts), self.embedder.probe(texts)
            )
        return self._unrelated_score

    def close(self) -> None:
        self.queries.close()
        self._pool.shutdown(wait=False)

    # -- EmbedChunk / EmbedBatch --------------------------------------------------------
    def embed_query(self, query: str) -> np.ndarray:
        _check_query(query, "query")
        self._check_tokens([query], ["query"], is_query=True)
        return self.queries.encode(query)

    def embed_batch(
        self,
        texts: Sequence[str],
        is_query: bool,
        caller_waiting: Callable[[], bool] = lambda: True,
    ) -> np.ndarray:
        """In slices of the model's batch size (memory bounded by one slice of 512-token
        texts), stopping between slices if the caller has gone."""
        if not texts:
            raise InvalidArgument("texts", "must not be empty")
        if len(texts) > MAX_BATCH_TEXTS:
            raise InvalidArgument("texts", f"at most {MAX_BATCH_TEXTS} texts per call")
        for i, t in enumerate(texts):
            _check_query(t, f"texts[{i}]")
        self._check_tokens(texts, [f"texts[{i}]" for i in range(len(texts))], is_query)
        step = self.embedder.batch_size
        parts = []
        for start in range(0, len(texts), step):
            if not caller_waiting():
                raise Cancelled(f"caller left after {start} of {len(texts)} texts")
            part = texts[start : start + step]
            parts.append(
                self.embedder.encode_queries(part)
                if is_query
                else self.embedder.encode_passages(part)
            )
        return np.concatenate(parts)

    def _check_tokens(self, texts: Sequence[str], fields: Sequence[str], is_query: bool) -> None:
        """Refuse (never truncate) what the model cannot read whole."""
        info = self.embedder.info
        prefix = (info.query_instruction or "") if is_query else ""
        limit = info.max_tokens - info.special_tokens
        # A WordPiece/BPE token covers at least one character: short texts need no count.
        long = [
            (f, prefix + t) for f, t in zip(fields, texts, strict=True) if len(prefix + t) > limit
        ]
        if not long:
            return
        for (field, _), n in zip(
            long, self.embedder.count_tokens([t for _, t in long]), strict=True
        ):
            if n > limit:
                raise InvalidArgument(
                    field,
                    f"{n} model tokens{' with the query instruction' if prefix else ''};"
                    f" the model reads at most {limit}",
                )

    def _query_end(self, text: str, mode: SearchMode) -> str:
        """The end of `text` within MAX_QUERY_CHARS and (unless keyword-only) the model's
        tokens, with the query instruction: the longest such end, found by halving."""
        end = _end_of(text, MAX_QUERY_CHARS)
        if mode is SearchMode.KEYWORD:
            return end
        info = self.embedder.info
        prefix = info.query_instruction or ""
        limit = info.max_tokens - info.special_tokens

        def fits(n: int) -> bool:
            tail = _end_of(end, n)
            return (
                len(prefix + tail) <= limit
                or self.embedder.count_tokens([prefix + tail])[0] <= limit
            )

        if fits(len(end)):
            return end
        low, high = 0, len(end)  # fits(low), not fits(high)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle) else (low, middle)
        return _end_of(end, low)

    # -- EmbedDb --------------------------------------------------------------------------
    def search(self, req: SearchRequest, access: Access = FULL) -> SearchResult:
        mode = req.mode or self.tuning.default_mode
        asked = req.query_text
        if req.keep_query_end:
            req = replace(req, query_text=self._query_end(asked, mode))
        _check_query(req.query_text, "query_text")
        scope = self._scope(req, access)
        if mode is not SearchMode.KEYWORD:
            self._check_tokens([req.query_text], ["query_text"], is_query=True)
        if req.top_k < 0 or req.top_k > MAX_TOP_K:
            raise InvalidArgument("top_k", f"must be 0 (= {DEFAULT_TOP_K}) to {MAX_TOP_K}")
        if not 0.0 <= req.mmr_lambda <= 1.0:
            raise InvalidArgument("mmr_lambda", "must be 0 (off) or in (0, 1]")
        if not 0 <= req.turn_budget <= MAX_TURN_BUDGET:
            raise InvalidArgument("turn_budget", f"must be 0 (none) to {MAX_TURN_BUDGET}")
        # A budget counts turns: unless the request also caps the hits, the budget does.
        top_k = req.top_k or (MAX_TOP_K if req.turn_budget else DEFAULT_TOP_K)
        audit = scope.filters.include_deleted
        # hits the search may return at most: a budget of n turns holds n hits at most
        most = min(top_k, req.turn_budget) if req.turn_budget else top_k
        if mode is SearchMode.HYBRID:
            pool = max(HYBRID_POOL, most * 4)
        elif req.mmr_lambda or req.turn_budget:
            pool = max(MMR_POOL, most * 4)  # room for hits passed over
        else:
            pool = most * 2  # room for identical texts
        pool = min(pool, 16_384)
        # Standing instructions need the query's vector, and are a list of their own only
        # when the filters do not ask for one kind of chunk already, and the log holds
        # some in scope: their search is a second store call, as long as the dense one.
        rules_scope = (
            self.standing.scope(scope)
            if req.standing and mode is not SearchMode.KEYWORD and not scope.filters.intent_tag
            else None
        )

        candidates: list[Candidate]
        rules: list[Candidate] = []
        dense: list[Candidate] = []
        keyword: list[Candidate] = []
        vector: np.ndarray | None = None
        if mode is SearchMode.HYBRID:
            # BM25 needs no vector: run it while the query is being embedded (in this call's
            # context: its stage is a span of this call's trace when tracing is on).
            keyword_future = self._pool.submit(
                contextvars.copy_context().run, self._keyword, req.query_text, scope, pool
            )
            # a few chunks in scope: every one in the dense list, whole (no read after it)
            whole = not req.turn_budget and not req.mmr_lambda and not audit
            whole = whole and self.selector.reads_whole(scope.filters.conversation_ids)
            dense, rules, vector = self._dense(
                req.query_text, scope, pool, whole, rules_scope=rules_scope
            )
            keyword = keyword_future.result()
            if whole:
                self.selector.recent.keep(c.stored for c in dense if c.stored is not None)
            weights = [self.tuning.dense_weight, self.tuning.keyword_weight]
            with stage("search", "fuse"):
                if self.tuning.fusion is Fusion.SCORE:
                    floors = [self._unrelated(), 0.0]
                    ranked = score_fuse([_scored(dense), _scored(keyword)], weights, floors)
                else:
                    ranked = rrf_fuse([_scored(dense), _scored(keyword)], weights)
            candidates = dense + keyword
        else:
            # A single list without MMR or a budget has few candidates: read their whole
            # records in the search itself, not in a second round trip after it.
            whole = not req.mmr_lambda and not req.turn_budget
            if mode is SearchMode.DENSE:
                candidates, rules, vector = self._dense(
                    req.query_text, scope, pool, whole, rules_scope=rules_scope
                )
                dense = candidates
            else:
                candidates = keyword = self._keyword(req.query_text, scope, pool, whole)
            ranked = _scored(candidates)
        coverage = Coverage(req.turn_budget)
        given = self.standing.given(rules, audit, coverage)
        ranked = [(cid, s) for cid, s in ranked if cid not in given]
        if req.mmr_lambda and len(ranked) > top_k:
            head = ranked[: max(MMR_POOL, top_k * 4)]
            with stage("search", "read"):
                ids, convs = [cid for cid, _ in head], scope.filters.conversation_ids
                read = self.store.get(ids, with_vectors=True, conversations=convs)
            records = self.selector.verified(read, audit)
            picked = mmr_select(dedup_text(head, records), records, len(head), req.mmr_lambda)
            top = within(picked, records, coverage)[:top_k]
            top = sorted(top, key=lambda x: -x[1])
            narrowed: dict[str, tuple[int, ...]] = {}
        else:
            known = {c.chunk_id: c.stored for c in candidates if c.stored is not None}
            narrowing = None
            if req.turn_budget and vector is not None and self._narrows():
                narrowing = Narrowing(vector, req.turn_budget)
            top, records, narrowed = self.selector.top(
                ranked, top_k, known, audit, coverage, narrowing
            )
        hits = in_order([_hit(cid, score, records[cid], narrowed) for cid, score in top], req.order)
        standing_hits = list(given.values())
        if req.explain:
            hits = _explained(hits, req.query_text, dense, keyword)
            standing_hits = _explained(standing_hits, req.query_text, rules, [])
        cut = len(asked) - len(req.query_text)
        unrelated = self._unrelated() if req.explain else 0.0
        return SearchResult(mode, top_k, hits, standing_hits, req.query_text, cut, unrelated)

    def _narrows(self) -> bool:
        """Whether late window hits under a turn budget give their nearest turns
        (memsvc.services.narrowing): only where the store keeps turn lines and the
        embedder writes them."""
        return self._pools_parts and self.store.keeps_turn_lines

    def _dense(
        self,
        query: str,
        scope: SearchScope,
        pool: int,
        whole: bool = False,
        *,
        rules_scope: SearchScope | None = None,
    ) -> tuple[list[Candidate], list[Candidate], np.ndarray]:
        """The dense list, the standing instructions nearest the query (looked for in
        `rules_scope`, if any: `StandingRules.scope`), and the query's vector."""
        with stage("search", "embed"):
            vector = self.queries.encode(query)
        rules = None
        if rules_scope is not None:
            only_rules = replace(
                rules_scope, filters=replace(rules_scope.filters, intent_tag=INSTRUCTION_TAG)
            )
            rules = self._pool.submit(
                self.store.search_dense, vector, only_rules, STANDING_TOP_K * 2, True
            )
        with stage("search", "dense"):
            found = self.store.search_dense(vector, scope, pool, whole)
        return found, (rules.result() if rules is not None else []), vector

    def _keyword(
        self, query: str, scope: SearchScope, pool: int, whole: bool = False
    ) -> list[Candidate]:
        with stage("search", "keyword"):
            return self.store.search_keyword(self._keyword_query(query, scope), scope, pool, whole)

    def _keyword_query(self, text: str, scope: SearchScope) -> bm25.KeywordQuery:
        """The query's term weights: IDF over the tenants the search spans, so no other
        tenant's texts move its scores."""
        counts = bm25.term_counts(text) if self.store.weighs_keywords else {}
        if not counts:
            return bm25.KeywordQuery(text, {})
        tenants = bm25.tenants_of(scope.filters.conversation_ids, scope.prefixes)
        with self.log.snapshot() as r:
            documents, frequencies = r.term_frequencies(tenants, list(counts))
        return bm25.KeywordQuery(text, bm25.query_vector(counts, documents, frequencies))

    def _scope(self, req: SearchRequest, access: Access) -> SearchScope:
        """The filters in normal form, within what the token may read: its prefixes when it
        names no conversation (limited tokens) and deleted chunks for admins only. A store
        that does not mark each conversation's current chunks gets the version map."""
        f = validation.search_filters(req.filters)
        access.check_all(f.conversation_ids, "filters.conversation_ids")
        if not f.conversation_ids:
            access.every_conversation("EmbedDb")
        if f.include_deleted:
            access.need_admin("reading deleted chunks", "filters.include_deleted")
        prefixes = () if f.conversation_ids else access.prefixes
        if f.chunk_version or self.store.marks_current:
            return SearchScope(f, prefixes)
        with self.log.snapshot() as r:
            return SearchScope(f, prefixes, r.active_versions_of_multi(f.conversation_ids))


def in_order(hits: list[Hit], order: SearchOrder) -> list[Hit]:
    """Hits as ranked, or in conversation time order (oldest or newest first)."""
    if order is SearchOrder.RELEVANCE:
        return hits

    def when(h: Hit) -> tuple[str, str, int]:
        m = h.metadata
        return (m.timestamp_range.start, m.conversation_id, m.turn_range.start)

    return sorted(hits, key=when, reverse=order is SearchOrder.NEWEST)


def _explained(
    hits: Sequence[Hit], query: str, dense: Sequence[Candidate], keyword: Sequence[Candidate]
) -> list[Hit]:
    """The hits with their places in the candidate lists the search ranked them from."""
    dense_at = {c.chunk_id: (rank, c.score) for rank, c in enumerate(dense, 1)}
    keyword_at = {c.chunk_id: (rank, c.score) for rank, c in enumerate(keyword, 1)}
    out = []
    for h in hits:
        d_rank, d_score = dense_at.get(h.chunk_id, (0, 0.0))
        k_rank, k_score = keyword_at.get(h.chunk_id, (0, 0.0))
        why = Explanation(d_rank, d_score, k_rank, k_score, h.score, matched_terms(query, h.text))
        out.append(replace(h, explanation=why))
    return out


def _hit(
    cid: str, score: float, stored: StoredChunk, narrowed: Mapping[str, tuple[int, ...]]
) -> Hit:
    record, kept = stored.record, narrowed.get(cid)
    if kept is None or stored.turn_lines is None:
        return Hit(cid, score, record.text, record.metadata)
    text = stored.turn_lines.text_of(record.text, kept)
    return Hit(cid, score, text, record.metadata, turns=kept)


def _scored(candidates: Sequence[Candidate]) -> list[Scored]:
    return [(c.chunk_id, c.score) for c in candidates]


def _end_of(text: str, n: int) -> str:
    """The last `n` characters of `text` or fewer: from a word's start where one begins
    within 32 characters of the cut (text without spaces, Chinese, is cut anywhere)."""
    if len(text) <= n:
        return text
    tail = text[len(text) - n :]
    space = next((i for i, ch in enumerate(tail[:32]) if ch.isspace()), None)
    return tail if space is None else tail[space:].lstrip()


def _check_query(text: str, field: str) -> None:
    if not text.strip():
        raise InvalidArgument(field, "must not be empty")
    if len(text) > MAX_QUERY_CHARS:
        raise InvalidArgument(field, f"longer than {MAX_QUERY_CHARS} characters")
