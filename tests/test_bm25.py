"""Keyword scoring memsvc computes itself (memsvc.domain.bm25): the analyzer, the tenants a
search spans, the blocks the log counts, and the score against BM25 written out by hand."""

from __future__ import annotations

import math

from memsvc.domain import bm25
from memsvc.storage.sql.term_docs import block_spans


def test_terms_are_lower_cased_stemmed_words_and_chinese_words() -> None:
    assert bm25.terms("She PAINTED sunsets, in 2023! e-mail") == [
        "she",
        "paint",
        "sunset",
        "in",
        "2023",
        "e",
        "mail",
    ]
    assert bm25.terms("我想订一张书桌") == ["我想订", "一张", "书桌"]
    assert bm25.terms("我的Python书") == ["我", "的", "python", "书"]


def test_chinese_runs_are_cut_as_jieba_cuts_them_long_or_repeated() -> None:
    """Short runs are cut once and remembered, long ones each time: the words are jieba's
    either way, in order."""
    import jieba

    short = "我想订一张书桌"
    long_run = "我下周要去东京旅行护照放哪里了" * 4  # past the remembered length
    text = f"{short}，{long_run}。{short}！"
    expected = [
        w for run in (short, long_run, short) for w in jieba.cut_for_search(run) if w.strip()
    ]
    assert len(long_run) > bm25.CACHED_HAN_RUN
    assert bm25.terms(text) == bm25.terms(text) == expected


def test_a_search_spans_the_tenants_of_its_ids_else_of_its_prefixes() -> None:
    assert bm25.tenant("acme/u1/s1") == "acme/" and bm25.tenant("plain") == ""
    assert bm25.tenants_of(["acme/1", "beta/2", "solo"], ["x/"]) == bm25.Tenants(
        names=frozenset({"acme/", "beta/", ""})
    )
    assert bm25.tenants_of([], ["acme/team1/", "beta/"]) == bm25.Tenants(
        names=frozenset({"acme/", "beta/"})
    )
    # a prefix without "/" spans `acme/...`, `acmeco/...`, and ids such as `acme7`
    assert bm25.tenants_of([], ["acme"]) == bm25.Tenants(frozenset({""}), ("acme",))
    assert bm25.tenants_of([], []) is bm25.EVERYONE


def test_blocks_are_whole_and_merge_where_they_touch() -> None:
    size = bm25.BLOCK_TURNS
    assert block_spans([(5, 5)]) == [(size, 2 * size - 1)]
    assert block_spans([(0, 0), (size, size), (5 * size, 5 * size + 1)]) == [
        (0, 2 * size - 1),
        (5 * size, 6 * size - 1),
    ]
    assert block_spans([(1, 10 * size)]) == [(0, 11 * size - 1)]
    assert block_spans([(2**63 - 1, 2**63 - 1)]) == [(2**63 - size, 2**63 - 1)]


def test_the_inner_product_is_bm25_over_the_tenants_documents() -> None:
    """A chunk's vector times the query's equals BM25 (k1 1.2, b 0.75) computed term by
    term, with the document frequencies and count of the tenant's documents."""
    turns = [
        ("t/1", 0, "user Ana: my puppy Biscuit likes the lake"),
        ("t/1", 4, "assistant Bot: the lake is cold in spring"),
        ("t/1", 8, "user Ana: Biscuit swam in the lake again"),
    ]
    blocks = bm25.block_documents(turns)
    changes = bm25.frequency_changes({}, blocks)
    documents = changes[("t/", bm25.DOCUMENTS)]
    frequencies = {term: n for (_, term), n in changes.items() if term != bm25.DOCUMENTS}
    chunk = "User (Ana): Biscuit swam in the lake again, the lake"
    query = "Biscuit lake lakes"
    weights = bm25.query_vector(bm25.term_counts(query), documents, frequencies)
    doc = bm25.doc_vector(chunk)
    score = sum(w * doc.get(t, 0.0) for t, w in weights.items())

    words = bm25.terms(chunk)
    expected = 0.0
    for word in bm25.terms(query):
        df = frequencies.get(bm25.term_id(word), 0)
        idf = math.log(1 + (documents - df + 0.5) / (df + 0.5))
        tf = words.count(word)
        # a length counts terms, spaces and punctuation, as Milvus's analyzer did
        length = len(words) + sum(1 for ch in chunk if not ch.isalnum())
        norm = 1.2 * (1 - 0.75 + 0.75 * length / bm25.AVERAGE_LENGTH)
        expected += idf * tf * 2.2 / (tf + norm)
    assert documents == 3 and frequencies[bm25.term_id("lake")] == 3
    assert math.isclose(score, expected, rel_tol=1e-12)


def test_a_long_turn_fills_several_documents_and_short_ones_share_one() -> None:
    most = bm25.DOCUMENT_TERMS
    long_turn = " ".join(f"w{i}" for i in range(2 * most + 40))
    blocks = bm25.block_documents(
        [("c", 0, "alpha beta"), ("c", 1, long_turn), ("c", 2, "gamma"), ("c", 5, "delta")]
    )
    sizes = [len(d) for d in blocks[("c", 0)]]
    assert sizes == [2, most, most, 41]  # the long turn's tail and "gamma" share one
    assert [len(d) for d in blocks[("c", 1)]] == [1]
    changes = bm25.frequency_changes(blocks, {("c", 1): [{bm25.term_id("delta")}]})
    assert changes == {
        ("", bm25.DOCUMENTS): -4,
        **{("", t): -1 for d in blocks[("c", 0)] for t in d},
    }
