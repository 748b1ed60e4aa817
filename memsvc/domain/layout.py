"""A version's windows planned from live turns (memsvc.domain.chunking) and rendered into
chunk records (memsvc.domain.rendering) where the store may lack them: the part of an
index step that is the same text in, the same records out. It runs in the server, or in
a render process beside it (memsvc.services.render_processes), with the same result."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from memsvc.domain.chunking import StoredTurn, plan_windows
from memsvc.domain.rendering import ChunkRenderer
from memsvc.domain.types import ChunkRecord


@dataclass(frozen=True)
class PlannedWindow:
    chunk_id: str
    source_hash: str  # of everything its record is derived from (ChunkWindow.source_hash)
    start_turn: int
    end_turn: int
    record: ChunkRecord | None  # None: the store holds this window's record as it would be


def lay_out(
    renderer: ChunkRenderer,
    conversation_id: str,
    version: int,
    turns: Sequence[StoredTurn],
    stored: Mapping[str, str],
) -> list[PlannedWindow]:
    """The windows of `turns` (live, sorted by turn id), each rendered unless `stored`
    (chunk id -> source hash of the layout rows the store holds as rendered) maps its id
    to its source hash: an unchanged, indexed window is not rendered again."""
    policy = renderer.policy
    out = []
    for w in plan_windows(turns, policy, renderer.count_tokens):
        cid = w.chunk_id(conversation_id, version)
        source = w.source_hash(version, policy)
        record = None if stored.get(cid) == source else renderer.render(conversation_id, w, version)
        out.append(PlannedWindow(cid, source, w.start_turn, w.end_turn, record))
    return out
