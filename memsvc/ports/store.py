"""The vector store: a projection of the event log's layout, queried by intent."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from memsvc.domain.bm25 import KeywordQuery
from memsvc.domain.records import Candidate, StoredChunk
from memsvc.domain.types import SearchFilters
from memsvc.ports.log import Span


@dataclass(frozen=True)
class SearchScope:
    """Which stored chunks a search may return: the request's filters (in normal form),
    the conversation-id prefixes a limited token spans, and, for a store that does not
    mark its current chunks, the version each conversation with several reads."""

    filters: SearchFilters = field(default_factory=SearchFilters)
    prefixes: tuple[str, ...] = ()
    versions_of_multi: Mapping[int, Sequence[str]] = field(default_factory=dict)


class ChunkStore(Protocol):
    """The vector store: a projection of the event log's layout. Queries are named for
    their intent; no service writes the store's query language."""

    @property
    def up(self) -> bool: ...

    @property
    def identity(self) -> str:
        """Names the collection and the vectors it holds (model, dimension)."""
        ...

    @property
    def marks_current(self) -> bool:
        """Rows carry `current` (of the conversation's active version): default searches
        filter on it. Else searches pass `SearchScope.versions_of_multi`."""
        ...

    @property
    def weighs_keywords(self) -> bool:
        """Keyword searches take the query's term weights over its tenants (memsvc.domain.
        bm25); else the store scores BM25 over all its rows from the query's text."""
        ...

    def ping(self) -> bool: ...

    def mark_down(self, exc: BaseException | None = None) -> None: ...

    def reconnect(self) -> bool: ...

    def close(self, erase: bool = False) -> None:
        """`erase`: leave no deleted rows in the store's files (Milvus Lite) on the way out."""
        ...

    def compact(self) -> None:
        """Ask the store to drop deleted rows physically where it can while running."""
        ...

    # reads
    @property
    def keeps_turn_lines(self) -> bool:
        """Rows of several turns carry their turns' lines and vectors (StoredChunk.turn_lines),
        read with their vectors or on request."""
        ...

    def get(
        self,
        chunk_ids: Sequence[str],
        with_vectors: bool = False,
        with_turn_lines: bool = False,
        conversations: Collection[str] = (),
    ) -> dict[str, StoredChunk]:
        """The records with these ids (missing ids are absent). `conversations`: those the
        ids belong to, where the caller knows them: a store in shards asks only theirs
        (none named: every shard)."""
        ...

    def chunks_of(
        self,
        conversation_id: str | None,
        *,
        deleted: bool | None = False,
        version: int | None = None,
        with_vectors: bool = False,
    ) -> list[StoredChunk]:
        """Every chunk of a conversation (None: of all), live only (`deleted=False`),
        deleted only (`True`) or both (`None`), of one version or all."""
        ...

    def live_overlapping(
        self, conversation_id: str, spans: Sequence[Span] | None, with_vectors: bool = False
    ) -> list[StoredChunk]:
        """Live chunks of a conversation covering any turn of the spans (None: all)."""
        ...

    def count(self, *, deleted: bool | None = None) -> int: ...

    def digests(
        self, conversation_id: str | None = None, part: str | None = None
    ) -> dict[str, tuple[str, str, bool]]:
        """Every row (or a conversation's, or a part's), lightly: chunk id ->
        (conversation id, content hash, deleted)."""
        ...

    def digest_parts(self) -> list[str]:
        """The parts of the store one round of the audit reads (memsvc.services.audit):
        all of them, unless reading some would only evict others under a memory budget;
        each part is read within a bounded number of rounds."""
        ...

    def part_of(self, conversation_id: str) -> str:
        """The part holding a conversation's rows."""
        ...

    def search_dense(
        self, vector: np.ndarray, scope: SearchScope, limit: int, whole: bool = False
    ) -> list[Candidate]:
        """The nearest chunks in scope: ids and scores, and whole records when `whole`."""
        ...

    def search_keyword(
        self, query: KeywordQuery, scope: SearchScope, limit: int, whole: bool = False
    ) -> list[Candidate]: ...

    # writes
    def upsert(self, chunks: Sequence[StoredChunk]) -> None:
        """Insert or replace whole rows by chunk id."""
        ...

    def delete(self, chunk_ids: Sequence[str], conversations: Collection[str] = ()) -> None:
        """Remove rows by id; `conversations` as for `get`."""
        ...

    def set_deleted(self, chunks: Sequence[StoredChunk]) -> None:
        """Rewrite rows (read with their vectors) with deleted = true."""
        ...

    def set_current(self, chunks: Sequence[StoredChunk], current: bool) -> None:
        """Rewrite rows (read with their vectors) with the current mark given."""
        ...


class StoreSupervisor(Protocol):
    """Watches the store and tells listeners when it goes down or comes back."""

    def on_change(self, listener: Callable[[bool], None]) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...
