"""What a hit says, as the adapters hand it to a framework."""

from __future__ import annotations

from memsvc_client.v1 import memory_pb2 as pb

# the chunk's context line, as memsvc writes it in English and in Chinese
# (memsvc.domain.prefix): `[Context: ...]`, `[上下文：...]`
CONTEXT_LINES = ("[Context:", "[上下文：")


def said_lines(hit: pb.Hit) -> list[str]:
    """The hit's non-empty lines without the chunk's context line: the adapters give the
    day and speakers from the hit's metadata instead."""
    lines = [line for line in hit.text.splitlines() if line.strip()]
    if lines and lines[0].startswith(CONTEXT_LINES):
        return lines[1:]
    return lines
