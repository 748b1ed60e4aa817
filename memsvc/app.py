"""The composition root: picks the implementations of memsvc.ports (storage, embedding) and
builds the services on them. The only module that knows both the services and the
backends; transports call what it builds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import structlog

from memsvc.config import Settings
from memsvc.domain.chunking import ChunkPolicy, ChunkRenderer
from memsvc.domain.prefix import KeywordExtractor
from memsvc.domain.types import SearchMode
from memsvc.embedding.batching import QueryBatcher
from memsvc.embedding.model import Embedder, load_embedder
from memsvc.observability import metrics
from memsvc.ports import ChunkStore, EmbeddingCache, EventLog, IndexQueue, Notifier, WriterLocks
from memsvc.services import bootstrap
from memsvc.services.control import IndexControl
from memsvc.services.deletion import DeletionService
from memsvc.services.indexing import IndexWorker, WorkerSettings
from memsvc.services.ingest import IngestService
from memsvc.services.projection import Projector
from memsvc.services.search import Fusion, SearchService, SearchTuning
from memsvc.storage import sqlite
from memsvc.storage.milvus.store import MilvusChunkStore
from memsvc.storage.milvus.watch import StoreWatch
from memsvc.storage.sqlite.notify import LocalNotifier

log = structlog.get_logger(__name__)


@dataclass
class Services:
    settings: Settings
    embedder: Embedder
    store: ChunkStore
    log: EventLog
    queue: IndexQueue
    cache: EmbeddingCache
    locks: WriterLocks
    notifier: Notifier
    projector: Projector
    ingest: IngestService
    deletion: DeletionService
    search: SearchService
    worker: IndexWorker
    control: IndexControl
    store_watch: StoreWatch

    def close(self) -> None:
        """Worker first (it finishes or hands back its batch), the store, then the log."""
        self.worker.stop()
        self.search.close()
        self.store_watch.stop()
        self.store.close()
        self.cache.close()
        self.log.close()

    def gauges(self) -> metrics.GaugeReading:
        return metrics.GaugeReading(self.queue.gauges(), self.worker.paused, self.store.up)


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
    """Everything the transports need. `embedder` lets tests share one loaded model."""
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
    store = MilvusChunkStore(
        milvus_uri(settings),
        settings.collection,
        embedder.name,
        embedder.dim,
        token=settings.milvus_token,
    )
    events, queue, locks = sqlite.open_log(settings.data_dir)
    cache = sqlite.open_cache(settings.data_dir)
    notifier = LocalNotifier()
    policy = ChunkPolicy(
        max_turns=settings.chunk_max_turns,
        overlap_turns=settings.chunk_overlap_turns,
        max_tokens=min(settings.chunk_max_tokens, embedder.info.max_tokens),
    )
    renderer = ChunkRenderer(KeywordExtractor(), embedder.count_tokens, policy)
    projector = Projector(events, store, embedder, cache, renderer, locks)
    version = settings.chunk_version
    ingest = IngestService(
        events, store, embedder, projector, locks, version, settings.max_turn_chars
    )
    deletion = DeletionService(events, store, cache, projector, locks, version)
    tuning = SearchTuning(
        default_mode=SearchMode(settings.search_default_mode),
        dense_weight=settings.search_dense_weight,
        keyword_weight=settings.search_keyword_weight,
        fusion=Fusion(settings.search_fusion),
    )
    search = SearchService(store, events, embedder, QueryBatcher(embedder), tuning)
    log.info("store_ready", uri=store.uri, collection=store.collection)
    worker = IndexWorker(
        ingest,
        projector,
        queue,
        store,
        notifier,
        WorkerSettings(
            threads=settings.index_workers,
            batch_conversations=settings.index_batch_conversations,
            max_attempts=settings.index_max_attempts,
            backoff_s=settings.index_backoff_s,
        ),
    )
    control = IndexControl(events, queue, worker, deletion, locks, notifier, version)
    bootstrap.recount_tokens_if_tokenizer_changed(events, embedder)
    identity = f"{store.uri}|{store.collection}|{store.model}|{store.dim}"
    bootstrap.follow_store_identity(events, identity, version)
    watch = StoreWatch(store, settings.store_check_s)
    watch.on_change(lambda up: notifier.notify() if up else None)
    watch.start()
    worker.start(paused=control.paused_before())
    return Services(
        settings,
        embedder,
        store,
        events,
        queue,
        cache,
        locks,
        notifier,
        projector,
        ingest,
        deletion,
        search,
        worker,
        control,
        watch,
    )
