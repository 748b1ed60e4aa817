"""Content hashes: what the layout records and the store compares."""

from __future__ import annotations

import hashlib
import json

from memsvc.domain.types import ChunkRecord


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def content_hash(record: ChunkRecord) -> str:
    """Hash of the text and metadata, the deleted flag excluded (compared on its own)."""
    m = record.metadata
    payload = [
        record.text,
        m.conversation_id,
        m.turn_range.start,
        m.turn_range.end,
        m.timestamp_range.start,
        m.timestamp_range.end,
        list(m.participants),
        list(m.speakers),
        m.intent_tag,
        m.chunk_version,
        m.part_index,
        m.part_count,
    ]
    blob = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()
