"""Input validation: each check raises InvalidArgument naming the field.

Values with a normal form (conversation ids, names, filter values on them) are returned in
that form, and every limit applies to it: what is checked is what is stored, so a value
that grows under normalisation cannot pass a limit and then break one downstream."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

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
    MAX_PAYLOAD_CHARS,
    MAX_TIMESTAMP_CHARS,
    MAX_TURN_CHARS,
    MAX_TURN_ID,
)
from memsvc.domain.text import (
    epoch_ms,
    has_control_chars,
    has_format_chars,
    normal_id,
    normal_name,
    parse_rfc3339,
)
from memsvc.domain.types import (
    SPEAKERS,
    ChunkRecord,
    MemoryEvent,
    SearchFilters,
    TimestampRange,
    TurnRange,
)


def conversation_id(value: str, field: str) -> str:
    """The id in its normal form (memsvc.domain.text.normal_id)."""
    if has_control_chars(value) or has_format_chars(value):
        raise InvalidArgument(
            field, "must not contain control or invisible format characters (e.g. U+200B)"
        )
    normal = normal_id(value)
    if not normal:
        raise InvalidArgument(field, "must not be empty")
    if len(normal) > MAX_CONVERSATION_ID_CHARS:
        raise InvalidArgument(field, f"longer than {MAX_CONVERSATION_ID_CHARS} characters")
    return normal


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


def name(value: str, field: str) -> str:
    """A name in its normal form (memsvc.domain.text.normal_name), 1-256 characters."""
    normal = normal_name(value) if not (has_control_chars(value) or has_format_chars(value)) else ""
    if not normal or len(normal) > MAX_NAME_CHARS:
        raise InvalidArgument(
            field,
            f"must be 1-{MAX_NAME_CHARS} characters (in normal form), no control or"
            " invisible format characters",
        )
    return normal


def names(values: Sequence[str], field: str, max_count: int = MAX_PARTICIPANTS) -> tuple[str, ...]:
    if len(values) > max_count:
        raise InvalidArgument(field, f"more than {max_count} names")
    return tuple(name(v, f"{field}[{i}]") for i, v in enumerate(values))


def speaker(value: str, field: str) -> str:
    if value not in SPEAKERS:
        raise InvalidArgument(field, f"must be one of {', '.join(SPEAKERS)}, got {value!r}")
    return value


def event_count(items: Sequence[MemoryEvent]) -> None:
    if not items:
        raise InvalidArgument("events", "must not be empty")
    if len(items) > MAX_EVENTS_PER_CALL:
        raise InvalidArgument("events", f"at most {MAX_EVENTS_PER_CALL} events per call")


def expected_last_turns(
    expected: Mapping[str, int], items: Sequence[MemoryEvent]
) -> dict[str, int]:
    """An append's compare-and-append expectations, by conversation in normal form: each
    names a conversation of one of `items` and a last turn id from -1 (none yet) up."""
    written = {normal_id(e.conversation_id) for e in items}
    out: dict[str, int] = {}
    spelled: dict[str, str] = {}  # normal form -> the key that gave it
    for key, last in sorted(expected.items()):  # one answer whatever the map's order
        field = f"expected_last_turn[{key!r}]"
        conv = conversation_id(key, field)
        if conv in spelled:
            raise InvalidArgument(
                field,
                f"names the same conversation as expected_last_turn[{spelled[conv]!r}]"
                f" ({conv!r} once folded: NFC, whitespace): give one key per conversation",
            )
        spelled[conv] = key
        if conv not in written:
            raise InvalidArgument(field, "names no conversation of this call's events")
        if not -1 <= last <= MAX_TURN_ID:
            raise InvalidArgument(field, f"must be -1 (no turn yet) to {MAX_TURN_ID:,}")
        out[conv] = last
    return out


def events(
    items: Sequence[MemoryEvent], max_text_chars: int = MAX_TURN_CHARS
) -> tuple[str, list[MemoryEvent]]:
    """Checks a BuildIncrementalChunks batch (one conversation); returns its conversation
    id and the events, in normal form."""
    event_count(items)
    conv = conversation_id(items[0].conversation_id, "events[0].conversation_id")
    return conv, conversation_events(enumerate(items), conv, max_text_chars)


def conversation_events(
    indexed: Iterable[tuple[int, MemoryEvent]], conv: str, max_text_chars: int = MAX_TURN_CHARS
) -> list[MemoryEvent]:
    """Each event valid, all of conversation `conv` (in normal form), no turn_id twice;
    `indexed` pairs each event with its position in the request, which the field names
    use. Returns the events in normal form."""
    seen: set[int] = set()
    out: list[MemoryEvent] = []
    for i, e in indexed:
        normal = event(e, f"events[{i}]", max_text_chars)
        if normal.conversation_id != conv:
            raise InvalidArgument(
                f"events[{i}].conversation_id",
                f"all events of one call must belong to one conversation ({conv!r})",
            )
        if e.turn_id in seen:
            raise InvalidArgument(f"events[{i}].turn_id", f"duplicate turn_id {e.turn_id}")
        seen.add(e.turn_id)
        out.append(normal)
    return out


NUL = "\x00"


def event(e: MemoryEvent, field: str, max_text_chars: int = MAX_TURN_CHARS) -> MemoryEvent:
    """The event in normal form (id, names), every limit checked on that form."""
    conv = conversation_id(e.conversation_id, f"{field}.conversation_id")
    if not 0 <= e.turn_id <= MAX_TURN_ID:
        raise InvalidArgument(f"{field}.turn_id", f"must be 0 to {MAX_TURN_ID:,}")
    speaker(e.speaker, f"{field}.speaker")
    if not e.timestamp:
        raise InvalidArgument(f"{field}.timestamp", "required (RFC 3339 with offset)")
    timestamp(e.timestamp, f"{field}.timestamp")
    if len(e.text) > max_text_chars:
        raise InvalidArgument(
            f"{field}.text",
            f"longer than {max_text_chars:,} characters (MEMSVC_MAX_TURN_CHARS)",
        )
    if len(e.payload) > MAX_PAYLOAD_CHARS:
        raise InvalidArgument(f"{field}.payload", f"longer than {MAX_PAYLOAD_CHARS:,} characters")
    if NUL in e.payload:
        # kept exactly as sent, and PostgreSQL's text cannot hold U+0000: refused on both logs
        raise InvalidArgument(f"{field}.payload", "must not contain U+0000 (NUL)")
    participants = names(e.participants, f"{field}.participants")
    speaker_name = name(e.speaker_name, f"{field}.speaker_name") if e.speaker_name else ""
    return replace(
        e,
        conversation_id=conv,
        # U+0000 means nothing in a turn and PostgreSQL's text cannot hold it: removed on
        # both logs, as chunks remove every control character
        text=e.text.replace(NUL, ""),
        participants=participants,
        speaker_name=speaker_name,
    )


def record(r: ChunkRecord, field: str) -> None:
    """Structural checks of an upserted record (token length is checked by the caller).
    A record is compared with what the server built, byte for byte: it is not normalised."""
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
    for end, value in (("start", m.timestamp_range.start), ("end", m.timestamp_range.end)):
        if value:
            timestamp(value, f"{field}.metadata.timestamp_range.{end}")
    names(m.participants, f"{field}.metadata.participants")
    for i, s in enumerate(m.speakers):
        speaker(s, f"{field}.metadata.speakers[{i}]")
    if len(m.intent_tag) > MAX_INTENT_TAG_CHARS or has_control_chars(m.intent_tag):
        raise InvalidArgument(
            f"{field}.metadata.intent_tag", f"at most {MAX_INTENT_TAG_CHARS} characters"
        )


def search_filters(f: SearchFilters, field: str = "filters") -> SearchFilters:
    """Every filter value checked and named by its path (`filters.conversation_ids[0]`)
    before any of it reaches a store query; returned in normal form, so a filter on the
    name or id as sent finds what was stored in normal form."""
    for key, values in (
        ("conversation_ids", f.conversation_ids),
        ("participants", f.participants),
        ("speakers", f.speakers),
    ):
        if len(values) > MAX_FILTER_VALUES:
            raise InvalidArgument(f"{field}.{key}", f"at most {MAX_FILTER_VALUES} values")
    convs = tuple(
        conversation_id(c, f"{field}.conversation_ids[{i}]")
        for i, c in enumerate(f.conversation_ids)
    )
    participants = names(f.participants, f"{field}.participants", max_count=MAX_FILTER_VALUES)
    for i, s in enumerate(f.speakers):
        speaker(s, f"{field}.speakers[{i}]")
    if len(f.intent_tag) > MAX_INTENT_TAG_CHARS or has_control_chars(f.intent_tag):
        raise InvalidArgument(
            f"{field}.intent_tag", f"at most {MAX_INTENT_TAG_CHARS} characters, no control ones"
        )
    if f.chunk_version < 0:
        raise InvalidArgument(f"{field}.chunk_version", "must be >= 0 (0 = the conversation's)")
    tr = f.timestamp_range
    if tr is not None:
        time_range(tr, f"{field}.timestamp_range")
    return replace(f, conversation_ids=tuple(dict.fromkeys(convs)), participants=participants)


def time_range(tr: TimestampRange, field: str) -> None:
    """Either end may be open; both given, start must not be after end."""
    start = epoch_ms(tr.start, f"{field}.start") if tr.start else None
    end = epoch_ms(tr.end, f"{field}.end") if tr.end else None
    if start is not None and end is not None and start > end:
        raise InvalidArgument(field, f"start {tr.start} is after end {tr.end}")
