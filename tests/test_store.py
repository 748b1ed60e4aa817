from __future__ import annotations

import socket
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from memsvc.domain import bm25
from memsvc.domain.errors import FailedPrecondition
from memsvc.domain.hashing import content_hash
from memsvc.domain.ids import chunk_id
from memsvc.domain.model_identity import ModelIdentity, encode_fingerprint
from memsvc.domain.records import StoredChunk
from memsvc.domain.types import ChunkMetadata, ChunkRecord, SearchFilters, TimestampRange, TurnRange
from memsvc.ports import SearchScope
from memsvc.storage.milvus.expressions import quote
from memsvc.storage.milvus.store import MilvusChunkStore as ChunkStore

DIM = 8


def ident(
    model: str,
    provider: str = "local",
    dim: int = DIM,
    fingerprint: list[list[float]] | None = None,
) -> ModelIdentity:
    return ModelIdentity(
        provider, model, dim, encode_fingerprint(fingerprint) if fingerprint else ""
    )


def record(conv: str, start: int, text: str, deleted: bool = False) -> StoredChunk:
    meta = ChunkMetadata(
        conversation_id=conv,
        turn_range=TurnRange(start, start + 1),
        timestamp_range=TimestampRange("2026-02-02T10:00:00+08:00", "2026-02-02T10:01:00+08:00"),
        participants=("Ana",),
        speakers=("user", "assistant"),
        intent_tag="other",
        chunk_version=1,
        deleted=deleted,
    )
    r = ChunkRecord(chunk_id(conv, start, start + 1, 1), text, meta)
    vec = np.random.default_rng(start).random(DIM).astype(np.float32)
    return StoredChunk(r, content_hash(r), vec / np.linalg.norm(vec))


def test_quote_escapes_quotes_and_backslashes() -> None:
    assert quote('a"b') == '"a\\"b"'
    assert quote("a\\b") == '"a\\\\b"'


@pytest.mark.parametrize(
    "evil", ['" or 1==1 or "', 'x" or conversation_id != "', "\\", 'a\\" or 1==1 or \\"']
)
def test_injection_never_widens_a_filter(tmp_path: Path, evil: str) -> None:
    store = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"))
    store.upsert([record("victim", 0, "secret"), record(evil, 2, "mine")])
    expr = SearchScope(SearchFilters(conversation_ids=(evil,)))
    found = store.chunks_of(evil)
    assert [c.record.metadata.conversation_id for c in found] == [evil]
    hits = store.search_dense(np.ones(DIM, dtype=np.float32), expr, 10)
    assert [c.chunk_id for c in hits] == [found[0].record.chunk_id] and hits[0].stored is None
    whole = store.search_dense(np.ones(DIM, dtype=np.float32), expr, 10, whole=True)
    assert [c.stored.record if c.stored else None for c in whole] == [found[0].record]
    store.close()


def test_upsert_get_query_and_replace(tmp_path: Path) -> None:
    store = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"))
    rows = [record("c1", i * 2, f"text {i}") for i in range(5)]
    store.upsert(rows)
    store.upsert(rows)  # replay: no new rows
    assert store.count() == 5
    got = store.get([rows[0].record.chunk_id], with_vectors=True)[rows[0].record.chunk_id]
    assert got.record == rows[0].record
    assert got.vector is not None and np.allclose(got.vector, rows[0].vector)
    store.set_deleted([got])
    assert store.count(deleted=True) == 1
    assert len(store.chunks_of("c1", deleted=False)) == 4
    store.delete([r.record.chunk_id for r in rows[:2]])
    assert store.count() == 3
    store.close()


def lookup_plan(milvus_file: Path, collection: str) -> str:
    """How Milvus Lite's SQLite finds the rows a delete or an upsert replaces."""
    conn = sqlite3.connect(milvus_file, timeout=30)
    try:
        plan = conn.execute(
            f"EXPLAIN QUERY PLAN DELETE FROM \"{collection}\" WHERE milvus_id IN ('a', 'b')"
        ).fetchall()
    finally:
        conn.close()
    return " ".join(str(row[-1]) for row in plan)


