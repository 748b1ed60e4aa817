"""The composition root: picks the implementations of memsvc.ports (storage, embedding) and
builds the services on them. The only module that knows both the services and the
backends; transports call what it builds."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from memsvc.config import Settings, package_version
from memsvc.domain.chunking import ChunkPolicy
from memsvc.domain.errors import StoreUnavailable
from memsvc.domain.oversize import Oversize
from memsvc.domain.records import ServerDescription
from memsvc.domain.types import SearchMode
from memsvc.embedding.batching import QueryBatcher
from memsvc.embedding.providers import load_embedder, load_previous_embedder
from memsvc.observability import metrics, startup, tracing
from memsvc.ports import Embedder, EmbeddingCache, EventLog, IndexQueue, Notifier, WriterLocks
from memsvc.services import bootstrap
from memsvc.services.audit import StoreAudit
from memsvc.services.control import IndexControl
from memsvc.services.deletion import ERASURE_PENDING, DeletionService
from memsvc.services.embedder_watch import EmbedderWatch
from memsvc.services.fleet import FleetSettings
from memsvc.services.health import Health
from memsvc.services.indexing import IndexWorker, WorkerSettings, worker_identity
from memsvc.services.ingest import IngestService
from memsvc.services.model_move import ModelMove, move_notice, previous_collection, record_served
from memsvc.services.moving_search import MovingSearch
from memsvc.services.projection import Projector
from memsvc.services.recent_records import RecentRecords
from memsvc.services.render_processes import layouts_for
from memsvc.services.search import Fusion, SearchService, SearchTuning
from memsvc.storage import datadir, sqlite
from memsvc.storage.milvus import lite
from memsvc.storage.milvus.previous import PreviousCollection, drop_abandoned
from memsvc.storage.milvus.store import MilvusChunkStore
from memsvc.storage.milvus.watch import StoreWatch
from memsvc.storage.sqlite.notify import LocalNotifier

log = structlog.get_logger(__name__)

# The writer lock start-up steps hold (no conversation id has a control character), and
# how long a replica waits for another that is starting (migrations, a rebuild's records).
BOOTSTRAP = "\x00bootstrap"
START_LOCK_WAIT_S = 600.0


@dataclass
class Backend:
    """The event log and what lives beside it: SQLite files in the data dir (one process),
    or a PostgreSQL database any number of processes share."""

    log: EventLog
    queue: IndexQueue
    locks: WriterLocks
    notifier: Notifier
    cache: EmbeddingCache
    close: Callable[[], None]


def open_backend(settings: Settings) -> Backend:
    if settings.database_url:
        from memsvc.storage import postgres

        pg = postgres.open_backend(
            settings.database_url,
            settings.database_pool_size,
            # every writer lock held at once: a call's, and an index step's conversations
            lock_holders=settings.grpc_workers
            + settings.index_workers * settings.index_batch_conversations
            + 2,
            listen=settings.database_listen,
            writer_lease_s=settings.writer_lease_s,
            writer_wait_s=settings.writer_wait_s,
        )
        return Backend(pg.log, pg.queue, pg.locks, pg.notifier, pg.cache, pg.close)
    log_, queue, locks = sqlite.open_log(settings.data_dir, settings.writer_wait_s)
    cache = sqlite.open_cache(settings.data_dir)

    def close() -> None:
        cache.close()
        log_.close()

    return Backend(log_, queue, locks, LocalNotifier(), cache, close)


@dataclass
class Services:
    settings: Settings
    embedder: Embedder
    store: MilvusChunkStore
    log: EventLog
    queue: IndexQueue
    cache: EmbeddingCache
    locks: WriterLocks
    notifier: Notifier
    health: Health
    projector: Projector
    ingest: IngestService
    deletion: DeletionService
    search: MovingSearch
    worker: IndexWorker
    control: IndexControl
    store_watch: StoreWatch
    embedder_watch: EmbedderWatch
    store_audit: StoreAudit
    fleet: FleetSettings
    backend: Backend
    model_move: ModelMove | None = None

    def close(self) -> None:
        """Worker first (it finishes or hands back its step), the store, then the log.
        After a purge the files are rewritten without the purged text (erasure)."""
        self.worker.stop()
        self.projector.layouts.close()
        if self.model_move is not None:
            self.model_move.stop()
        self.search.close()
        self.store_audit.stop()
        if self.settings.database_url:
            self.fleet.stop()
        self.store_watch.stop()
        self.embedder_watch.stop()
        self.health.stop()
        try:
            with self.log.snapshot() as r:
                erase = r.get_meta(ERASURE_PENDING) == "1"
        except Exception:  # the database gone: the next start finishes the erasure
            erase = False
        self.store.close(erase=erase)
        if erase:
            _erase_files(self.log, self.cache)
        self.backend.close()
        datadir.unlock(self.settings.data_dir)

    def describe(self) -> ServerDescription:
        info = self.embedder.info
        # the local model names the runtime of each path (memsvc.embedding.tuning)
        runtime = getattr(self.embedder, "runtime_label", info.provider)
        move = self.model_move.progress() if self.model_move else None
        return ServerDescription(
            version=package_version(),
            model=info.name,
            model_fallback=info.fallback,
            dim=info.dim,
            embed_backend=runtime if info.provider == "local" else info.provider,
            log_backend="postgres" if self.settings.database_url else "sqlite",
            model_notice=" ".join(filter(None, [info.notice, move_notice(move) if move else ""])),
            model_move=move,
            store_shards=self.store.shard_progress(),
        )

    def gauges(self) -> metrics.GaugeReading:
        return metrics.GaugeReading(
            self.queue.gauges(),
            self.worker.paused,
            self.store.up,
            self.health.disk_full,
            self.health.log_up,
            chunks_stored=self._chunks_stored(),
            embedder_up=self.embedder_watch.up,
            model_move=self.model_move.progress() if self.model_move else None,
            store_shards=self.store.shard_progress(),
        )

    def _chunks_stored(self) -> int | None:
        """Live chunks in the store (None while it does not answer: no gauge then)."""
        with contextlib.suppress(StoreUnavailable):
            if self.store.up:
                return self.store.count(deleted=False)
        return None


def _erase_files(log_: EventLog, cache: EmbeddingCache) -> None:
    """No page or WAL frame of the log or cache keeps what a purge erased."""
    log_.erase()
    cache.erase()
    with log_.transaction() as tx:
        tx.set_meta(ERASURE_PENDING, "0")
    log.info("erased", what="purged text: log, cache and store files rewritten")


def migrate_log(settings: Settings) -> str:
    """`memsvc migrate`: open the event log (which brings its schema to this version) and
    close it. Returns what was done."""
    if settings.database_url:
        from memsvc.storage.postgres.database import PostgresDatabase, redact
        from memsvc.storage.postgres.schema import migrate

        database = PostgresDatabase(settings.database_url, pool_size=2)
        try:
            with database.transaction() as sql:
                found, now = migrate(sql)
        finally:
            database.close()
        return f"{redact(settings.database_url)}: schema {found} -> {now}"
    datadir.lock(settings.data_dir)
    try:
        backend = open_backend(settings)
        backend.close()
    finally:
        datadir.unlock(settings.data_dir)
    return f"{settings.data_dir}: event log and cache at the current schema"


def milvus_uri(settings: Settings) -> str:
    return settings.milvus_uri or str((settings.data_dir / "milvus.db").resolve())


def build_services(settings: Settings, embedder: Embedder | None = None) -> Services:
    """Everything the transports need. `embedder` lets tests share one loaded model."""
    datadir.lock(settings.data_dir)
    backend: Backend | None = None
    try:
        datadir.secure(settings.data_dir)
        startup.enter("opening the event log")
        backend = open_backend(settings)  # before the model: a database error is quick
        if embedder is None:
            startup.enter("loading the model")
            embedder = load_embedder(settings)
        startup.enter("opening the vector store")
        return _build(settings, embedder, backend)
    except BaseException:
        if backend is not None:
            backend.close()
        datadir.unlock(settings.data_dir)
        raise


def _build(settings: Settings, embedder: Embedder, backend: Backend) -> Services:
    log.info(
        "embedder_ready",
        model=embedder.name,
        dim=embedder.dim,
        pooling=embedder.info.pooling,
        fallback=embedder.info.fallback,
    )
    events, queue, locks, notifier, cache = (
        backend.log,
        backend.queue,
        backend.locks,
        backend.notifier,
        backend.cache,
    )
    uri = milvus_uri(settings)
    if settings.database_url and lite.is_lite(uri):
        log.warning(
            "store_not_shared",
            store=uri,
            effect="the vectors live in this process's data dir: replicas sharing the"
            " database would each hold a store of their own and undo each other's work",
            remedy="run one replica, or point every replica at one Milvus server"
            " (MEMSVC_MILVUS_URI)",
        )
    with events.snapshot() as r:
        unfinished_erasure = r.get_meta(ERASURE_PENDING) == "1"
    if unfinished_erasure and lite.is_lite(uri):  # a purge, then no clean stop: finish it
        if Path(uri).exists():
            lite.vacuum(uri)
        _erase_files(events, cache)
    policy = ChunkPolicy(
        max_turns=settings.chunk_max_turns,
        overlap_turns=settings.chunk_overlap_turns,
        max_tokens=min(settings.chunk_max_tokens, embedder.info.max_tokens),
    )
    # Replicas starting together: one bootstraps (collection, token counts, identity).
    with locks.hold(BOOTSTRAP, wait_s=START_LOCK_WAIT_S):
        store = MilvusChunkStore(
            uri,
            settings.collection,
            embedder.identity,
            settings.milvus_token,
            settings.store_shards,
            settings.store_memory_mib << 20,
            shards_by_tenant=settings.store_shard_by == "tenant",
        )
        fleet = FleetSettings(
            events,
            worker_identity(),
            # the store's identity at each confirmation: it follows a store that came back empty
            lambda: {
                "collection": f"{settings.collection} ({store.identity})",
                "chunking": policy.fingerprint(),
                "chunk_version": str(settings.chunk_version),
            },
        )
        if settings.database_url:  # a log of its own has no other replica
            fleet.claim()
        bootstrap.reclean_turns_if_text_form_changed(events, embedder)
        bootstrap.recount_tokens_if_tokenizer_changed(events, embedder)
        bootstrap.follow_store_identity(events, store.identity)
        bootstrap.follow_cache_identity(events, cache, embedder.identity)
        moving_from = previous_collection(
            events,
            store.collection,
            store.base_collection,
            lambda name: PreviousCollection.recorded(store, name),
        )
        if moving_from is None:
            record_served(events, store.collection, embedder.identity)
        drop_abandoned(store, [store.collection, moving_from[0] if moving_from else ""])
    health = Health(events, None if settings.database_url else settings.data_dir)
    layouts = layouts_for(embedder, policy, settings)
    projector = Projector(events, store, embedder, cache, layouts, locks)
    ingest = IngestService(
        events,
        store,
        embedder,
        projector,
        locks,
        settings.chunk_version,
        settings.max_turn_chars,
        settings.build_grace_s,
        Oversize(settings.oversize),
    )
    deletion = DeletionService(events, store, projector, locks, notifier)
    tuning = SearchTuning(
        default_mode=SearchMode(settings.search_default_mode),
        dense_weight=settings.search_dense_weight,
        keyword_weight=settings.search_keyword_weight,
        fusion=Fusion(settings.search_fusion),
    )
    search = MovingSearch(_search_service(settings, store, events, embedder, tuning))
    move = None
    if moving_from is not None:
        startup.enter("loading the previous model")
        previous_store = PreviousCollection(store, *moving_from)
        move = _model_move(
            settings, embedder, previous_store, store.collection, events, tuning, search
        )
        deletion.on_purge(move.forget)
    log.info("store_ready", uri=store.uri, collection=store.collection)
    worker = IndexWorker(
        events,
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
    audit = StoreAudit(events, store, locks, notifier, settings.store_audit_s)
    if store.shards.count == 1:
        startup.enter("checking the store against the log")
        audit.run()  # before any call: a log restored beside a newer store is seen at once
    else:  # shards load after SERVING; the audit's first round runs then, in its thread
        store.load_in_background()
        audit.on_store_change(True)
    watch = StoreWatch(store, settings.store_check_s)
    watch.on_change(lambda up: notifier.notify() if up else None)
    watch.on_change(audit.on_store_change)
    health.on_change(lambda writable: notifier.notify() if writable else None)
    embedder_watch = EmbedderWatch(embedder, settings.embedder_check_s)
    watch.start()
    embedder_watch.start()
    health.start()
    audit.start()
    if settings.database_url:
        fleet.start()
    worker.start()
    if move is not None and not move.check():
        move.start()
    services = Services(
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
        embedder_watch,
        audit,
        fleet,
        backend,
        move,
    )
    served = services.describe()
    tracing.describe(
        "postgresql" if served.log_backend == "postgres" else "sqlite",
        store.collection,
        served.model,
        served.embed_backend,
    )
    return services


def _search_service(
    settings: Settings,
    store: MilvusChunkStore,
    events: EventLog,
    embedder: Embedder,
    tuning: SearchTuning,
) -> SearchService:
    return SearchService(
        store,
        events,
        embedder,
        QueryBatcher(embedder),
        tuning,
        RecentRecords(settings.search_recent_records),
    )


def _model_move(
    settings: Settings,
    embedder: Embedder,
    previous_store: PreviousCollection,
    target: str,
    events: EventLog,
    tuning: SearchTuning,
    search: MovingSearch,
) -> ModelMove:
    """Searches answer from the collection before while the store is rebuilt for this
    model (memsvc.services.model_move), with the model that wrote it where it loads."""
    previous_embedder = load_previous_embedder(settings, embedder, previous_store.model)
    search.previous = _search_service(
        settings, previous_store, events, previous_embedder or embedder, tuning
    )
    search.move = ModelMove(
        events,
        previous_store,
        target,
        embedder.identity,
        previous_model_serves=previous_embedder is not None,
        on_done=search.end_move,
    )
    return search.move
