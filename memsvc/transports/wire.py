"""Count limits checked on a request as it arrives, before any per-item work.

A 16 MiB request of empty events holds 8.4 million of them: converting each before counting
took 81-117 s and 2.4 GiB to refuse it. So each transport counts a request's repeated items
first: on the serialized message (gRPC, binary HTTP) by a scan of its top-level fields that
stops at the first item over the limit, before the message is decoded; on HTTP JSON on the
parsed JSON, before it becomes a message. Each refusal names the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from memsvc.domain.limits import (
    MAX_BATCH_TEXTS,
    MAX_EVENTS_PER_CALL,
    MAX_FILTER_VALUES,
    MAX_RECORDS_PER_CALL,
)
from memsvc.v1 import memory_pb2 as pb

# method -> its repeated (or map) request fields, each with the most items per call
COUNTED: dict[str, dict[str, int]] = {
    "AppendEvents": {"events": MAX_EVENTS_PER_CALL, "expected_last_turn": MAX_EVENTS_PER_CALL},
    "BuildIncrementalChunks": {"events": MAX_EVENTS_PER_CALL},
    "UpsertVectorRecords": {"records": MAX_RECORDS_PER_CALL},
    "EmbedBatch": {"texts": MAX_BATCH_TEXTS},
    "GetIndexStatus": {"conversation_ids": MAX_FILTER_VALUES},
    "Reindex": {"conversation_ids": MAX_FILTER_VALUES},
}
_METHODS = pb.DESCRIPTOR.services_by_name["MemoryService"].methods_by_name


class _Counted(NamedTuple):
    name: str
    json_name: str
    limit: int


# method -> field number -> the field
_FIELDS = {
    method: {
        field.number: _Counted(name, field.json_name, limit)
        for name, limit in fields.items()
        for field in [_METHODS[method].input_type.fields_by_name[name]]
    }
    for method, fields in COUNTED.items()
}


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


# Top-level fields a request may hold besides its counted items (each scalar once; a
# sender may repeat one, but not millions of times: the scan must stay short too).
OTHER_FIELDS = 64


def _scan(data: bytes, counted: Mapping[int, _Counted]) -> _Counted | str | None:
    """Why the serialized message is refused: the counted field that holds more than its
    limit of items (top-level occurrences), "fields" when more than OTHER_FIELDS other
    top-level fields; None otherwise. Stops at the first field past either. A malformed
    message is left to the decoder (None)."""
    counts = dict.fromkeys(counted, 0)
    others, at = 0, 0
    try:
        while at < len(data):
            key, at = _varint(data, at)
            kind, number = key & 7, key >> 3
            if number in counts:
                counts[number] += 1
                if counts[number] > counted[number].limit:
                    return counted[number]
            else:
                others += 1
                if others > OTHER_FIELDS:
                    return "fields"
            if kind == 0:
                _, at = _varint(data, at)
            elif kind == 1:
                at += 8
            elif kind == 2:
                size, at = _varint(data, at)
                at += size
            elif kind == 5:
                at += 4
            else:
                return None
    except ValueError:
        return None
    return None


def _refusal(field: _Counted) -> tuple[str, str]:
    return field.name, f"at most {field.limit:,} per call: split them over several calls"


def refusal_of_bytes(method: str, data: bytes) -> tuple[str, str] | None:
    """(field, why) when the serialized request of `method` holds too many items."""
    counted = _FIELDS.get(method)
    if counted is None:
        return None
    verdict = _scan(data, counted)
    if isinstance(verdict, _Counted):
        return _refusal(verdict)
    if verdict == "fields":
        names = " and ".join(f.name for f in counted.values())
        return "request", f"more than {OTHER_FIELDS} top-level fields besides {names}"
    return None


def refusal_of_json(method: str, body: Mapping[str, Any]) -> tuple[str, str] | None:
    """(field, why) when the parsed JSON request of `method` holds too many items (the field
    under either of its proto3 JSON names: a list, or an object for a map)."""
    for field in _FIELDS.get(method, {}).values():
        for key in (field.name, field.json_name):
            items = body.get(key)
            if isinstance(items, (list, dict)) and len(items) > field.limit:
                return _refusal(field)
    return None