def test_milvus_lite_finds_replaced_rows_by_an_index_not_a_scan(tmp_path: Path) -> None:
    """Regression (scale v2): Milvus Lite 2.5 found the rows a delete or an upsert replaces
    by scanning its whole SQLite table, so every write cost ~3 ms per 1,000 chunks held.
    The store indexes that key on a new file, on a file made before the fix, and on a
    collection made anew at a reconnection (a store that came back empty)."""
    path = tmp_path / "m.db"
    store = ChunkStore(str(path), "c", ident("m"))
    assert "USING INDEX c_milvus_id" in lookup_plan(path, "c")
    rows = [record("c1", i * 2, f"text {i}") for i in range(3)]
    store.upsert(rows)
    store.close()
    with sqlite3.connect(path) as conn:  # as a file written before the fix
        conn.execute('DROP INDEX "c_milvus_id"')
    assert "SCAN c" in lookup_plan(path, "c")
    store = ChunkStore(str(path), "c", ident("m"))
    assert "USING INDEX c_milvus_id" in lookup_plan(path, "c")
    store.upsert(rows[:1])  # replaced, not doubled
    store.delete([rows[1].record.chunk_id])
    assert store.count() == 2
    store._client.drop_collection("c")
    assert store.reconnect()
    assert "USING INDEX c_milvus_id" in lookup_plan(path, "c")
    store.close()


def slow_milvus_lite(bin_dir: Path, seconds: float) -> Path:
    """A directory for milvus_lite's BIN_PATH whose `milvus` waits, then runs the real one:
    a Milvus Lite process that opens its socket late, as on a loaded machine."""
    from milvus_lite.server import BIN_PATH

    real = Path(BIN_PATH).absolute()
    bin_dir.mkdir()
    script = bin_dir / "milvus"
    script.write_text(
        f'#!/bin/sh\nsleep {seconds}\nLD_LIBRARY_PATH="{real}:$LD_LIBRARY_PATH" exec'
        f' "{real / "milvus"}" "$@"\n'
    )
    script.chmod(0o755)
    return bin_dir


def test_a_milvus_lite_slow_to_open_its_socket_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (a `make test` on 2 cores): Milvus Lite's manager calls its process
    started after 0.5 s; one that had not yet opened its socket failed the store's first
    call ("No such file or directory"). The store waits for the socket."""
    monkeypatch.setenv("BIN_PATH", str(slow_milvus_lite(tmp_path / "bin", 1.5)))
    store = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"))
    store.upsert([record("c1", 0, "a late start")])
    assert store.count() == 1
    store.close()


def test_a_milvus_lite_that_exits_at_start_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "milvus").write_text("#!/bin/sh\nsleep 0.7\nexit 3\n")
    (bin_dir / "milvus").chmod(0o755)
    monkeypatch.setenv("BIN_PATH", str(bin_dir))
    with pytest.raises(RuntimeError, match=r"Milvus Lite on .*m\.db exited"):
        ChunkStore(str(tmp_path / "m.db"), "c", ident("m"))
    # released: a start with the real binary then works on the same file
    monkeypatch.delenv("BIN_PATH")
    store = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"))
    assert store.count() == 0
    store.close()


def keyword(store: ChunkStore, text: str, scope: SearchScope, limit: int) -> list[Any]:
    """A keyword search whose terms all weigh their repeats (IDF 1 each)."""
    weights = {t: float(n) for t, n in bm25.term_counts(text).items()}
    return store.search_keyword(bm25.KeywordQuery(text, weights), scope, limit)


def test_keyword_search_is_case_insensitive_and_filtered(tmp_path: Path) -> None:
    store = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"))
    store.upsert(
        [
            record("c1", 0, "Caroline went to the LGBTQ support group"),
            record("c1", 2, "我的护照在抽屉里"),
            record("c2", 4, "caroline likes painting"),
            record("c1", 6, "caroline deleted memory", deleted=True),
        ]
    )
    expr = SearchScope(SearchFilters(conversation_ids=("c1",)))
    hits = keyword(store, "CAROLINE", expr, 10)
    assert [c.chunk_id for c in hits] == [chunk_id("c1", 0, 1, 1)]
    zh = keyword(store, "护照", expr, 10)
    assert [c.chunk_id for c in zh] == [chunk_id("c1", 2, 3, 1)]
    store.close()


def test_keyword_search_stems_english_and_keeps_chinese_words(tmp_path: Path) -> None:
    store = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"))
    store.upsert(
        [
            record("c1", 0, "Melanie painted a sunrise last year"),
            record("c1", 2, "她喜欢画画和旅行"),
            record("c1", 4, "nothing to see"),
        ]
    )
    for query in ("paintings", "PAINTING", "paints"):
        found = keyword(store, query, SearchScope(), 10)
        assert [c.chunk_id for c in found] == [chunk_id("c1", 0, 1, 1)]
    assert [c.chunk_id for c in keyword(store, "旅行", SearchScope(), 10)] == [
        chunk_id("c1", 2, 3, 1)
    ]
    store.close()


def test_collection_of_an_older_schema_keeps_working_and_says_how_to_upgrade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memsvc.storage.milvus.schema as store_module

    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 1)
    monkeypatch.setattr(store_module, "KEYWORD_ANALYZER", {"tokenizer": "jieba"})
    old = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"))
    old.upsert([record("c1", 0, "Melanie painted a sunrise")])
    old.close()
    monkeypatch.undo()
    with capture_logs() as logs:
        store = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"))
    assert store.schema_version == 1
    warning = next(e for e in logs if e["event"] == "collection_schema_old")
    assert "MEMSVC_COLLECTION" in warning["remedy"]
    # Its own analyzer still answers: exact words match, stems do not.
    assert len(keyword(store, "painted", SearchScope(), 10)) == 1
    assert keyword(store, "paints", SearchScope(), 10) == []
    store.close()


def test_a_collection_made_again_with_other_fields_is_written_as_it_now_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows go to Milvus as columns packed against the collection's description, asked once
    (memsvc.storage.milvus.columns): a collection dropped and made again with other fields
    (here an older schema's) is described again, not refused."""
    import memsvc.storage.milvus.schema as store_module

    store = ChunkStore(str(tmp_path / "m.db"), "c", ident("m"))
    store.upsert([record("c1", 0, "Melanie painted a sunrise")])
    store._client.drop_collection("c")
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 1)
    monkeypatch.setattr(store_module, "KEYWORD_ANALYZER", {"tokenizer": "jieba"})
    assert store.reconnect()
    assert store.schema_version == 1
    store.upsert([record("c1", 2, "Caroline went to a support group")])
    assert store.count() == 1
    assert len(keyword(store, "support", SearchScope(), 10)) == 1
    store.close()


