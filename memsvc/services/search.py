"""The read path: query embedding, dense / keyword / hybrid search, dedup and MMR.

Scores (higher = more similar, comparable within one response):
- dense: cosine similarity of query and chunk vectors, in [-1, 1].
- keyword: Milvus BM25 score of the chunk text for the query, >= 0, unbounded.
- hybrid (score fusion, the default): sum over the dense and keyword lists of
  w * score / best score of that list (0 for a list the chunk is not in), divided by the
  sum of the weights, so a chunk best in both lists scores 1.0.
- hybrid with MEMSVC_SEARCH_FUSION=rrf: reciprocal-rank fusion, sum of w / (60 + rank),
  divided by the sum of the weights over 61 (rank 1 in both lists scores 1.0).
With MMR the selection changes, the scores do not: hits stay sorted by score.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from memsvc.domain import validation
from memsvc.domain.access import FULL, Access
from memsvc.domain.errors import Cancelled, InvalidArgument
from memsvc.domain.hashing import text_hash
from memsvc.domain.limits import MAX_BATCH_TEXTS, MAX_QUERY_CHARS, MAX_TOP_K
from memsvc.domain.records import Candidate, Scored, StoredChunk
from memsvc.domain.types import Hit, SearchMode, SearchRequest
from memsvc.observability.metrics import stage
from memsvc.ports import ChunkStore, Embedder, EventLog, LogReader, QueryEncoder, SearchScope
from memsvc.services.fusion import dedup_text, mmr_select, rrf_fuse, score_fuse
from memsvc.services.recent_records import RecentRecords

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
        self.recent = recent
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="keyword")

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

    # -- EmbedDb --------------------------------------------------------------------------
    def search(
        self, req: SearchRequest, access: Access = FULL
    ) -> tuple[SearchMode, int, list[Hit]]:
        _check_query(req.query_text, "query_text")
        scope = self._scope(req, access)
        mode = req.mode or self.tuning.default_mode
        if mode is not SearchMode.KEYWORD:
            self._check_tokens([req.query_text], ["query_text"], is_query=True)
        if req.top_k < 0 or req.top_k > MAX_TOP_K:
            raise InvalidArgument("top_k", f"must be 0 (= {DEFAULT_TOP_K}) to {MAX_TOP_K}")
        if not 0.0 <= req.mmr_lambda <= 1.0:
            raise InvalidArgument("mmr_lambda", "must be 0 (off) or in (0, 1]")
        top_k = req.top_k or DEFAULT_TOP_K
        audit = scope.filters.include_deleted
        if mode is SearchMode.HYBRID:
            pool = max(HYBRID_POOL, top_k * 4)
        elif req.mmr_lambda:
            pool = max(MMR_POOL, top_k * 4)
        else:
            pool = top_k * 2  # room for identical texts
        pool = min(pool, 16_384)

        candidates: list[Candidate]
        if mode is SearchMode.HYBRID:
            # BM25 needs no vector: run it while the query is being embedded.
            keyword_future = self._pool.submit(self._keyword, req.query_text, scope, pool)
            dense = self._dense(req.query_text, scope, pool)
            keyword = keyword_future.result()
            fuse = score_fuse if self.tuning.fusion is Fusion.SCORE else rrf_fuse
            with stage("search", "fuse"):
                ranked = fuse(
                    [_scored(dense), _scored(keyword)],
                    [self.tuning.dense_weight, self.tuning.keyword_weight],
                )
            candidates = dense + keyword
        else:
            # A single list without MMR has few candidates: read their whole records in
            # the search itself, not in a second round trip after it.
            whole = not req.mmr_lambda
            if mode is SearchMode.DENSE:
                candidates = self._dense(req.query_text, scope, pool, whole)
            else:
                candidates = self._keyword(req.query_text, scope, pool, whole)
            ranked = _scored(candidates)
        if req.mmr_lambda and len(ranked) > top_k:
            head = ranked[: max(MMR_POOL, top_k * 4)]
            with stage("search", "read"):
                read = self.store.get([cid for cid, _ in head], with_vectors=True)
            records = self._verified(read, audit)
            picked = mmr_select(dedup_text(head, records), records, top_k, req.mmr_lambda)
            top = sorted(picked, key=lambda x: -x[1])
        else:
            known = {c.chunk_id: c.stored for c in candidates if c.stored is not None}
            # Read by the search, or recently with the same content hash: no second read.
            # The deleted flag is not in the hash: an audit reads what is stored now.
            hashes = {} if audit else {c.chunk_id: c.content_hash for c in candidates}
            top, records = self._top_unique(
                ranked, top_k, self._verified(known, audit), audit, hashes
            )
        hits = [
            Hit(cid, score, records[cid].record.text, records[cid].record.metadata)
            for cid, score in top
        ]
        return mode, top_k, hits

    def _dense(
        self, query: str, scope: SearchScope, pool: int, whole: bool = False
    ) -> list[Candidate]:
        with stage("search", "embed"):
            vector = self.queries.encode(query)
        with stage("search", "dense"):
            return self.store.search_dense(vector, scope, pool, whole)

    def _keyword(
        self, query: str, scope: SearchScope, pool: int, whole: bool = False
    ) -> list[Candidate]:
        with stage("search", "keyword"):
            return self.store.search_keyword(query, scope, pool, whole)

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

    def _verified(self, records: Mapping[str, StoredChunk], audit: bool) -> dict[str, StoredChunk]:
        """The records the log holds live now: a chunk of its layout with the same content
        (or a superseded tail awaiting removal). While a conversation's delete or purge is
        committed but not yet reconciled, its layout may predate it: then a chunk whose
        turn range holds a deleted turn is left out too. So what a crash or an outage left
        in the store is never returned, even before the recorded work repairs it. `audit`
        (include deleted) keeps the layout's deleted chunks too."""
        if not records:
            return {}
        with stage("search", "verify"):
            return self._verified_now(records, audit)

    def _verified_now(
        self, records: Mapping[str, StoredChunk], audit: bool
    ) -> dict[str, StoredChunk]:
        ids = list(records)
        convs = {s.record.metadata.conversation_id for s in records.values()}
        with self.log.snapshot() as r:
            layout = r.layout_rows(ids)
            waiting = r.waiting_superseded(ids)
            unsettled = _unsettled(r, convs)
            deleted = {
                c: r.deleted_turn_ids(c) for c in (_conversations_of(records, waiting) | unsettled)
            }
        out: dict[str, StoredChunk] = {}
        for cid, stored in records.items():
            row = layout.get(cid)
            m = stored.record.metadata
            if row is not None:
                known = row.content_hash == stored.content_hash and (audit or not row.deleted)
            else:
                known = cid in waiting
            if not known:
                continue
            # A superseded tail was never re-rendered: its range says what it holds.
            doubtful = row is None or m.conversation_id in unsettled
            turns = deleted.get(m.conversation_id, []) if doubtful else []
            if not audit and _span_holds(m.turn_range.start, m.turn_range.end, turns):
                continue
            out[cid] = stored
        return out

    def _top_unique(
        self,
        ranked: Sequence[Scored],
        top_k: int,
        known: Mapping[str, StoredChunk],
        audit: bool,
        hashes: Mapping[str, str],
    ) -> tuple[list[Scored], dict[str, StoredChunk]]:
        """The first `top_k` candidates with distinct texts, and their records. Records
        the search returned whole are `known`. The others are judged by the log first, in
        slices of 4 x top_k then twice as large each time: which are live with the content
        the search saw, and what text each holds (its layout's text hash). So only the hits
        are read, in one round trip unless texts repeat past the slice, never a copy of a
        text already kept (a greeting repeated in every conversation of an unscoped
        search): a read costs ~1 ms a round trip and ~0.05 ms a record, whatever the size
        of the store, and judging a few more ids in the log far less
        (benchmarks/RESULTS.md, Speed v4). A hit removed between the search
        and the read, or one the log cannot judge without its record (a superseded tail
        awaiting removal), is read and judged again, and the choice is made anew."""
        records: dict[str, StoredChunk] = dict(known)
        live: dict[str, str] = {}  # chunk id -> text hash, live in the log as searched
        judged: set[str] = set(known)
        text_of: dict[str, str] = {}
        start, size = 0, top_k * 4
        while True:
            top, unread = _pick(ranked[:start], top_k, records, live, judged, text_of)
            if unread:
                records.update(self._read(unread, hashes, live, audit))
                judged.update(unread)
                done = set(unread)
                live = {cid: h for cid, h in live.items() if cid not in done}
                continue
            if len(top) >= top_k or start >= len(ranked):
                return top, records
            part = [cid for cid, _ in ranked[start : start + size]]
            start, size = start + len(part), size * 2
            found, doubtful = self._live_in_log([c for c in part if c not in judged], hashes)
            live.update(found)
            judged.update(c for c in part if c not in doubtful)

    def _read(
        self, ids: Sequence[str], hashes: Mapping[str, str], live: Mapping[str, str], audit: bool
    ) -> dict[str, StoredChunk]:
        """The records of `ids` the log holds live. One with the content the log was just
        asked about needs no second look; any other is verified."""
        found = self.recent.take([(cid, hashes[cid]) for cid in ids if cid in hashes])
        unread = [cid for cid in ids if cid not in found]
        if unread:
            with stage("search", "read"):
                fresh = self.store.get(unread)
            self.recent.keep(fresh.values())
            found.update(fresh)
        checked = {
            cid: s for cid, s in found.items() if cid in live and s.content_hash == hashes[cid]
        }
        doubtful = {cid: s for cid, s in found.items() if cid not in checked}
        return checked | self._verified(doubtful, audit)

    def _live_in_log(
        self, ids: Sequence[str], hashes: Mapping[str, str]
    ) -> tuple[dict[str, str], set[str]]:
        """Of candidates with the content hashes the search returned: those the log holds
        live with that content (as `_verified_now` judges a record), with their text hash,
        and those it cannot judge without their records: a superseded tail awaiting
        removal, or a candidate without a hash (an audit: the deleted flag is outside the
        hash). The rest are not live."""
        hashed = [cid for cid in ids if hashes.get(cid)]
        doubtful = {cid for cid in ids if not hashes.get(cid)}
        if not hashed:
            return {}, doubtful
        with stage("search", "verify"), self.log.snapshot() as r:
            layout = r.layout_rows(hashed)
            doubtful |= r.waiting_superseded([cid for cid in hashed if cid not in layout])
            unsettled = _unsettled(r, {row.conversation_id for row in layout.values()})
            deleted = {c: r.deleted_turn_ids(c) for c in unsettled}
        live: dict[str, str] = {}
        for cid, row in layout.items():
            if row.deleted or row.content_hash != hashes[cid]:
                continue
            if _span_holds(row.start_turn, row.end_turn, deleted.get(row.conversation_id, [])):
                continue
            live[cid] = row.text_hash
        return live, doubtful


