"""A chunk's turn lines (memsvc.domain.records.TurnLines) in one VARCHAR cell: turn ids
and line starts as numbers, the turns' vectors as half floats in base64. Half precision
halves the cell (a window of 4 turns of 384 dimensions: ~4 KB) and changes a cosine by
less than 0.001: the vectors only rank a window's own turns against each other.
"" is a chunk without them: one turn, or written before schema 4."""

from __future__ import annotations

import base64
import json

import numpy as np

from memsvc.domain.records import TurnLines

# Milvus's VARCHAR limit; a window too wide for it is stored without its turn lines.
MAX_CELL_CHARS = 65_535


def pack(lines: TurnLines | None) -> str:
    if lines is None:
        return ""
    half = np.asarray(lines.vectors, dtype="<f2")
    cell = json.dumps(
        {
            "t": list(lines.turn_ids),
            "s": list(lines.starts),
            "d": int(half.shape[1]),
            "v": base64.b64encode(half.tobytes()).decode("ascii"),
        },
        separators=(",", ":"),
    )
    return cell if len(cell) <= MAX_CELL_CHARS else ""


def unpack(cell: str | None) -> TurnLines | None:
    if not cell:
        return None
    found = json.loads(cell)
    half = np.frombuffer(base64.b64decode(found["v"]), dtype="<f2")
    # Left in half precision: a record read with its lines may stay in memory (recent
    # records); the cosine against a float32 query is computed in float32.
    vectors = half.reshape(len(found["t"]), int(found["d"]))
    return TurnLines(tuple(found["t"]), tuple(found["s"]), vectors)
