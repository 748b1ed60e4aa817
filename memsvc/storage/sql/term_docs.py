"""Keyword statistics per tenant (memsvc.domain.bm25): how many documents (blocks of
consecutive live turns) of a tenant hold each term, and how many it has (term DOCUMENTS).
Changed in the transaction that writes or deletes the turns, so they always equal a count
over the live events: a store rebuilt from the log scores as before, and no tenant's figures
count another's turns.

- term_docs: (tenant, term id) -> documents holding it; a row that reaches 0 is deleted, so
  nothing of a deleted turn stays, not even the hash of a word only it held.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from memsvc.domain import bm25
from memsvc.ports import Span
from memsvc.storage.sql.connection import Sql, chunked, marks

_DOCUMENT = "conversation_id, turn_id, timestamp, speaker, speaker_name, clean_text"


def _documents(rows: Iterable[Sequence[object]]) -> Iterator[tuple[str, int, str]]:
    for r in rows:
        yield (
            str(r[0]),
            int(str(r[1])),
            bm25.turn_document(str(r[2]), str(r[3]), str(r[4]), str(r[5])),
        )


def block_spans(spans: Iterable[Span]) -> list[Span]:
    """These turn spans widened to whole blocks, merged where they touch."""
    size = bm25.BLOCK_TURNS
    out: list[Span] = []
    for start, end in sorted((s // size * size, (e // size + 1) * size - 1) for s, e in spans):
        if out and start <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


class TermQueries:
    sql: Sql
    # Changes to write when the transaction ends (`write_term_counts`).
    term_changes: Counter[tuple[str, int]]

    @contextmanager
    def counting_terms(self, conversation_id: str, spans: Sequence[Span] | None) -> Iterator[None]:
        """Counts what the body changes in the blocks of these turn spans (of the whole
        conversation when None): their terms are read before it and after it."""
        if spans is not None:
            spans = block_spans(spans)
        before = self._block_documents(conversation_id, spans)
        yield
        after = self._block_documents(conversation_id, spans)
        self.term_changes.update(bm25.frequency_changes(before, after))

    def _block_documents(
        self, conversation_id: str, spans: Sequence[Span] | None
    ) -> dict[bm25.Block, list[set[int]]]:
        query = f"SELECT {_DOCUMENT} FROM events WHERE conversation_id = ? AND deleted = 0"
        if spans is None:
            return bm25.block_documents(_documents(self.sql.rows(query, (conversation_id,))))
        rows: list[Sequence[object]] = []
        for start, end in spans:
            rows += self.sql.rows(
                f"{query} AND turn_id BETWEEN ? AND ?", (conversation_id, start, end)
            )
        return bm25.block_documents(_documents(rows))

    def write_term_counts(self) -> None:
        """All of a transaction's changes at its end, rows in key order: two writers never
        wait on each other's rows in a cycle (on a database that locks rows), and the rows
        most writers share (a tenant's document count) are held only until the commit."""
        changes = sorted((k, n) for k, n in self.term_changes.items() if n)
        self.term_changes.clear()
        if not changes:
            return
        self.sql.many(
            "INSERT INTO term_docs (tenant, term, docs) VALUES (?, ?, ?)"
            " ON CONFLICT (tenant, term) DO UPDATE SET docs = term_docs.docs + excluded.docs",
            ((who, term, n) for (who, term), n in changes),
        )
        gone = [(who, term) for (who, term), n in changes if n < 0]
        if gone:
            self.sql.many("DELETE FROM term_docs WHERE tenant = ? AND term = ? AND docs <= 0", gone)

    def term_frequencies(
        self, tenants: bm25.Tenants, term_ids: Sequence[int]
    ) -> tuple[int, dict[int, int]]:
        """(documents, {term: documents holding it}) over the tenants a search spans."""
        where: list[str] = []
        params: list[object] = []
        if not tenants.everyone:
            if tenants.names:
                where.append(f"tenant IN ({marks(len(tenants.names))})")
                params += sorted(tenants.names)
            for start in tenants.starts:
                where.append("(tenant >= ? AND tenant < ?)")
                params += [start, start + "\U0010ffff"]
            if not where:
                return 0, {}
        scope = f"({' OR '.join(where)}) AND " if where else ""
        wanted = sorted({*term_ids, bm25.DOCUMENTS})
        counts: dict[int, int] = {}
        for part in chunked(wanted):
            for term, docs in self.sql.rows(
                f"SELECT term, SUM(docs) FROM term_docs WHERE {scope}term IN"
                f" ({marks(len(part))}) GROUP BY term",
                (*params, *part),
            ):
                counts[int(term)] = int(docs)
        return counts.pop(bm25.DOCUMENTS, 0), counts


def count_all_terms(sql: Sql) -> None:
    """Fills term_docs from the live events (a log from before it kept them)."""
    after = ("", -1)
    totals: Counter[tuple[str, int]] = Counter()
    while True:
        rows = sql.rows(
            f"SELECT {_DOCUMENT} FROM events WHERE deleted = 0 AND"
            " (conversation_id > ? OR (conversation_id = ? AND turn_id > ?))"
            " ORDER BY conversation_id, turn_id LIMIT 2000",
            (after[0], after[0], after[1]),
        )
        if not rows:
            break
        last = (str(rows[-1][0]), int(rows[-1][1]))
        # whole blocks only: the last block may go on in the next page
        block_end = (last[1] // bm25.BLOCK_TURNS + 1) * bm25.BLOCK_TURNS - 1
        rows += sql.rows(
            f"SELECT {_DOCUMENT} FROM events WHERE deleted = 0 AND conversation_id = ?"
            " AND turn_id > ? AND turn_id <= ?",
            (last[0], last[1], block_end),
        )
        totals.update(bm25.frequency_changes({}, bm25.block_documents(_documents(rows))))
        after = (last[0], block_end)
    sql.many(
        "INSERT INTO term_docs (tenant, term, docs) VALUES (?, ?, ?)",
        ((who, term, n) for (who, term), n in sorted(totals.items()) if n > 0),
    )
