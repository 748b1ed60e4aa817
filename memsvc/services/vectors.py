"""The vectors of chunk records, as memsvc.domain.vectors defines them, through the
embedding cache: the model runs only on texts it has not embedded before.

A purge forgets the cached vectors of every text derived from a purged turn. A write that
was embedding while a purge ran would put such a vector back after the purge forgot it:
each purge advances the log's erasure epoch, and vectors cached by a call that began
before the epoch moved are forgotten again (their texts may be the purged ones)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from memsvc.domain.chunking import ChunkPolicy, ChunkWindow, StoredTurn, turn_windows
from memsvc.domain.hashing import text_hash
from memsvc.domain.records import EventRow, TurnLines
from memsvc.domain.types import REASON_MISMATCH, ChunkRecord, RecordError
from memsvc.domain.vectors import combine, vector_texts
from memsvc.observability import metrics
from memsvc.ports import Embedder, EmbeddingCache, EventLog, PartPooling
from memsvc.services.narrowing import KEEP_TURNS

# Log meta key: advanced by every purge in its own transaction.
ERASURE_EPOCH = "erasure_epoch"


class ChunkVectors:
    def __init__(
        self, log: EventLog, embedder: Embedder, cache: EmbeddingCache, policy: ChunkPolicy
    ) -> None:
        self.log = log
        self.embedder = embedder
        self.cache = cache
        self.policy = policy

    def erasure_epoch(self) -> str:
        """Read before the records' authorship is checked; passed to `of`."""
        with self.log.snapshot() as r:
            return r.get_meta(ERASURE_EPOCH) or "0"

    def of(
        self, records: Sequence[ChunkRecord], errors: list[RecordError], epoch: str | None = None
    ) -> dict[str, np.ndarray]:
        """Each record's vector by chunk id. A chunk of one turn is made from the turn in
        the log, and only while the log's turn is still the one the layout planned it
        from (its source hash): one edited since is a `mismatch` error, to be built again.
        `epoch`: the erasure epoch from before the records were checked against the log."""
        epoch = epoch if epoch is not None else self.erasure_epoch()
        inputs = self._inputs(records, errors)
        by_text = self._embed_since(inputs.values(), epoch)
        return {cid: combine([by_text[t] for t in parts]) for cid, parts in inputs.items()}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return embed_passages_cached(self.embedder, self.cache, texts)

    def turn_lines(
        self, records: Sequence[ChunkRecord], epoch: str | None = None
    ) -> dict[str, TurnLines]:
        """The turn lines of each record that spans more turns than a narrowed hit keeps
        (memsvc.services.narrowing): its live turns' cleaned texts from the log, found in
        order in the record's text, each turn's vector pooled from the forward pass that
        embeds the record (memsvc.embedding.parts; cached with the record's vector, which
        `of` then finds in the cache). A record whose turns are not all found in its text
        (edited since it was built), or whose embedder cannot pool parts (a remote server),
        gets none: it is returned whole."""
        if not isinstance(self.embedder, PartPooling):
            return {}
        epoch = epoch if epoch is not None else self.erasure_epoch()
        multi: dict[str, list[ChunkRecord]] = {}
        for r in records:
            m = r.metadata
            if m.turn_range.end - m.turn_range.start + 1 > KEEP_TURNS:
                multi.setdefault(m.conversation_id, []).append(r)
        if not multi:
            return {}
        with self.log.snapshot() as view:
            events = {conv: view.events(conv, _turn_ids(rs)) for conv, rs in multi.items()}
        planned: dict[str, tuple[tuple[int, ...], tuple[int, ...], str]] = {}
        derived: dict[str, set[tuple[str, int, int]]] = {}
        for conv, rs in multi.items():
            for r in rs:
                span = range(r.metadata.turn_range.start, r.metadata.turn_range.end + 1)
                turns = [events[conv][t] for t in span if t in events[conv]]
                turns = [e for e in turns if not e.deleted and e.clean_text]
                starts = line_starts(r.text, [e.clean_text for e in turns])
                if len(turns) <= KEEP_TURNS or starts is None:
                    continue
                planned[r.chunk_id] = (tuple(e.turn_id for e in turns), starts, r.text)
                first, last = r.metadata.turn_range.start, r.metadata.turn_range.end
                derived.setdefault(conv, set()).update(
                    (h, first, last) for h in part_hashes(r.text, starts)
                )
        if not planned:
            return {}
        self._record_derived(derived)
        pooled = self._parts_since(self.embedder, [(t, s) for _, s, t in planned.values()], epoch)
        return {
            cid: TurnLines(ids, starts, parts)
            for (cid, (ids, starts, _)), parts in zip(planned.items(), pooled, strict=True)
            if parts is not None
        }

    def _inputs(
        self, records: Sequence[ChunkRecord], errors: list[RecordError]
    ) -> dict[str, tuple[str, ...]]:
        inputs: dict[str, tuple[str, ...]] = {}
        single: dict[str, list[ChunkRecord]] = {}
        for r in records:
            m = r.metadata
            if m.turn_range.start == m.turn_range.end:
                single.setdefault(m.conversation_id, []).append(r)
            else:
                inputs[r.chunk_id] = (r.text,)
        if not single:
            return inputs
        with self.log.snapshot() as view:
            planned = view.layout_rows([r.chunk_id for rs in single.values() for r in rs])
            events = {
                conv: view.events(conv, {r.metadata.turn_range.start for r in rs})
                for conv, rs in single.items()
            }
        derived: dict[str, set[tuple[str, int, int]]] = {}
        for conv, rs in single.items():
            windows: dict[str, tuple[ChunkWindow, int]] = {}
            for event in events[conv].values():
                if event.deleted:
                    continue
                for w in turn_windows(_stored(event), self.policy, self.embedder.count_tokens):
                    for version in {r.metadata.chunk_version for r in rs}:
                        windows[w.chunk_id(conv, version)] = (w, version)
            for r in rs:
                found = windows.get(r.chunk_id)
                row = planned.get(r.chunk_id)
                if (
                    found is None
                    or row is None
                    or found[0].source_hash(found[1], self.policy) != row.source_hash
                ):
                    errors.append(
                        RecordError(
                            r.chunk_id,
                            "stale: its turn changed since the chunk was built; build again"
                            " and upsert what the build returns",
                            REASON_MISMATCH,
                        )
                    )
                    continue
                texts = vector_texts(found[0], self.policy, self.embedder.count_tokens)
                inputs[r.chunk_id] = texts or (r.text,)
                turn = r.metadata.turn_range.start
                derived.setdefault(conv, set()).update(
                    (text_hash(t), turn, turn) for t in texts or ()
                )
        self._record_derived(derived)
        return inputs

    def _record_derived(self, derived: dict[str, set[tuple[str, int, int]]]) -> None:
        """Texts embedded from turns besides the chunks' own, recorded before any vector of
        them is cached: a purge of the turn then forgets them."""
        if derived:
            with self.log.transaction() as tx:
                for conv, rows in derived.items():
                    tx.record_texts(conv, sorted(rows))

    def _parts_since(
        self, pooling: PartPooling, windows: Sequence[tuple[str, tuple[int, ...]]], epoch: str
    ) -> list[np.ndarray | None]:
        """The parts' vectors of each (text, part starts), from the cache or from one forward
        pass of the text, whose vector is cached too. The purge fence of `_embed_since`."""
        key = self.embedder.identity.cache_key
        keys = [part_hashes(text, starts) for text, starts in windows]
        cached = self.cache.get_many(key, [h for hs in keys for h in hs])
        missing = [i for i, hs in enumerate(keys) if any(h not in cached for h in hs)]
        fresh: dict[str, np.ndarray] = {}
        if missing:
            texts = [windows[i][0] for i in missing]
            vectors, parts = pooling.encode_passage_parts(texts, [windows[i][1] for i in missing])
            fresh.update(zip((text_hash(t) for t in texts), vectors, strict=True))
            for i, got in zip(missing, parts, strict=True):
                if got is not None:
                    fresh.update(zip(keys[i], got, strict=True))
            self.cache.put_many(key, fresh)
            cached.update(fresh)
            if self.erasure_epoch() != epoch:
                self.cache.forget(list(fresh))
        return [
            np.stack([cached[h] for h in hs]) if all(h in cached for h in hs) else None
            for hs in keys
        ]

    def _embed_since(self, groups: Iterable[Sequence[str]], epoch: str) -> dict[str, np.ndarray]:
        """The vector of each text of `groups`, each embedded once through the cache. If a
        purge ran meanwhile (the erasure epoch moved), the vectors this call cached are
        forgotten again: their texts may be the purged ones."""
        texts = list(dict.fromkeys(t for group in groups for t in group))
        vectors, fresh = _embed_cached(self.embedder, self.cache, texts)
        if fresh and self.erasure_epoch() != epoch:
            self.cache.forget(fresh)
        return dict(zip(texts, vectors, strict=True))


