"""Passage vectors keyed by (model, SHA-256 of text): unchanged text never runs the model
again (memsvc.ports.EmbeddingCache). Table `vectors` (model, text_hash, vector bytes)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from memsvc.storage.sql.connection import Database, chunked, marks

# The models holding vectors, read from the key's first column one model at a time (a few
# lookups however many rows: neither SQLite nor PostgreSQL 15 skips through an index).
MODELS = """
WITH RECURSIVE m(model) AS (
    SELECT MIN(model) FROM vectors
    UNION ALL
    SELECT (SELECT MIN(v.model) FROM vectors v WHERE v.model > m.model) FROM m
    WHERE m.model IS NOT NULL
)
SELECT model FROM m WHERE model IS NOT NULL
"""


class SqlEmbeddingCache:
    def __init__(self, database: Database) -> None:
        self.database = database

    def get_many(self, model: str, hashes: Sequence[str]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        with self.database.snapshot() as sql:
            for part in chunked(list(dict.fromkeys(hashes))):
                for h, blob in sql.rows(
                    "SELECT text_hash, vector FROM vectors WHERE model = ?"
                    f" AND text_hash IN ({marks(len(part))})",
                    (model, *part),
                ):
                    out[str(h)] = np.frombuffer(bytes(blob), dtype=np.float32)
        return out

    def put_many(self, model: str, items: Mapping[str, np.ndarray]) -> None:
        if not items:
            return
        with self.database.transaction() as sql:
            sql.many(
                "INSERT INTO vectors (model, text_hash, vector) VALUES (?,?,?)"
                " ON CONFLICT (model, text_hash) DO UPDATE SET vector = excluded.vector",
                ((model, h, np.asarray(v, dtype=np.float32).tobytes()) for h, v in items.items()),
            )

    def forget(self, hashes: Sequence[str]) -> None:
        """Each hash's vectors, of every model. By (model, hash), the table's key: a delete
        by hash alone read the whole table for each (a purge of one conversation spent
        0.3-3.9 s in it beside a million cached vectors)."""
        if not hashes:
            return
        with self.database.transaction() as sql:
            models = [str(m) for (m,) in sql.rows(MODELS)]
            sql.many(
                "DELETE FROM vectors WHERE model = ? AND text_hash = ?",
                ((m, h) for m in models for h in hashes),
            )

    def forget_model(self, model: str) -> int:
        with self.database.transaction() as sql:
            row = sql.one("SELECT COUNT(*) FROM vectors WHERE model = ?", (model,))
            sql.run("DELETE FROM vectors WHERE model = ?", (model,))
        return int(row[0]) if row else 0

    def count(self) -> int:
        with self.database.snapshot() as sql:
            row = sql.one("SELECT COUNT(*) FROM vectors")
        return int(row[0]) if row else 0

    def erase(self) -> None:
        """Leave no forgotten vector in the cache's files."""
        self.database.erase()

    def close(self) -> None:
        self.database.close()
