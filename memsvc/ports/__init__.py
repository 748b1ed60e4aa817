"""The interfaces the services use: `log` (the event log), `store` (the vector store),
`embedding` (the embedder, query encoder and cache) and `work` (index queue, writer locks,
notifier). Storage (SQLite, PostgreSQL, Milvus) and embedding implement them; the
composition root (memsvc.app) picks the implementations. Services never import a
storage or embedding module, so a new backend is new files under memsvc/storage plus one
line in memsvc/app.py.

Transaction convention: every read of the event log runs inside `log.snapshot()` and every
write inside `log.transaction()`; the object each yields carries the queries. Methods of
that object never open a transaction of their own. The index queue's own operations
(lease, complete, ...) each run in one transaction inside the queue.
"""

from memsvc.ports.embedding import (
    Embedder,
    EmbeddingCache,
    PartPooling,
    PortableTokenCounts,
    QueryEncoder,
)
from memsvc.ports.log import EventLog, LogReader, LogWriter, Span
from memsvc.ports.store import ChunkStore, SearchScope, StoreSupervisor
from memsvc.ports.work import IndexQueue, Notifier, WriterLocks

__all__ = [
    "ChunkStore",
    "Embedder",
    "EmbeddingCache",
    "EventLog",
    "IndexQueue",
    "LogReader",
    "LogWriter",
    "Notifier",
    "PartPooling",
    "PortableTokenCounts",
    "QueryEncoder",
    "SearchScope",
    "Span",
    "StoreSupervisor",
    "WriterLocks",
]
