"""Start-up wiring: builds the one embedder, the store, the event log and the services."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import structlog

from memsvc.chunking import ChunkPolicy, ChunkRenderer
from memsvc.config import Settings
from memsvc.embedder import Embedder, EmbeddingCache, load_embedder
from memsvc.eventlog import EventLog
from memsvc.ingest import IngestService
from memsvc.prefix import KeywordExtractor
from memsvc.search import Fusion, SearchService, SearchTuning
from memsvc.store import ChunkStore
from memsvc.supervision import StoreWatch
from memsvc.types import SearchMode
from memsvc.worker import IndexWorker, WorkerSettings

log = structlog.get_logger(__name__)


@dataclass
class Services:
    settings: Settings
    embedder: Embedder
    store: ChunkStore
    events: EventLog
    ingest: IngestService
    search: SearchService
    worker: IndexWorker
    store_watch: StoreWatch

    def close(self) -> None:
        """Worker first (it finishes or hands back its batch), the store last but the log."""
        self.worker.stop()
        self.search.close()
        self.store_watch.stop()
        self.store.close()
        self.events.close()


def secure_data_dir(path: Path) -> None:
    """The data dir 0700 and every file in it 0600, whatever the umask or an older
    version left: the event log holds raw conversation text. (`memsvc serve` also sets
    umask 077, so files created later, milvus-lite's included, are private too.)"""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    for p in path.rglob("*"):
        if p.is_symlink():
            continue
        p.chmod(0o700 if p.is_dir() else 0o600)


def milvus_uri(settings: Settings) -> str:
    return settings.milvus_uri or str((settings.data_dir / "milvus.db").resolve())


def build_services(settings: Settings, embedder: Embedder | None = None) -> Services:
    """Everything the servicer needs. `embedder` lets tests share one loaded model."""
    secure_data_dir(settings.data_dir)
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
        max_tokens=min(settings.chunk_max_tokens, embedder.info.max_tokens),
    )
    renderer = ChunkRenderer(KeywordExtractor(), embedder.count_tokens, policy)
    ingest = IngestService(
        events,
        store,
        embedder,
        cache,
        renderer,
        settings.chunk_version,
        max_turn_chars=settings.max_turn_chars,
    )
    tuning = SearchTuning(
        default_mode=SearchMode(settings.search_default_mode),
        dense_weight=settings.search_dense_weight,
        keyword_weight=settings.search_keyword_weight,
        fusion=Fusion(settings.search_fusion),
    )
    search = SearchService(store, events, embedder, tuning)
    log.info("store_ready", uri=store.uri, collection=store.collection)
    worker = IndexWorker(
        ingest,
        WorkerSettings(
            threads=settings.index_workers,
            batch_conversations=settings.index_batch_conversations,
            max_attempts=settings.index_max_attempts,
            backoff_s=settings.index_backoff_s,
        ),
    )
    _follow_store_identity(events, ingest, store, settings.chunk_version)
    watch = StoreWatch(store, settings.store_check_s)
    watch.on_change(lambda up: worker.notify() if up else None)
    watch.start()
    worker.start()
    return Services(settings, embedder, store, events, ingest, search, worker, watch)


def _follow_store_identity(
    events: EventLog, ingest: IngestService, store: ChunkStore, version: int
) -> None:
    """The event log outlives a vector store: pointed at a new collection (or model), it
    forgets what the old store held and queues every conversation for indexing."""
    identity = f"{store.uri}|{store.collection}|{store.model}|{store.dim}"
    previous = events.get_meta("store_identity")
    if previous == identity:
        return
    conversations = events.conversations() if previous is not None else []
    with events.transaction() as db:
        if previous is not None:
            events.forget_store(db)
            for conv in conversations:
                # The newest version the conversation was built with (a sync build may
                # have used another than the default); an older one kept during a
                # migration is not rebuilt.
                newest = max(events.layout_versions(db, conv), default=version)
                ingest.queue.enqueue(db, conv, events.live_turn_count(db, conv), newest)
        events.set_meta(db, "store_identity", identity)
    if conversations:
        log.warning(
            "store_changed_reindexing",
            conversations=len(conversations),
            was=previous,
            now=identity,
        )
