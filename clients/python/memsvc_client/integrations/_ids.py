"""Conversation ids joined from a framework's identifiers, injectively: no two tuples of
parts share a conversation (an app `X/other-user` with user `u` is not app `X` with user
`other-user/u`); and of a single identifier (`single_id`), no two share one.

Each part stands as it is when it is already in memsvc's normal form and holds neither `/`
nor `%` (so the ids most apps use, and the conversations stored before, are unchanged);
any other part is percent-encoded whole (UTF-8, every byte but letters, digits and `-._~`).
A part as it stands has no `%` and an encoded one always has one, and no part holds a `/`:
so the parts, joined by `/`, can be read back, and the joined id is itself in normal form
(memsvc never folds two of them into one)."""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import quote

_WS_RUN = re.compile(r"\s{2,}|[^\S ]")  # two or more spaces in a row, or a tab, newline...


def _normal(part: str) -> bool:
    """Already memsvc's normal form (NFC, one space at a time, no outer space, no control
    or invisible format character) and no `%`."""
    return (
        "%" not in part
        and part == part.strip()
        and not _WS_RUN.search(part)
        and unicodedata.normalize("NFC", part) == part
        and not any(unicodedata.category(ch) in ("Cc", "Cf") for ch in part)
    )


def _stands(part: str) -> bool:
    return "/" not in part and _normal(part)


def id_part(part: str) -> str:
    return part if _stands(part) else quote(part, safe="")


def joined_id(*parts: str) -> str:
    """The conversation id of these identifiers, `/` between them."""
    return "/".join(id_part(p) for p in parts)


def single_id(value: str) -> str:
    """The conversation id of a framework's one identifier (a session id): as it stands when
    in normal form and without `%`, a `/` included (a tenant's prefix stays a prefix); else
    percent-encoded but for `/`. An encoded id always holds a `%` and a standing one never
    does, so no two session ids share a conversation: before, `"x  y"` and `"x y"`, `"id "`
    and `"id"`, NFD and NFC `café` read each other's items (memsvc folds ids)."""
    return value if _normal(value) else quote(value, safe="/")
