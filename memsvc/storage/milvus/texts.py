"""Chunk texts kept beside a Milvus Lite file rather than in its rows.

Milvus Lite 2.5.1 holds every row of a loaded collection in memory, ~4.4 KB a chunk at a
million, 0.66 KB of it the text, which nothing but the hits read back: memsvc writes the
keyword vectors itself. A collection made on Milvus Lite (marked `text_beside`) keeps in
each row's `text` a reference, the first 15 hex digits of the text's BLAKE2b (inside the
short-string buffer of Milvus's strings: no allocation), and the text in this SQLite file,
keyed by the collection's store id and the chunk id: one text per chunk, so a chunk written
again leaves no earlier text behind, and a delete removes it here first.

A row whose reference is not the hash of the text kept for it (the text written, the row
not yet: a write cut short) reads as absent until the write is finished (the index step's
durable work); a store whose rows hold references while this file holds none of its texts
(the file lost, or another in its place) is made again and rebuilt from the event log
(memsvc.storage.milvus.collection). A Milvus server keeps the text in its rows:
replicas share the server, not this file."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from memsvc.storage.sqlite.database import SqliteDatabase

REFERENCE_CHARS = 15
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS row_texts (store TEXT NOT NULL, chunk_id TEXT NOT NULL,"
    " text TEXT NOT NULL, PRIMARY KEY (store, chunk_id)) WITHOUT ROWID"
)
_IN_ONE_QUERY = 500


def path_beside(uri: str) -> Path:
    return Path(uri).with_suffix(".texts.sqlite")


def reference(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()[:REFERENCE_CHARS]


class ChunkTexts:
    """The texts of the collections on one Milvus Lite file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # FULL: a row whose text was lost (a power cut) would read as absent with nothing
        # left to write it again; a row lost with its text is rewritten (the store audit)
        self._db = SqliteDatabase(path, synchronous="FULL")
        with self._db.transaction() as sql:
            sql.run(_SCHEMA)

    def put(self, store: str, texts: Iterable[tuple[str, str]]) -> None:
        """(chunk id, text) pairs, each replacing the chunk's text before."""
        with self._db.transaction() as sql:
            sql.many(
                "INSERT INTO row_texts (store, chunk_id, text) VALUES (?, ?, ?)"
                " ON CONFLICT (store, chunk_id) DO UPDATE SET text = excluded.text",
                ((store, cid, text) for cid, text in texts),
            )

    def get(self, store: str, chunk_ids: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        ids = list(dict.fromkeys(chunk_ids))
        with self._db.snapshot() as sql:
            for start in range(0, len(ids), _IN_ONE_QUERY):
                part = ids[start : start + _IN_ONE_QUERY]
                marks = ",".join("?" * len(part))
                out.update(
                    sql.rows(
                        f"SELECT chunk_id, text FROM row_texts WHERE store = ?"
                        f" AND chunk_id IN ({marks})",
                        (store, *part),
                    )
                )
        return out

    def delete(self, store: str, chunk_ids: Sequence[str]) -> None:
        with self._db.transaction() as sql:
            sql.many(
                "DELETE FROM row_texts WHERE store = ? AND chunk_id = ?",
                ((store, cid) for cid in chunk_ids),
            )

    def drop(self, store: str) -> None:
        """Every text of a store (its collection dropped)."""
        with self._db.transaction() as sql:
            sql.run("DELETE FROM row_texts WHERE store = ?", (store,))

    def drop_all_but(self, stores: Iterable[str]) -> int:
        """Texts of stores no collection on the file has any more (dropped while this
        process was not running); returns how many."""
        keep = list(stores)
        # no store left: every row (`NOT IN (NULL)` would keep every one)
        where = f" WHERE store NOT IN ({','.join('?' * len(keep))})" if keep else ""
        with self._db.transaction() as sql:
            return sql.run(f"DELETE FROM row_texts{where}", keep)

    def holds(self, store: str) -> bool:
        with self._db.snapshot() as sql:
            found = sql.one("SELECT 1 FROM row_texts WHERE store = ? LIMIT 1", (store,))
        return found is not None

    def erase(self) -> None:
        """Rewrite the file without the pages deleted texts held."""
        self._db.erase()

    def close(self) -> None:
        self._db.close()
