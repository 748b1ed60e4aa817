"""Which words of a query a text contains, as a reader would highlight them (a search's
explanation). An approximation of the keyword analyzer (jieba words, lower-cased, English
stemmed), without the analyzer: a query word matches a text word that equals it or shares
its stem, and a Chinese query matches by its two-character pieces. Very common English
words are left out: they match nearly every text and explain nothing."""

from __future__ import annotations

import re

_WORD = re.compile(r"[^\W\d_]+|\d+", re.UNICODE)
_CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
# English suffixes the Snowball stemmer removes most often, longest first.
_SUFFIXES = ("ations", "ation", "ings", "ing", "ies", "ied", "ed", "es", "ly", "s")
_COMMON = frozenset(
    "a an and are as at be but by can did do does for from had has have he her his how i if"
    " in is it its me my no not of on or our she so than that the their them then there they"
    " this to was we were what when where which who why will with would you your".split()
)


def stem(word: str) -> str:
    """A light English stem: enough to match "paints", "painted" and "painting"."""
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _latin_words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(_CJK_RUN.sub(" ", text))]


def matched_terms(query: str, text: str) -> tuple[str, ...]:
    """The query's words found in `text`, lower-cased, each once, in query order."""
    words = _latin_words(text)
    exact, stems = set(words), {stem(w) for w in words}
    found: list[str] = []
    for word in _latin_words(query):
        if word in _COMMON or word in found:
            continue
        if word in exact or stem(word) in stems:
            found.append(word)
    for run in _CJK_RUN.findall(query):
        pieces = [run] if len(run) < 2 else [run[i : i + 2] for i in range(len(run) - 1)]
        for piece in pieces:
            if piece in text and piece not in found:
                found.append(piece)
    return tuple(found)
