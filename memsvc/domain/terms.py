"""The words of a text that match a query, as a reader would highlight them (a search's
explanation). An approximation of the keyword analyzer (jieba words, lower-cased, English
stemmed), without the analyzer: a text word matches a query word it equals or shares its
stem with, and a Chinese or Japanese query (scripts written without spaces) matches by its
two-character pieces. Both are read in NFKC, so a decomposed "Café" is "Café". Very common English
words are left out: they match nearly every text and explain nothing. The words come as
the text has them (lower-cased), so a page can mark them without stemming anything."""

from __future__ import annotations

import re
import unicodedata

_WORD = re.compile(r"[^\W\d_]+|\d+", re.UNICODE)
# Runs of scripts written without spaces between words: Han, hiragana and katakana. A Latin
# word inside one ("私はPythonで") is a word of its own.
_CJK_RUN = re.compile(
    r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]+"
)
# English suffixes the Snowball stemmer removes most often, longest first.
_SUFFIXES = ("ations", "ation", "ings", "ing", "ed", "es", "s")
_COMMON = frozenset(
    "a an and are as at be but by can did do does for from had has have he her his how i if"
    " in is it its me my no not of on or our she so than that the their them then there they"
    " this to was we were what when where which who why will with would you your".split()
)


def stem(word: str) -> str:
    """A light English stem: enough to match "paints", "painted" and "painting", or
    "library" and "libraries" (a final y becomes i, as Snowball has it)."""
    if word.endswith("y") and len(word) > 3:
        return word[:-1] + "i"
    if word.endswith(("ies", "ied")) and len(word) > 4:
        return word[:-3] + "i"
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _latin_words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(_CJK_RUN.sub(" ", text))]


def matched_terms(query: str, text: str) -> tuple[str, ...]:
    """The words of `text` that match a word of `query`, lower-cased, each once, in text
    order; then the query's Chinese and Japanese pieces that `text` holds."""
    query, text = unicodedata.normalize("NFKC", query), unicodedata.normalize("NFKC", text)
    asked = [w for w in _latin_words(query) if w not in _COMMON]
    exact, stems = set(asked), {stem(w) for w in asked}
    found: list[str] = []
    for word in _latin_words(text):
        if word in found or word in _COMMON:
            continue
        if word in exact or stem(word) in stems:
            found.append(word)
    for run in _CJK_RUN.findall(query):
        pieces = [run] if len(run) < 2 else [run[i : i + 2] for i in range(len(run) - 1)]
        for piece in pieces:
            if piece in text and piece not in found:
                found.append(piece)
    return tuple(found)