def part_hashes(text: str, starts: Sequence[int]) -> list[str]:
    """The embedding cache's keys of a text's parts' vectors (recorded for purge with the
    turns of the text, like any text derived from them)."""
    layout = ",".join(map(str, starts))
    return [text_hash(f"\x00part {i} of {layout}\x00{text}") for i in range(len(starts))]


def _turn_ids(records: Sequence[ChunkRecord]) -> set[int]:
    spans = [r.metadata.turn_range for r in records]
    return {t for span in spans for t in range(span.start, span.end + 1)}


def line_starts(text: str, turn_texts: Sequence[str]) -> tuple[int, ...] | None:
    """Where the line of each turn starts in a chunk's text (prefix line, then one line
    per turn, "label: text"), found in order; None when one is not there."""
    starts: list[int] = []
    at = text.find("\n") + 1
    if not at:
        return None
    for t in turn_texts:
        found = text.find(t, at)
        if found < 0:
            return None
        start = text.rfind("\n", 0, found) + 1
        if start < at:
            return None
        starts.append(start)
        at = found + len(t)
    return tuple(starts)


def _stored(event: EventRow) -> StoredTurn:
    return StoredTurn(
        turn_id=event.turn_id,
        speaker=event.speaker,
        text=event.clean_text,
        timestamp=event.timestamp,
        participants=event.participants,
        speaker_name=event.speaker_name,
        tokens=event.tokens,
    )


