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
from memsvc.services import bootstrap
from memsvc.services.control import IndexControl
from memsvc.services.deletion import ERASURE_PENDING, DeletionService
from memsvc.services.health import WriteHealth
from memsvc.services.indexing import IndexWorker, WorkerSettings
from memsvc.services.ingest import IngestService
from memsvc.services.projection import Projector
from memsvc.services.search import Fusion, SearchService, SearchTuning
from memsvc.storage import datadir, sqlite
from memsvc.storage.milvus import lite
from memsvc.storage.milvus.store import MilvusChunkStore
from memsvc.storage.milvus.watch import StoreWatch
from memsvc.storage.sql.cache import SqlEmbeddingCache
from memsvc.storage.sql.eventlog import SqlEventLog
from memsvc.storage.sql.queue import SqlIndexQueue
from memsvc.storage.sqlite.locks import ConversationLocks
from memsvc.storage.sqlite.notify import LocalNotifier

log = structlog.get_logger(__name__)


@dataclass
class Services:
    settings: Settings
    embedder: Embedder
    store: MilvusChunkStore
    log: SqlEventLog
    queue: SqlIndexQueue
    cache: SqlEmbeddingCache
    locks: ConversationLocks
    notifier: LocalNotifier
    health: WriteHealth
    projector: Projector
    ingest: IngestService
    deletion: DeletionService
    search: SearchService
    worker: IndexWorker
    control: IndexControl
    store_watch: StoreWatch

    def close(self) -> None:
        """Worker first (it finishes or hands back its step), the store, then the log.
        After a purge the files are rewritten without the purged text (erasure)."""
        self.worker.stop()
        self.search.close()
        self.store_watch.stop()
        self.health.stop()
        with self.log.snapshot() as r:
            erase = r.get_meta(ERASURE_PENDING) == "1"
        self.store.close(erase=erase)
        if erase:
            _erase_files(self.log, self.cache)
        self.cache.close()
        self.log.close()
        datadir.unlock(self.settings.data_dir)

    def gauges(self) -> metrics.GaugeReading:
        return metrics.GaugeReading(
            self.queue.gauges(), self.worker.paused, self.store.up, self.health.disk_full
        )


def _erase_files(log_: SqlEventLog, cache: SqlEmbeddingCache) -> None:
    """No page or WAL frame of the log or cache keeps what a purge erased."""
    log_.erase()
    cache.erase()
    with log_.transaction() as tx:
        tx.set_meta(ERASURE_PENDING, "0")
    log.info("erased", what="purged text: log, cache and store files rewritten")


def milvus_uri(settings: Settings) -> str:
    return settings.milvus_uri or str((settings.data_dir / "milvus.db").resolve())


def build_services(settings: Settings, embedder: Embedder | None = None) -> Services:
    """Everything the transports need. `embedder` lets tests share one loaded model."""
    datadir.lock(settings.data_dir)
    try:
        return _build(settings, embedder)
    except BaseException:
        datadir.unlock(settings.data_dir)
        raise


def _build(settings: Settings, embedder: Embedder | None) -> Services:
    datadir.secure(settings.data_dir)
    if embedder is None:
        embedder = load_embedder(settings)
    log.info(
        "embedder_ready",
        model=embedder.name,
        dim=embedder.dim,
        pooling=embedder.info.pooling,
        fallback=embedder.info.fallback,
    )
    events, queue, locks = sqlite.open_log(settings.data_dir)
    cache = sqlite.open_cache(settings.data_dir)
    uri = milvus_uri(settings)
    with events.snapshot() as r:
        unfinished_erasure = r.get_meta(ERASURE_PENDING) == "1"
    if unfinished_erasure:  # a purge, then no clean stop: finish the erasure first
        if lite.is_lite(uri) and Path(uri).exists():
            lite.vacuum(uri)
        _erase_files(events, cache)
    store = MilvusChunkStore(
        uri, settings.collection, embedder.name, embedder.dim, token=settings.milvus_token
    )
    notifier = LocalNotifier()
    health = WriteHealth(events, settings.data_dir)
    policy = ChunkPolicy(
        max_turns=settings.chunk_max_turns,
        overlap_turns=settings.chunk_overlap_turns,
        max_tokens=min(settings.chunk_max_tokens, embedder.info.max_tokens),
    )
    renderer = ChunkRenderer(KeywordExtractor(), embedder.count_tokens, policy)
    projector = Projector(events, store, embedder, cache, renderer, locks)
    ingest = IngestService(
        events,
        store,
        embedder,
        projector,
        locks,
        settings.chunk_version,
        settings.max_turn_chars,
        settings.build_grace_s,
    )
    deletion = DeletionService(events, store, projector, locks, notifier)
    tuning = SearchTuning(
        default_mode=SearchMode(settings.search_default_mode),
        dense_weight=settings.search_dense_weight,
        keyword_weight=settings.search_keyword_weight,
        fusion=Fusion(settings.search_fusion),
    )
    search = SearchService(store, events, embedder, QueryBatcher(embedder), tuning)
    log.info("store_ready", uri=store.uri, collection=store.collection)
    worker = IndexWorker(
        projector,
        queue,
        store,
        locks,
        notifier,
        health,
        WorkerSettings(
            threads=settings.index_workers,
            batch_conversations=settings.index_batch_conversations,
            max_attempts=settings.index_max_attempts,
            backoff_s=settings.index_backoff_s,
            lease_s=settings.index_lease_s,
        ),
    )
    control = IndexControl(events, queue, worker, projector, locks, notifier)
    bootstrap.recount_tokens_if_tokenizer_changed(events, embedder)
    bootstrap.follow_store_identity(events, store.identity)
    watch = StoreWatch(store, settings.store_check_s)
    watch.on_change(lambda up: notifier.notify() if up else None)
    health.on_change(lambda writable: notifier.notify() if writable else None)
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
        health,
        projector,
        ingest,
        deletion,
        search,
        worker,
        control,
        watch,
    )
