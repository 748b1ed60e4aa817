"""Chunk texts kept beside a Milvus Lite file (memsvc.storage.milvus.texts): the rows hold
references, reads return the texts, a chunk keeps one text, deletes and drops leave none,
a write cut short reads as absent, and a lost file makes the store rebuild from the log (a
Milvus server keeps texts in its rows: tests/test_store.py, test_remote_milvus_uri)."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from memsvc.domain.hashing import content_hash
from memsvc.domain.records import StoredChunk
from memsvc.domain.types import SearchFilters
from memsvc.ports import SearchScope
from memsvc.storage.milvus import texts
from memsvc.storage.milvus.previous import PreviousCollection
from memsvc.storage.milvus.store import MilvusChunkStore as ChunkStore
from tests.test_store import _probe_vectors, ident, keyword, record


def rewritten(chunk: StoredChunk, text: str) -> StoredChunk:
    r = replace(chunk.record, text=text)
    return replace(chunk, record=r, content_hash=content_hash(r))


def texts_held(db: Path) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(texts.path_beside(str(db)))
    try:
        return sorted(conn.execute("SELECT store, chunk_id, text FROM row_texts").fetchall())
    finally:
        conn.close()


def files_hold(directory: Path, needle: str) -> list[str]:
    return [
        str(p) for p in directory.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()
    ]


def test_rows_hold_references_and_every_read_returns_the_text(tmp_path: Path) -> None:
    store = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"), shards=2)
    chunks = [record(f"c{i}", 0, f"Melanie painted sunrise number {i}") for i in range(4)]
    store.upsert(chunks)
    assert store.text_beside
    for name in store.shards.names:
        for row in store._client.query(name, filter="", output_fields=["text"], limit=10):
            assert row["text"] in {texts.reference(c.record.text) for c in chunks}
    got = store.get([c.record.chunk_id for c in chunks])
    assert {cid: s.record for cid, s in got.items()} == {
        c.record.chunk_id: c.record for c in chunks
    }
    assert [c.record for c in store.chunks_of("c2")] == [chunks[2].record]
    found = keyword(store, "sunrise", SearchScope(), 10)
    assert len(found) == 4
    one = SearchScope(filters=SearchFilters(conversation_ids=("c1",)))
    whole = store.search_dense(chunks[1].vector, one, 5, whole=True)
    assert [c.stored.record.text for c in whole if c.stored] == [chunks[1].record.text]
    store.close()


def test_a_chunk_written_again_keeps_one_text(tmp_path: Path) -> None:
    store = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"))
    first = record("c1", 0, "my passport expires in February")
    store.upsert([first])
    second = rewritten(first, "my passport expires in March")
    store.upsert([second])
    assert [t for _, _, t in texts_held(tmp_path / "m.db")] == [second.record.text]
    assert store.get([first.record.chunk_id])[first.record.chunk_id].record == second.record
    store.close()


def test_deleted_chunks_leave_no_text_in_any_file_after_an_erasing_close(tmp_path: Path) -> None:
    store = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"))
    secret, kept = record("c1", 0, "the vault code is zanzibar"), record("c2", 0, "hello")
    store.upsert([secret, kept])
    store.delete([secret.record.chunk_id], ["c1"])
    assert store.get([secret.record.chunk_id]) == {}
    store.close(erase=True)
    assert files_hold(tmp_path, "zanzibar") == []
    again = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"))
    assert again.get([kept.record.chunk_id])[kept.record.chunk_id].record == kept.record
    again.close()


def test_a_write_cut_short_reads_as_absent_until_it_is_finished(tmp_path: Path) -> None:
    """The text is written before the row; between the two, the row references the text
    before: it reads as not yet written, never as the old row with the new text."""
    store = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"))
    first = record("c1", 0, "we met in Osaka")
    store.upsert([first])
    second = rewritten(first, "we met in Kyoto")
    assert store._texts is not None
    store._texts.put(store.store_id, [(second.record.chunk_id, second.record.text)])
    cid = first.record.chunk_id
    assert store.get([cid]) == {}
    assert store.chunks_of("c1") == []
    store.upsert([second])  # the durable work finishing the write
    assert store.get([cid])[cid].record == second.record
    store.close()


@pytest.mark.parametrize("loss", ["removed", "another file in its place"])
def test_a_lost_file_of_texts_makes_the_store_again_to_be_rebuilt(
    tmp_path: Path, loss: str
) -> None:
    store = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"), shards=2)
    store.upsert([record(f"c{i}", 0, f"text {i}") for i in range(4)])
    before = store.identity
    store.close()
    beside = texts.path_beside(str(tmp_path / "m.db"))
    for part in beside.parent.glob(beside.name + "*"):
        part.unlink()
    if loss != "removed":
        texts.ChunkTexts(beside).close()
    with capture_logs() as logs:
        again = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"), shards=2)
    assert any(e["event"] == "store_texts_lost" for e in logs)
    assert again.identity != before  # the log sees another store: every conversation rebuilt
    assert again.count(deleted=None) == 0
    again.upsert([record("c9", 0, "written again")])
    again.close()
    reopened = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"), shards=2)
    assert reopened.identity == again.identity  # its texts are there: kept
    reopened.close()


def test_texts_of_dropped_collections_are_dropped(tmp_path: Path) -> None:
    db = str(tmp_path / "m.db")
    old = ChunkStore(db, "c", ident("m", fingerprint=_probe_vectors(1)))
    old.upsert([record("c1", 0, "written by the model before")])
    old_id = old.store_id
    old.close()
    # another model: a successor beside, the move's previous collection then dropped
    new = ChunkStore(db, "c", ident("m", fingerprint=_probe_vectors(2)))
    new.upsert([record("c1", 0, "written by the model now")])
    previous = PreviousCollection(new, "c", ident("m", fingerprint=_probe_vectors(1)))
    assert previous.get([record("c1", 0, "").record.chunk_id])
    previous.drop()
    assert {s for s, _, _ in texts_held(tmp_path / "m.db")} == {new.store_id}
    assert old_id != new.store_id
    # a collection dropped while no store had the file open: its texts go at the next open
    new._client.drop_collection(new.collection)
    new.close()
    ChunkStore(db, "other", ident("m")).close()
    assert texts_held(tmp_path / "m.db") == []