def _pick(
    ranked: Sequence[Scored],
    top_k: int,
    records: Mapping[str, StoredChunk],
    live: Mapping[str, str],
    judged: set[str],
    text_of: dict[str, str],
) -> tuple[list[Scored], list[str]]:
    """The best-ranked candidates with distinct texts, up to `top_k`, and the records still
    to be read before that choice is final: the picks the log holds live (known by their
    text hash, not yet read), and every candidate ranked before the last pick that the log
    could not judge (its text, once read, may come first)."""
    seen: set[str] = set()
    top: list[Scored] = []
    unread: list[str] = []
    for cid, score in ranked:
        if len(top) >= top_k:
            break
        stored = records.get(cid)
        if stored is not None:
            key = text_of.get(cid)
            if key is None:
                key = text_of[cid] = text_hash(stored.record.text)
        elif cid in live:
            key = live[cid]
        elif cid not in judged:
            unread.append(cid)
            continue
        else:
            continue  # not live, or gone since the search
        if key not in seen:
            seen.add(key)
            top.append((cid, score))
            if stored is None:
                unread.append(cid)
    return top, unread


def _unsettled(r: LogReader, conversation_ids: set[str]) -> set[str]:
    """Those whose delete or purge is committed but not yet reconciled: their layout may
    predate it, so a chunk's range is checked against their deleted turns."""
    rows = {c: r.conversation(c) for c in conversation_ids}
    return {c for c, conv in rows.items() if conv is not None and conv.needs_reconcile}


def _conversations_of(records: Mapping[str, StoredChunk], ids: set[str]) -> set[str]:
    return {records[cid].record.metadata.conversation_id for cid in ids if cid in records}


def _span_holds(start: int, end: int, sorted_turns: Sequence[int]) -> bool:
    i = bisect.bisect_left(sorted_turns, start)
    return i < len(sorted_turns) and sorted_turns[i] <= end


def _scored(candidates: Sequence[Candidate]) -> list[Scored]:
    return [(c.chunk_id, c.score) for c in candidates]


def _check_query(text: str, field: str) -> None:
    if not text.strip():
        raise InvalidArgument(field, "must not be empty")
    if len(text) > MAX_QUERY_CHARS:
        raise InvalidArgument(field, f"longer than {MAX_QUERY_CHARS} characters")
