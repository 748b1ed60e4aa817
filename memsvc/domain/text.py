"""Text cleaning, language detection and RFC 3339 parsing: pure functions."""

from __future__ import annotations

import re
import unicodedata
from datetime import datetime
from itertools import islice

from memsvc.domain.errors import InvalidArgument

_WS = re.compile(r"\s+")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[A-Za-z]")
# Hiragana and katakana: Japanese writes its kanji with them, Chinese never does.
_KANA = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
# RFC 3339: date, "T" (or space), time, mandatory offset.
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


# How turn text is cleaned: recorded in the log (meta `text_form`), whose turns are cleaned
# again when it changes (memsvc.services.bootstrap). 2: full-width punctuation and the
# ellipsis kept as written.
TEXT_FORM = "2"
# Punctuation NFKC would fold to ASCII, kept as written: Chinese and Japanese full-width
# punctuation (，！？：；（）～ ...) and the ellipsis. Full-width letters and digits still fold
# (ＡＢＣ１２３ is found as ABC123).
_KEPT = re.compile(r"([\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff5e\u2026])")


def clean_text(text: str) -> str:
    """A turn's text as chunks show it: NFKC but for full-width punctuation and the
    ellipsis, control characters removed (newlines and tabs become spaces), whitespace
    folded."""
    return _cleaned(
        "".join(
            part if i % 2 else unicodedata.normalize("NFKC", part)
            for i, part in enumerate(_KEPT.split(text))
        )
    )


def has_kept_punctuation(text: str) -> bool:
    """Whether cleaning keeps characters here that the previous text form folded."""
    return _KEPT.search(text) is not None


def fold_text(text: str) -> str:
    """NFKC throughout (full-width punctuation folded to ASCII), control characters removed,
    whitespace folded: the form of names, which are matched by filters, and of turn text
    before text form 2."""
    return _cleaned(unicodedata.normalize("NFKC", text))


# Characters removed by cleaning: control, format, surrogate, private-use, unassigned.
_REMOVED = frozenset(("Cc", "Cf", "Cs", "Co", "Cn"))
_SPACED = {ord(ch): " " for ch in "\n\r\t\v\f"}


def _cleaned(text: str) -> str:
    # One look at each distinct character, then one str.translate: a turn of 40,000
    # characters holds a few hundred distinct ones (a loop over every character cost 12 ms).
    table: dict[int, str | None] = {
        ord(ch): None for ch in set(text) if unicodedata.category(ch) in _REMOVED
    }
    table.update(_SPACED)
    return _WS.sub(" ", text.translate(table)).strip()


def normal_id(value: str) -> str:
    """The one form of a conversation id: Unicode NFC (spellings that are canonically
    equivalent, and so look identical, are one id), whitespace runs folded to one space,
    no outer whitespace."""
    return _WS.sub(" ", unicodedata.normalize("NFC", value)).strip()


def normal_name(value: str) -> str:
    """The one form of a name (speaker name, participant, a filter on either): NFKC,
    whitespace folded (fold_text), as chunks show it."""
    return fold_text(value)


def has_control_chars(text: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" for ch in text)


def has_format_chars(text: str) -> bool:
    """Invisible format characters (Unicode Cf: zero-width spaces, direction marks): two ids
    that look identical must not name two conversations."""
    return any(unicodedata.category(ch) == "Cf" for ch in text)


def is_chinese(text: str) -> bool:
    """Chinese when there are at least a quarter as many CJK characters as Latin letters,
    and no kana (Japanese: its memories must not carry Chinese labels and context).

    One CJK character carries about as much as a four-letter English word.
    """
    if _KANA.search(text):
        return False
    cjk = len(_CJK.findall(text))
    return cjk > 0 and cjk * 4 >= len(_LATIN.findall(text))


def turn_is_chinese(text: str, window_is_chinese: bool) -> bool:
    """Whether one turn's role label is Chinese: its own language when it plainly has one
    (Chinese; or a dozen Latin letters and no CJK), else its window's ("ok", "好", code)."""
    if is_chinese(text):
        return True
    if not _CJK.search(text) and len(list(islice(_LATIN.finditer(text), 12))) == 12:
        return False
    return window_is_chinese


def parse_rfc3339(value: str, field: str) -> datetime:
    """Parse an RFC 3339 timestamp with offset; InvalidArgument naming `field` otherwise."""
    if not _RFC3339.match(value):
        raise InvalidArgument(
            field,
            f"not an RFC 3339 timestamp with offset (e.g. 2026-02-02T10:15:30+08:00): {value!r}",
        )
    try:
        return datetime.fromisoformat(value.replace("z", "Z").replace("t", "T"))
    except ValueError as exc:
        raise InvalidArgument(field, f"invalid timestamp {value!r}: {exc}") from exc


def epoch_ms(value: str, field: str) -> int:
    return int(parse_rfc3339(value, field).timestamp() * 1000)
