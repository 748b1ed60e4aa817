"""Which events of a memsvc hit answer an ADK query, as InMemoryMemoryService matches
events (by the words they share with the query), and the similarity floor that keeps a hit
sharing no word (`memsvc_client.integrations.google_adk`'s docstring)."""

from __future__ import annotations

import re
import unicodedata

from memsvc_client.v1 import memory_pb2 as pb

# What memsvc's explanation calls a word (memsvc.domain.terms): a run of letters or of
# digits, scripts written without spaces (Han, kana) cut out, whose terms are pieces.
_WORD = re.compile(r"[^\W\d_]+|\d+")
_UNSPACED = re.compile(
    r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]+"
)


def holds(text: str, term: str) -> bool:
    """Whether `text` holds one of a hit's matched terms (lower-cased words as the text has
    them; for Chinese and Japanese, two-character pieces): a Latin word as a whole word,
    a piece anywhere."""
    text = unicodedata.normalize("NFKC", text).lower()
    if _UNSPACED.fullmatch(term):
        return term in text
    return term in _WORD.findall(_UNSPACED.sub(" ", text))


def answering(
    hit: pb.Hit, turns: list[pb.MemoryEvent], floor: float | None
) -> list[pb.MemoryEvent]:
    """The events of a hit (a chunk of several) that answer the query, as
    InMemoryMemoryService matches events: those holding a word the query shares with the
    hit, the most such words first (then in turn order). A hit kept by similarity alone
    gives all its events; so does a search without a floor."""
    terms = hit.explanation.matched_terms
    if floor is None or not terms:
        return turns
    counted = [(sum(holds(t.text, w) for w in terms), t) for t in turns]
    found = [(n, t) for n, t in counted if n]
    if not found:  # the words were in the chunk's context line only
        return turns if hit.explanation.dense_score >= floor else []
    return [t for _, t in sorted(found, key=lambda pair: -pair[0])]


def matches(hit: pb.Hit, floor: float | None) -> bool:
    """A hit shares a word with the query, or reaches the floor (None: every hit)."""
    why = hit.explanation
    return floor is None or bool(why.matched_terms) or why.dense_score >= floor
