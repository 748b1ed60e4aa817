"""The rule tables' quick search (memsvc.domain.quick_match) answers as their patterns do."""

from __future__ import annotations

import re
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from memsvc.domain.prefix import INTENT_RULES, classify_intent
from memsvc.domain.quick_match import CASE_EXCEPTIONS, QuickPattern
from memsvc.domain.standing import STANDING_RULE, is_standing

TABLES = [pattern for _, pattern in INTENT_RULES] + [STANDING_RULE]
# the same patterns minding case too: the literals are then looked for as written
RULES = TABLES + [re.compile(p.pattern, p.flags & ~re.IGNORECASE) for p in TABLES]
QUICK = [QuickPattern(pattern) for pattern in RULES]

# Pieces texts are made of: every rule's necessary literals, the rules' words with their
# neighbours, characters `re` folds to ASCII letters, and what lies between words.
_VOCABULARY = sorted(
    {a for q in QUICK for a in q.anchors or ()}
    | {w for p in RULES for w in re.findall(r"[A-Za-z']+|[\u4e00-\u9fff]+", p.pattern)}
)
_PIECES = st.one_of(
    st.sampled_from(_VOCABULARY),
    st.sampled_from(_VOCABULARY).map(str.upper),
    st.sampled_from(_VOCABULARY).map(str.title),
    st.sampled_from(sorted(CASE_EXCEPTIONS) + list(" \n\t.,;:!?？。！'-") + ["ing", "s", "I"]),
    st.text(max_size=4),
)
TEXTS = st.lists(_PIECES, max_size=24).map("".join)


@settings(max_examples=400)
@given(TEXTS)
def test_each_rule_answers_as_its_pattern(text: str) -> None:
    for pattern, quick in zip(RULES, QUICK, strict=True):
        expected = pattern.search(text) is not None
        assert quick.search(text) == expected, (pattern.pattern[:40], text)
        assert quick.search(text, text.lower()) == expected


@given(st.lists(TEXTS, min_size=1, max_size=3), st.lists(TEXTS, max_size=3))
def test_intent_and_rule_as_the_tables_say(user: list[str], other: list[str]) -> None:
    def by_table(texts: list[str]) -> str | None:
        joined = "\n".join(texts)
        return next((tag for tag, p in INTENT_RULES if joined and p.search(joined)), None)

    expected = by_table(user) or by_table(user + other) or "other"
    assert classify_intent(user, user + other) == expected
    for text in user:
        assert is_standing(text) == (STANDING_RULE.search(text) is not None)


def test_every_character_re_folds_to_an_ascii_letter_lowers_to_it_or_is_an_exception() -> None:
    # the quick test finds a letter in `str.lower()`; `re` ignoring case also takes these
    letters = re.compile("[a-z]", re.IGNORECASE)
    folding = {
        chr(cp)
        for cp in range(128, 0x110000)
        if letters.fullmatch(chr(cp)) and chr(cp).lower() not in string.ascii_lowercase
    }
    assert folding == CASE_EXCEPTIONS


def test_the_literals_found_and_where_none_is_necessary() -> None:
    assert QuickPattern(re.compile(r"\bmy (?:job|wife)\b", re.I)).anchors == {"my job", "my wife"}
    assert QuickPattern(re.compile(r"ab?c|x[yz]+", re.I)).anchors == {"a", "x"}
    # minding case: the literals as written, looked for in the text as written
    cased = QuickPattern(re.compile(r"\bNASA\b|Mars"))
    assert cased.anchors == {"NASA", "Mars"}
    assert cased.search("NASA said") and not cased.search("nasa said")
    # an alternative needing no literal: the pattern is always searched
    assert QuickPattern(re.compile(r"\d+|abc")).anchors is None
    assert QuickPattern(re.compile(r"(?i:abc)")).anchors is None
    never = QuickPattern(re.compile(r"\bplan(?:ning)? to\b", re.I))
    assert never.anchors == {"plan"}
    assert not never.search("a planet too")
    assert never.search("We PLANNING TO go")
    # a dotless i matches "i" ignoring case, and is not lowered to it
    dotless = QuickPattern(re.compile("kite", re.I))
    assert dotless.search("K\u0131te") and re.search("kite", "K\u0131te", re.I)
