"""A Connect JSON request body, decoded or refused as INVALID_ARGUMENT (never a 500):
it must be one JSON object (proto3's JSON mapping of a request message), with unique keys,
nested at most MAX_JSON_DEPTH deep.

The depth is checked before decoding: json.loads recurses once per level and a body of
100,000 `[` raised RecursionError. The check strips the strings (where brackets mean
nothing), keeps only the brackets, and takes away innermost pairs a level at a time, each
pass one C-speed scan of what is left; a body deeper than the limit, or unbalanced (which
no parser would take either), is refused when pairs are still left after the limit's
passes. The deepest request memsvc's API defines nests 6 levels (checked in the tests)."""

from __future__ import annotations

import json
import re
from typing import Any

MAX_JSON_DEPTH = 32

# a JSON string, escapes included ("unrolled": no per-character alternation)
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_INNERMOST = re.compile(rb"\[\]|\{\}")


_JSON_KINDS = {
    type(None): "null",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    list: "an array",
}


class BodyRefused(ValueError):
    """The body is not a request this bridge decodes; the message says why."""


def too_deep(body: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `body` nests brackets deeper than `limit` (or leaves some unbalanced)."""
    brackets = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    for _ in range(limit):
        if not brackets:
            return False
        brackets, removed = _INNERMOST.subn(b"", brackets)
        if not removed:
            return True  # unbalanced: nothing closes
    return bool(brackets)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique (as json_format.Parse requires)."""
    value = dict(pairs)
    if len(value) != len(pairs):
        raise BodyRefused("a JSON object repeats a key")
    return value


def decoded(body: bytes) -> dict[str, Any]:
    """The body as a JSON object (an empty body: {}); BodyRefused otherwise."""
    if too_deep(body):
        raise BodyRefused(f"JSON nested deeper than {MAX_JSON_DEPTH} levels, or unbalanced")
    try:
        value = json.loads(body or b"{}", object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise BodyRefused(str(exc)) from None
    if not isinstance(value, dict):
        kind = _JSON_KINDS.get(type(value), "a value")
        raise BodyRefused(f"must be a JSON object (the request message), not {kind}")
    return value