def test_another_model_gets_a_collection_of_its_own_beside(tmp_path: Path) -> None:
    """Vectors of two models are never mixed: another model (or dimension) than the one
    that wrote the configured collection writes a successor beside it (a model move,
    memsvc.services.model_move), and a later start of that model finds it there."""
    ChunkStore(str(tmp_path / "m.db"), "c", ident("model-a")).close()
    other = ChunkStore(str(tmp_path / "m.db"), "c", ident("org/Model-B"))
    assert (other.base_collection, other.collection) == ("c", f"c__model_b_{DIM}")
    other.close()
    wider = ChunkStore(str(tmp_path / "m.db"), "c", ident("model-a", dim=DIM * 2))
    assert wider.collection == f"c__model_a_{DIM * 2}"
    wider.close()
    again = ChunkStore(str(tmp_path / "m.db"), "c", ident("model-a"))
    assert again.collection == "c"
    again.close()


def _probe_vectors(seed: int) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    return [list(v / np.linalg.norm(v)) for v in rng.normal(size=(3, DIM))]


def test_the_fingerprint_decides_whatever_the_names(tmp_path: Path) -> None:
    """Other name (the local model moved to a server), same vectors: served, identity
    unchanged, so nothing is rebuilt. Same name, other weights: another model."""
    a = _probe_vectors(1)
    first = ChunkStore(str(tmp_path / "m.db"), "c", ident("m", fingerprint=a))
    identity = first.identity
    first.close()
    nearly_a = [list(np.asarray(v) + 1e-4) for v in a]
    with capture_logs() as logs:
        served = ChunkStore(
            str(tmp_path / "m.db"), "c", ident("minilm", "openai", fingerprint=nearly_a)
        )
    assert served.identity == identity
    assert any(e["event"] == "collection_model_alias" for e in logs)
    served.close()
    # new weights under the name: a successor of their own; a third set of weights under
    # it finds the successor written by the second: refused, naming both
    second = ChunkStore(str(tmp_path / "m.db"), "c", ident("m", fingerprint=_probe_vectors(2)))
    assert second.collection == f"c__m_{DIM}"
    second.close()
    with pytest.raises(FailedPrecondition) as refused:
        ChunkStore(str(tmp_path / "m.db"), "c", ident("m", fingerprint=_probe_vectors(3)))
    message = str(refused.value)
    assert "local model 'm'" in message and "cosine" in message
    assert "MEMSVC_COLLECTION" in message


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_remote_milvus_uri(tmp_path: Path) -> None:
    """The same code against a Milvus server (milvus-lite's own TCP server)."""
    from milvus_lite.server import Server

    port = _free_port()
    server = Server(str(tmp_path / "remote.db"), f"127.0.0.1:{port}")
    assert server.init()
    assert server.start()
    try:
        store = ChunkStore(f"http://127.0.0.1:{port}", "c", ident("m"))
        store.upsert([record("c1", 0, "hello remote")])
        assert store.count() == 1
        # a server keeps the text in its rows: replicas share it, not a file beside
        assert not store.text_beside
        rows = store._client.query("c", filter="", output_fields=["text"], limit=1)
        assert rows[0]["text"] == "hello remote"
        assert keyword(store, "remote", SearchScope(), 5)[0][0] == chunk_id("c1", 0, 1, 1)
        store.close()
    finally:
        server.stop()
