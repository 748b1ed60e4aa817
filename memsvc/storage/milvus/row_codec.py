"""A chunk as a row of the collection (memsvc.storage.milvus.schema), and back."""

from __future__ import annotations

from typing import Any

import numpy as np

from memsvc.domain import bm25
from memsvc.domain.records import Candidate, StoredChunk
from memsvc.domain.text import epoch_ms
from memsvc.domain.types import ChunkMetadata, ChunkRecord, TimestampRange, TurnRange
from memsvc.storage.milvus import texts, turn_lines


def to_row(
    chunk: StoredChunk,
    with_current: bool,
    with_turn_lines: bool,
    with_sparse: bool,
    text_beside: bool = False,
) -> dict[str, Any]:
    """`text_beside`: the row's text is a reference to the text, kept beside the store
    (memsvc.storage.milvus.texts)."""
    r, m = chunk.record, chunk.record.metadata
    assert chunk.vector is not None
    row = {
        "chunk_id": r.chunk_id,
        "conversation_id": m.conversation_id,
        "text": texts.reference(r.text) if text_beside else r.text,
        "content_hash": chunk.content_hash,
        "start_turn": m.turn_range.start,
        "end_turn": m.turn_range.end,
        "ts_start": m.timestamp_range.start,
        "ts_end": m.timestamp_range.end,
        "ts_start_ms": epoch_ms(m.timestamp_range.start, "metadata.timestamp_range.start")
        if m.timestamp_range.start
        else 0,
        "ts_end_ms": epoch_ms(m.timestamp_range.end, "metadata.timestamp_range.end")
        if m.timestamp_range.end
        else 0,
        "participants": list(m.participants),
        "speakers": list(m.speakers),
        "intent_tag": m.intent_tag,
        "chunk_version": m.chunk_version,
        "deleted": m.deleted,
        "part_index": m.part_index,
        "part_count": m.part_count,
        "vector": np.asarray(chunk.vector, dtype=np.float32).tolist(),
    }
    if with_current:
        row["current"] = chunk.current
    if with_turn_lines:
        row["turn_lines"] = turn_lines.pack(chunk.turn_lines)
    if with_sparse:
        row["sparse"] = bm25.doc_vector(r.text)
    return row


def from_row(row: dict[str, Any]) -> StoredChunk:
    vector = row.get("vector")
    metadata = ChunkMetadata(
        conversation_id=row["conversation_id"],
        turn_range=TurnRange(int(row["start_turn"]), int(row["end_turn"])),
        timestamp_range=TimestampRange(row["ts_start"], row["ts_end"]),
        participants=tuple(row["participants"] or ()),
        speakers=tuple(row["speakers"] or ()),
        intent_tag=row["intent_tag"],
        chunk_version=int(row["chunk_version"]),
        deleted=bool(row["deleted"]),
        part_index=int(row["part_index"]),
        part_count=int(row["part_count"]),
    )
    return StoredChunk(
        ChunkRecord(row["chunk_id"], row["text"], metadata),
        row["content_hash"],
        None if vector is None else np.asarray(vector, dtype=np.float32),
        bool(row.get("current", True)),
        turn_lines.unpack(row.get("turn_lines")),
    )


# What a search returns of each candidate when it does not read whole records: its id
# and score, no field. pymilvus decodes each output field cell by cell in Python: one
# field of 300 candidates costs ~1.7 ms of CPU a list (benchmarks/archive/2026-11-28.md),
# more than the store's own search of one conversation. The log's layout says what each
# candidate holds, and the few records returned are read and compared with it.
CANDIDATE_FIELDS: list[str] = []


def candidates(hits: Any, whole: bool) -> list[Candidate]:
    if whole:
        return [
            Candidate(c.record.chunk_id, float(h["distance"]), c)
            for h in hits
            for c in (from_row(h["entity"]),)
        ]
    return [
        Candidate(str(cid), float(score))
        for cid, score in zip(hits.ids, hits.distances, strict=True)
    ]