def embed_passages_cached(
    embedder: Embedder, cache: EmbeddingCache, texts: Sequence[str]
) -> np.ndarray:
    """Vectors for `texts`, running the model only on texts the cache has not seen."""
    return _embed_cached(embedder, cache, texts)[0]


def _embed_cached(
    embedder: Embedder, cache: EmbeddingCache, texts: Sequence[str]
) -> tuple[np.ndarray, list[str]]:
    """Vectors for `texts`, and the hashes this call put in the cache."""
    hashes = [text_hash(t) for t in texts]
    cached = cache.get_many(embedder.identity.cache_key, hashes)
    missing = list(dict.fromkeys(h for h in hashes if h not in cached))
    metrics.CACHE_LOOKUPS.labels("hit").inc(len(hashes) - len(missing))
    metrics.CACHE_LOOKUPS.labels("miss").inc(len(missing))
    if missing:
        by_hash = {h: t for h, t in zip(hashes, texts, strict=True)}
        vectors = embedder.encode_passages([by_hash[h] for h in missing])
        fresh = dict(zip(missing, vectors, strict=True))
        cache.put_many(embedder.identity.cache_key, fresh)
        cached.update(fresh)
    out = np.zeros((len(texts), embedder.dim), dtype=np.float32)
    for i, h in enumerate(hashes):
        out[i] = cached[h]
    return out, missing
