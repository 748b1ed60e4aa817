"""Deterministic chunk ids (the formula is documented in proto/memsvc/v1/memory.proto)."""

from __future__ import annotations

import hashlib

_SEP = "\x1f"


def chunk_id(
    conversation_id: str, start_turn: int, end_turn: int, chunk_version: int, part_index: int = 0
) -> str:
    key = _SEP.join((conversation_id, str(start_turn), str(end_turn), str(chunk_version)))
    if part_index:
        key += _SEP + str(part_index)
    return "chk_" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
