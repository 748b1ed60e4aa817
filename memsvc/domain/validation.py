"""Input validation: each check raises InvalidArgument naming the field."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from memsvc.domain.errors import InvalidArgument
from memsvc.domain.ids import chunk_id as compute_chunk_id
from memsvc.domain.limits import (
    MAX_CHUNK_ID_CHARS,
    MAX_CHUNK_TEXT_CHARS,
    MAX_CONVERSATION_ID_CHARS,
    MAX_EVENTS_PER_CALL,
    MAX_FILTER_VALUES,
    MAX_INTENT_TAG_CHARS,
    MAX_NAME_CHARS,
    MAX_PARTICIPANTS,
    MAX_TIMESTAMP_CHARS,
    MAX_TURN_CHARS,
)
from memsvc.domain.text import has_control_chars, has_format_chars, parse_rfc3339
from memsvc.domain.types import SPEAKERS, ChunkRecord, MemoryEvent, SearchFilters, TurnRange


def conversation_id(value: str, field: str) -> str:
    if not value:
        raise InvalidArgument(field, "must not be empty")
    if len(value) > MAX_CONVERSATION_ID_CHARS:
        raise InvalidArgument(field, f"longer than {MAX_CONVERSATION_ID_CHARS} characters")
    if has_control_chars(value) or has_format_chars(value):
        raise InvalidArgument(
            field, "must not contain control or invisible format characters (e.g. U+200B)"
        )
    return value


def timestamp(value: str, field: str) -> str:
    if len(value) > MAX_TIMESTAMP_CHARS:
        raise InvalidArgument(field, f"longer than {MAX_TIMESTAMP_CHARS} characters")
    parse_rfc3339(value, field)
    return value


def turn_range(value: TurnRange, field: str) -> TurnRange:
    if value.start < 0:
        raise InvalidArgument(f"{field}.start", "must be >= 0")
    if value.start > value.end:
        raise InvalidArgument(field, f"start {value.start} > end {value.end}")
    return value


def names(values: Sequence[str], field: str, max_count: int = MAX_PARTICIPANTS) -> tuple[str, ...]:
    if len(values) > max_count:
        raise InvalidArgument(field, f"more than {max_count} names")
    for i, name in enumerate(values):
        if (
            not name.strip()
            or len(name) > MAX_NAME_CHARS
            or has_control_chars(name)
            or has_format_chars(name)
        ):
            raise InvalidArgument(
                f"{field}[{i}]",
                f"must be 1-{MAX_NAME_CHARS} characters, no control or invisible format characters",
            )
    return tuple(values)


def speaker(value: str, field: str) -> str:
    if value not in SPEAKERS:
        raise InvalidArgument(field, f"must be one of {', '.join(SPEAKERS)}, got {value!r}")
    return value


def event_count(items: Sequence[MemoryEvent]) -> None:
    if not items:
        raise InvalidArgument("events", "must not be empty")
    if len(items) > MAX_EVENTS_PER_CALL:
        raise InvalidArgument("events", f"at most {MAX_EVENTS_PER_CALL} events per call")


def events(items: Sequence[MemoryEvent], max_text_chars: int = MAX_TURN_CHARS) -> str:
    """Checks a BuildIncrementalChunks batch (one conversation); returns its conversation_id."""
    event_count(items)
    conv = conversation_id(items[0].conversation_id, "events[0].conversation_id")
    conversation_events(enumerate(items), conv, max_text_chars)
    return conv


def conversation_events(
    indexed: Iterable[tuple[int, MemoryEvent]], conv: str, max_text_chars: int = MAX_TURN_CHARS
) -> None:
    """Each event valid, all of conversation `conv`, no turn_id twice; `indexed` pairs
    each event with its position in the request, which the field names use."""
    seen: set[int] = set()
    for i, e in indexed:
        event(e, f"events[{i}]", max_text_chars)
        if e.conversation_id != conv:
            raise InvalidArgument(
                f"events[{i}].conversation_id",
                f"all events of one call must belong to one conversation ({conv!r})",
            )
        if e.turn_id in seen:
            raise InvalidArgument(f"events[{i}].turn_id", f"duplicate turn_id {e.turn_id}")
        seen.add(e.turn_id)


def event(e: MemoryEvent, field: str, max_text_chars: int = MAX_TURN_CHARS) -> None:
    conversation_id(e.conversation_id, f"{field}.conversation_id")
    if e.turn_id < 0:
        raise InvalidArgument(f"{field}.turn_id", "must be >= 0")
    speaker(e.speaker, f"{field}.speaker")
    if not e.timestamp:
        raise InvalidArgument(f"{field}.timestamp", "required (RFC 3339 with offset)")
    timestamp(e.timestamp, f"{field}.timestamp")
    if len(e.text) > max_text_chars:
        raise InvalidArgument(
            f"{field}.text",
            f"longer than {max_text_chars:,} characters (MEMSVC_MAX_TURN_CHARS)",
        )
    names(e.participants, f"{field}.participants")
    if e.speaker_name:
        names([e.speaker_name], f"{field}.speaker_name")


def record(r: ChunkRecord, field: str) -> None:
    """Structural checks of an upserted record (token length is checked by the caller)."""
    m = r.metadata
    if not r.chunk_id:
        raise InvalidArgument(f"{field}.chunk_id", "must not be empty")
    if len(r.chunk_id) > MAX_CHUNK_ID_CHARS:
        raise InvalidArgument(f"{field}.chunk_id", f"longer than {MAX_CHUNK_ID_CHARS} characters")
    conversation_id(m.conversation_id, f"{field}.metadata.conversation_id")
    turn_range(m.turn_range, f"{field}.metadata.turn_range")
    if m.chunk_version < 1:
        raise InvalidArgument(f"{field}.metadata.chunk_version", "must be >= 1")
    if m.part_count < 1 or not 0 <= m.part_index < m.part_count:
        raise InvalidArgument(
            f"{field}.metadata.part_index", "need 0 <= part_index < part_count (part_count >= 1)"
        )
    expected = compute_chunk_id(
        m.conversation_id, m.turn_range.start, m.turn_range.end, m.chunk_version, m.part_index
    )
    if r.chunk_id != expected:
        raise InvalidArgument(
            f"{field}.chunk_id",
            f"does not match the chunk id formula for its metadata (expected {expected})",
        )
    if not r.text.strip():
        raise InvalidArgument(f"{field}.text", "must not be empty")
    if len(r.text) > MAX_CHUNK_TEXT_CHARS:
        raise InvalidArgument(f"{field}.text", f"longer than {MAX_CHUNK_TEXT_CHARS} characters")
    for name, value in (("start", m.timestamp_range.start), ("end", m.timestamp_range.end)):
        if value:
            timestamp(value, f"{field}.metadata.timestamp_range.{name}")
    names(m.participants, f"{field}.metadata.participants")
    for i, s in enumerate(m.speakers):
        speaker(s, f"{field}.metadata.speakers[{i}]")
    if len(m.intent_tag) > MAX_INTENT_TAG_CHARS or has_control_chars(m.intent_tag):
        raise InvalidArgument(
            f"{field}.metadata.intent_tag", f"at most {MAX_INTENT_TAG_CHARS} characters"
        )


def search_filters(f: SearchFilters, field: str = "filters") -> None:
    """Every filter value checked and named by its path (`filters.conversation_ids[0]`)
    before any of it reaches a Milvus expression (where it is escaped as well)."""
    for name, values in (
        ("conversation_ids", f.conversation_ids),
        ("participants", f.participants),
        ("speakers", f.speakers),
    ):
        if len(values) > MAX_FILTER_VALUES:
            raise InvalidArgument(f"{field}.{name}", f"at most {MAX_FILTER_VALUES} values")
    for i, conv in enumerate(f.conversation_ids):
        conversation_id(conv, f"{field}.conversation_ids[{i}]")
    names(f.participants, f"{field}.participants", max_count=MAX_FILTER_VALUES)
    for i, s in enumerate(f.speakers):
        speaker(s, f"{field}.speakers[{i}]")
    if len(f.intent_tag) > MAX_INTENT_TAG_CHARS or has_control_chars(f.intent_tag):
        raise InvalidArgument(
            f"{field}.intent_tag", f"at most {MAX_INTENT_TAG_CHARS} characters, no control ones"
        )
    if f.chunk_version < 0:
        raise InvalidArgument(f"{field}.chunk_version", "must be >= 0 (0 = newest)")
