"""A rule pattern's search with a quick necessary test first: the literal texts one of which
every match contains, looked for in the lowercased text (`str.__contains__`, in C).

The rule tables (memsvc.domain.prefix.INTENT_RULES, memsvc.domain.standing.STANDING_RULE)
are alternations of many words, each behind a `\\b` and matched ignoring case, so Python's
`re` tries every alternative at every character: ~0.9 ms a window of 1,600 characters, a
third of rendering it (benchmarks/archive/2026-12-06.md, the load's CPU). Most windows
contain none of a rule's words; for them the test answers alone, and for the rest the
pattern itself does, so the answer is always the pattern's.

The literals come from the compiled pattern's parse (`re._parser`), so they follow the
rules as they are edited: in a sequence, the element whose literals are longest; in an
alternation, every alternative's; none where an element can match without one (the rule
is then always searched). Ignoring case, `re` also matches three characters outside ASCII
to ASCII letters whose `str.lower()` is not that letter (`İ`, `ı`, `ſ`): a text holding
one is searched directly.
"""

from __future__ import annotations

import re
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser  # type: ignore[attr-defined]
from typing import Any

# Characters `re` matches to an ASCII letter when ignoring case that `str.lower()` does
# not lower to it (every code point checked: tests/test_quick_match.py).
CASE_EXCEPTIONS = frozenset("\u0130\u0131\u017f")

_Anchors = frozenset[str] | None  # None: no literal is necessary


class QuickPattern:
    """`pattern.search(text) is not None`, answered by a substring test where it can be."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern = pattern
        self.ignore_case = bool(pattern.flags & re.IGNORECASE)
        self.anchors = _sequence(
            list(_parser.parse(pattern.pattern, pattern.flags)), self.ignore_case
        )

    def search(self, text: str, lowered: str | None = None) -> bool:
        """`lowered`: `text.lower()`, when the caller has it (several rules, one text)."""
        return self._may_match(text, lowered) and self.pattern.search(text) is not None

    def _may_match(self, text: str, lowered: str | None) -> bool:
        """False only where no match can be: none of the necessary literals is in the text
        (lowered, ignoring case, unless it holds a character lowering cannot tell)."""
        if self.anchors is None:
            return True
        if self.ignore_case:
            if any(c in text for c in CASE_EXCEPTIONS):
                return True
            text = text.lower() if lowered is None else lowered
        return any(a in text for a in self.anchors)


def _sequence(items: list[tuple[Any, Any]], ignore_case: bool) -> _Anchors:
    """The best necessary literals of a sequence: each element's, runs of literals joined."""
    options: list[frozenset[str]] = []
    run: list[str] = []
    for op, av in [*items, (None, None)]:
        char = _literal(op, av, ignore_case)
        if char is not None:
            run.append(char)
            continue
        if run:
            options.append(frozenset(["".join(run)]))
            # "my (?:job|wife)": the run and each alternative's first letters, together
            starts = _starts(op, av, ignore_case)
            if starts is not None:
                options.append(frozenset("".join(run) + s for s in starts))
            run = []
        if op is None:
            break
        found = _element(op, av, ignore_case)
        if found is not None:
            options.append(found)
    if not options:
        return None
    return max(options, key=lambda o: (min(map(len, o)), -len(o)))


def _starts(op: Any, av: Any, ignore_case: bool) -> _Anchors:
    """The literal texts one of which every match of an alternation starts with."""
    if op is sre.SUBPATTERN and not (av[1] or av[2]) and len(av[3]) == 1:
        op, av = next(iter(av[3]))
    if op is not sre.BRANCH:
        return None
    starts: set[str] = set()
    for alternative in av[1]:
        start = ""
        for o, a in alternative:
            char = _literal(o, a, ignore_case)
            if char is None:
                break
            start += char
        if not start:
            return None
        starts.add(start)
    return frozenset(starts)


def _literal(op: Any, av: Any, ignore_case: bool) -> str | None:
    """The character a LITERAL matches, as found in a lowercased text; None otherwise or
    where lowering could not find it (a cased letter outside ASCII, ignoring case)."""
    if op is not sre.LITERAL:
        return None
    char = chr(av)
    if not ignore_case:
        return char
    if not char.isascii() and char.lower() != char.upper():
        return None
    return char.lower()


def _element(op: Any, av: Any, ignore_case: bool) -> _Anchors:
    if op is sre.BRANCH:
        found: set[str] = set()
        for alternative in av[1]:
            anchors = _sequence(list(alternative), ignore_case)
            if anchors is None:
                return None
            found |= anchors
        return frozenset(found)
    if op is sre.SUBPATTERN:
        _, add_flags, del_flags, body = av
        if add_flags or del_flags:  # a flag changed inside: not worth following
            return None
        return _sequence(list(body), ignore_case)
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
        low, _, body = av
        return _sequence(list(body), ignore_case) if low >= 1 else None
    if op is sre.IN:
        chars = [_literal(o, a, ignore_case) for o, a in av]
        return None if None in chars else frozenset(c for c in chars if c is not None)
    return None
