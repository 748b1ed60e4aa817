"""Milvus filter expressions built from typed values: the only place memsvc writes Milvus's
expression language.

Every string reaches an expression through `quote`, which escapes backslashes and double
quotes (the two characters Milvus's string-literal grammar gives meaning to) and refuses
control characters, so an untrusted value can never change the expression's structure.
Numbers go through int().
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from memsvc.domain.errors import InvalidArgument
from memsvc.domain.text import epoch_ms, has_control_chars
from memsvc.domain.types import SearchFilters
from memsvc.ports import SearchScope, Span


def quote(value: str) -> str:
    if has_control_chars(value):
        raise InvalidArgument("filter", "control characters are not allowed in filter values")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def str_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(quote(v) for v in values) + "]"


def in_expr(field: str, values: Sequence[str]) -> str:
    if len(values) == 1:
        return f"{field} == {quote(values[0])}"
    return f"{field} in {str_list(values)}"


def ids_expr(chunk_ids: Sequence[str]) -> str:
    return in_expr("chunk_id", chunk_ids)


def after_id(chunk_id: str) -> str:
    return f"chunk_id > {quote(chunk_id)}"


def all_rows() -> str:
    return 'chunk_id != ""'


def chunks_of_expr(conversation_id: str | None, deleted: bool | None, version: int | None) -> str:
    parts = []
    if conversation_id is not None:
        parts.append(f"conversation_id == {quote(conversation_id)}")
    if deleted is not None:
        parts.append(f"deleted == {'true' if deleted else 'false'}")
    if version is not None:
        parts.append(f"chunk_version == {int(version)}")
    return " and ".join(parts)


def overlapping_expr(conversation_id: str, spans: Sequence[Span] | None) -> str:
    """Live chunks of the conversation whose turn range meets any span (None: all)."""
    expr = f"deleted == false and conversation_id == {quote(conversation_id)}"
    if spans is None:
        return expr
    overlaps = " or ".join(f"(start_turn <= {int(e)} and end_turn >= {int(s)})" for s, e in spans)
    return f"{expr} and ({overlaps})"


def version_expr(versions_of_multi: Mapping[int, Sequence[str]]) -> str:
    """The version each conversation reads, for a store without the `current` mark:
    `versions_of_multi` lists, by version, the conversations that hold several; every
    other conversation holds one. Grouped by version, so the expression's depth stays the
    number of versions however many conversations are listed (a chain of one clause per
    conversation fails in Milvus past ~50)."""
    if not versions_of_multi:
        return ""
    listed = sorted(c for convs in versions_of_multi.values() for c in convs)
    parts = [f"conversation_id not in {str_list(listed)}"]
    parts += [
        f"(conversation_id in {str_list(sorted(convs))} and chunk_version == {int(v)})"
        for v, convs in sorted(versions_of_multi.items())
    ]
    return "(" + " or ".join(parts) + ")"


def successor(prefix: str) -> str:
    """The least string greater than every string starting with `prefix` (code point
    order, which is Milvus's byte order of UTF-8)."""
    head = prefix.rstrip(chr(0x10FFFF))
    if not head:
        return ""
    following = ord(head[-1]) + 1
    if 0xD800 <= following <= 0xDFFF:  # surrogates are no characters: skip past them
        following = 0xE000
    return head[:-1] + chr(following)


def prefixes_expr(prefixes: Sequence[str]) -> str:
    """Conversation ids starting with one of `prefixes`, as ranges (exact: Milvus's LIKE
    treats `_` as a wildcard, and an escaped LIKE pattern crashed Milvus Lite 2.5.1)."""
    parts = []
    for p in prefixes:
        upper = successor(p)
        lower = f"conversation_id >= {quote(p)}"
        parts.append(f"({lower} and conversation_id < {quote(upper)})" if upper else lower)
    return "(" + " or ".join(parts) + ")"


def filter_expr(
    filters: SearchFilters,
    versions_of_multi: Mapping[int, Sequence[str]] | None,
    prefixes: Sequence[str] = (),
) -> str:
    """The Milvus boolean expression for `filters` ("" = no filter). Default searches read
    each conversation's active version: `current == true` where rows carry the mark
    (`versions_of_multi` None), else the version expression."""
    parts: list[str] = []
    if prefixes:
        parts.append(prefixes_expr(prefixes))
    if filters.conversation_ids:
        parts.append(in_expr("conversation_id", filters.conversation_ids))
    if filters.participants:
        parts.append(f"array_contains_any(participants, {str_list(filters.participants)})")
    if filters.speakers:
        parts.append(f"array_contains_any(speakers, {str_list(filters.speakers)})")
    tr = filters.timestamp_range
    if tr is not None and tr.start:
        parts.append(f"ts_end_ms >= {epoch_ms(tr.start, 'filters.timestamp_range.start')}")
    if tr is not None and tr.end:
        parts.append(f"ts_start_ms <= {epoch_ms(tr.end, 'filters.timestamp_range.end')}")
    if filters.intent_tag:
        parts.append(f"intent_tag == {quote(filters.intent_tag)}")
    if not filters.include_deleted:
        parts.append("deleted == false")
    if filters.chunk_version:
        parts.append(f"chunk_version == {int(filters.chunk_version)}")
    elif versions_of_multi is None:
        parts.append("current == true")
    else:
        active = version_expr(versions_of_multi)
        if active:
            parts.append(active)
    return " and ".join(parts)


def scope_expr(scope: SearchScope, marks_current: bool) -> str:
    return filter_expr(
        scope.filters, None if marks_current else scope.versions_of_multi, scope.prefixes
    )
