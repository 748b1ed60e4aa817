"""What the tests of the write path's guarantees share (tests/test_unfinished_work.py,
test_erasure, test_chunk_versions, test_normal_form, test_deletes, test_search_filters,
test_tenants, test_store_audit): a secret to look for, what a conversation holds live,
what every search mode finds, a synchronous build and upsert."""

from __future__ import annotations

from memsvc.app import Services
from memsvc.domain.types import (
    ChunkRecord,
    MemoryEvent,
    SearchFilters,
    SearchMode,
    SearchRequest,
)

SECRET = "My locker code is 4417-tango."


def live(svc: Services, conv: str) -> dict[str, str]:
    return {c.chunk_id: c.text for c in svc.ingest.list_chunks(conv, False, 1000, "").chunks}


def found(svc: Services, conv: str, query: str, **filters: object) -> str:
    """Every text any default search mode returns for `query` in `conv`, joined."""
    out = []
    for mode in SearchMode:
        req = SearchRequest(query, 100, SearchFilters((conv,), **filters), mode)  # type: ignore[arg-type]
        out += [h.text for h in svc.search.search(req).hits]
    return "\n".join(out)


def sync(svc: Services, events: list[MemoryEvent], **kw: object) -> list[ChunkRecord]:
    built = svc.ingest.build(events, **kw)  # type: ignore[arg-type]
    result = svc.ingest.upsert(built.chunks)
    assert not result.errors, result.errors
    return built.chunks


def findable(svc: Services, conv: str, texts: list[str]) -> bool:
    """Every text found by a keyword search for itself in `conv`."""
    for text in texts:
        hits = svc.search.search(
            SearchRequest(text, 10, SearchFilters((conv,)), SearchMode.KEYWORD)
        ).hits
        if not any(text in h.text for h in hits):
            return False
    return True
