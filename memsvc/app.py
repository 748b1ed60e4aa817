"""Start-up wiring: builds the one embedder, the store, the event log and the services."""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from memsvc.chunking import ChunkPolicy, ChunkRenderer
from memsvc.config import Settings
from memsvc.embedder import Embedder, EmbeddingCache, load_embedder
from memsvc.eventlog import EventLog
from memsvc.ingest import IngestService
from memsvc.prefix import KeywordExtractor
from memsvc.search import SearchService, SearchTuning
from memsvc.store import ChunkStore
from memsvc.types import SearchMode

log = structlog.get_logger(__name__)


@dataclass
class Services:
    settings: Settings
    embedder: Embedder
    store: ChunkStore
    events: EventLog
    ingest: IngestService
    search: SearchService

    def close(self) -> None:
        self.store.close()
        self.events.close()


def milvus_uri(settings: Settings) -> str:
    return settings.milvus_uri or str((settings.data_dir / "milvus.db").resolve())


def build_services(settings: Settings, embedder: Embedder | None = None) -> Services:
    """Everything the servicer needs. `embedder` lets tests share one loaded model."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if embedder is None:
        embedder = load_embedder(settings)
    log.info(
        "embedder_ready",
        model=embedder.name,
        dim=embedder.dim,
        pooling=embedder.info.pooling,
        fallback=embedder.info.fallback,
    )
    store = ChunkStore(
        milvus_uri(settings),
        settings.collection,
        embedder.name,
        embedder.dim,
        token=settings.milvus_token,
    )
    events = EventLog(settings.data_dir / "events.sqlite")
    cache = EmbeddingCache(settings.data_dir / "embed_cache.sqlite")
    policy = ChunkPolicy(
        max_turns=settings.chunk_max_turns,
        overlap_turns=settings.chunk_overlap_turns,
        max_tokens=min(settings.chunk_max_tokens, 512),
    )
    renderer = ChunkRenderer(KeywordExtractor(), embedder.count_tokens, policy)
    ingest = IngestService(events, store, embedder, cache, renderer, settings.chunk_version)
    tuning = SearchTuning(
        default_mode=SearchMode(settings.search_default_mode),
        dense_weight=settings.search_dense_weight,
        keyword_weight=settings.search_keyword_weight,
    )
    search = SearchService(store, events, embedder, tuning)
    log.info("store_ready", uri=store.uri, collection=store.collection)
    return Services(settings, embedder, store, events, ingest, search)
