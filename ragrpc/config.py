"""Typed settings of both services, read once from environment variables in `__main__`.

Every setting is a dataclass field whose metadata names its environment variable, says what it
does (and in which unit) and names its group, the concern it belongs to (`GROUPS`).
`settings_table()` renders them; docs/configuration.md is generated from them
(`python -m scripts.configuration_doc`) and a test fails when the two differ.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

BUNDLED_MODEL = "bundled:all-MiniLM-L6-v2"


@dataclass(frozen=True)
class SettingsGroup:
    """A concern that settings belong to: `key` as settings name it, a title and what it covers."""

    key: str
    title: str
    about: str


STORE = "store"
EMBEDDING = "embedding"
INGESTION = "ingestion"
RETRIEVAL = "retrieval"
RERANKING = "reranking"
ANSWERS = "answers"
SERVER = "server"
SECURITY = "security"
OBSERVABILITY = "observability"

GROUPS = (
    SettingsGroup(
        STORE,
        "Store (Milvus)",
        "Where the chunks, the document registry and the ingestion jobs live, the dense index, and how the "
        "services read and write them.",
    ),
    SettingsGroup(
        EMBEDDING,
        "Embeddings",
        "Which model embeds chunks and queries, where it runs (in the service or at an endpoint) and how its "
        "calls are batched.",
    ),
    SettingsGroup(
        INGESTION,
        "Ingestion",
        "How the ingest service chunks documents, holds them in memory, bounds their cost and owns the collection.",
    ),
    SettingsGroup(
        RETRIEVAL,
        "Retrieval",
        "Candidates, fusion, dense and sparse search, and how the query service follows the registry.",
    ),
    SettingsGroup(RERANKING, "Reranking", "A local cross-encoder or a remote rerank API over the fused candidates."),
    SettingsGroup(ANSWERS, "Answers", "The prompt's token budget and the LLM endpoints that `Ask` streams from."),
    SettingsGroup(
        SERVER,
        "Servers and limits",
        "Addresses, ports and threads of both services, the size limits of requests and the server-side deadlines.",
    ),
    SettingsGroup(SECURITY, "Security", "Authentication by API key, tenants and TLS."),
    SettingsGroup(OBSERVABILITY, "Logs, metrics and tracing", "Log level and format, Prometheus ports, tracing."),
)


def _setting(default: Any, env: str, help_text: str, group: str = "") -> Any:
    return field(default=default, metadata={"env": env, "help": help_text, "group": group})


@dataclass(frozen=True)
class Settings:
    """All configuration. Construct with `Settings.from_env()`; override in tests with
    `dataclasses.replace(settings, ...)`."""

    milvus_uri: str = _setting(
        "http://127.0.0.1:19530",
        "RAGRPC_MILVUS_URI",
        "Milvus URI: a milvus-lite server, Milvus standalone/cluster or Zilliz endpoint",
        group=STORE,
    )
    milvus_token: str = _setting("", "RAGRPC_MILVUS_TOKEN", "Milvus token (user:password or API key)", group=STORE)
    collection_prefix: str = _setting(
        "ragrpc",
        "RAGRPC_COLLECTION_PREFIX",
        "Name prefix of the chunk and document collections",
        group=STORE,
    )
    index_type: str = _setting("HNSW", "RAGRPC_INDEX_TYPE", "Dense index: FLAT, IVF_FLAT or HNSW", group=STORE)
    hnsw_m: int = _setting(16, "RAGRPC_HNSW_M", "HNSW M (graph degree)", group=STORE)
    hnsw_ef_construction: int = _setting(200, "RAGRPC_HNSW_EF_CONSTRUCTION", "HNSW efConstruction", group=STORE)
    hnsw_ef: int = _setting(
        192,
        "RAGRPC_HNSW_EF",
        "HNSW ef at search time (at least the candidates asked for)",
        group=STORE,
    )
    ivf_nlist: int = _setting(1024, "RAGRPC_IVF_NLIST", "IVF_FLAT nlist", group=STORE)
    ivf_nprobe: int = _setting(32, "RAGRPC_IVF_NPROBE", "IVF_FLAT nprobe at search time", group=STORE)
    store_timeout_s: float = _setting(30.0, "RAGRPC_STORE_TIMEOUT_S", "Timeout of one Milvus call", group=STORE)
    store_group_linger_ms: float = _setting(
        5.0,
        "RAGRPC_STORE_GROUP_LINGER_MS",
        "Ingest service under load: a registry/chunk write (or registry read) waits this long so the ones arriving "
        "meanwhile leave in the same Milvus call (the query service never waits); 0 turns it off",
        group=STORE,
    )
    store_page_size: int = _setting(
        8192,
        "RAGRPC_STORE_PAGE_SIZE",
        "Rows per page when a scan or listing reads through a collection (1-16384, Milvus' most per query); no read is"
        " capped, larger collections take more pages",
        group=STORE,
    )
    milvus_flush: str = _setting(
        "auto",
        "RAGRPC_MILVUS_FLUSH",
        "Ingest flushes written collections: auto (only on a milvus-lite server, which otherwise keeps every row in "
        "its WAL and searches slowly), on or off",
        group=STORE,
    )
    milvus_flush_idle_s: float = _setting(
        2.0,
        "RAGRPC_MILVUS_FLUSH_IDLE_S",
        "Flush once writes have paused this long",
        group=STORE,
    )
    milvus_flush_max_interval_s: float = _setting(
        60.0,
        "RAGRPC_MILVUS_FLUSH_MAX_INTERVAL_S",
        "Flush at least this often while writes continue",
        group=STORE,
    )
    embedding_model: str = _setting(
        BUNDLED_MODEL,
        "RAGRPC_EMBEDDING_MODEL",
        "Provider local: sentence-transformers model directory or hub name (default: the bundled all-MiniLM-L6-v2); "
        "provider openai: the endpoint's model name (Azure: the deployment name)",
        group=EMBEDDING,
    )
    embedding_provider: str = _setting(
        "local",
        "RAGRPC_EMBEDDING_PROVIDER",
        "local (sentence-transformers in the service, RAGRPC_EMBEDDING_MODEL/BACKEND) or openai (any OpenAI-compatible"
        " /v1/embeddings endpoint: OpenAI, Azure OpenAI, vLLM, Ollama, TEI, LM Studio); recorded on the collection "
        "with the model and dimension",
        group=EMBEDDING,
    )
    embedding_dimensions: int = _setting(
        0,
        "RAGRPC_EMBEDDING_DIMENSIONS",
        "Output dimension below the model's own (Matryoshka models): provider openai sends it as `dimensions`, local "
        "keeps the first N components and re-normalises; recorded on the collection; 0: the model's own",
        group=EMBEDDING,
    )
    embedding_base_url: str = _setting(
        "https://api.openai.com/v1",
        "RAGRPC_EMBEDDING_BASE_URL",
        "Provider openai: base URL of the endpoint (e.g. http://127.0.0.1:8000/v1 for vLLM)",
        group=EMBEDDING,
    )
    embedding_api_key_env: str = _setting(
        "OPENAI_API_KEY",
        "RAGRPC_EMBEDDING_API_KEY_ENV",
        "Provider openai: name of the environment variable holding the API key (unset: 'not-needed' is sent)",
        group=EMBEDDING,
    )
    embedding_request_size: int = _setting(
        32,
        "RAGRPC_EMBEDDING_REQUEST_SIZE",
        "Provider openai: texts per /v1/embeddings request (TEI accepts 32 by default, OpenAI 2048)",
        group=EMBEDDING,
    )
    embedding_timeout_s: float = _setting(
        30.0,
        "RAGRPC_EMBEDDING_TIMEOUT_S",
        "Provider openai: timeout of one embeddings request",
        group=EMBEDDING,
    )
    embedding_max_retries: int = _setting(
        3,
        "RAGRPC_EMBEDDING_MAX_RETRIES",
        "Provider openai: retries of a request after a connection error, timeout, 408, 409, 429 or 5xx (with "
        "exponential backoff, or after the server's Retry-After); then the call fails UNAVAILABLE",
        group=EMBEDDING,
    )
    embedding_max_tokens: int = _setting(
        8191,
        "RAGRPC_EMBEDDING_MAX_TOKENS",
        "Provider openai: most tokens of one text the model reads (8191 for OpenAI's models); chunks stay within it",
        group=EMBEDDING,
    )
    embedding_tokenizer: str = _setting(
        "cl100k_base",
        "RAGRPC_EMBEDDING_TOKENIZER",
        "Provider openai: how chunk tokens are counted: cl100k_base (OpenAI's embedding models), o200k_base, or the "
        "path of the served model's tokenizer.json",
        group=EMBEDDING,
    )
    embedding_backend: str = _setting(
        "onnx-int8",
        "RAGRPC_EMBEDDING_BACKEND",
        "sentence-transformers backend: onnx-int8 (ONNX Runtime with int8 weights, quantised for the CPU it runs on; "
        "exported once into ~/.cache/ragrpc/onnx), onnx (fp32) or torch (fp32)",
        group=EMBEDDING,
    )
    embedding_batch_size: int = _setting(
        1,
        "RAGRPC_EMBEDDING_BATCH_SIZE",
        "Texts per forward pass of the model (a call's texts are ordered by token count first). 1: no padding, and a "
        "text's vector does not depend on what else was embedded with it (int8 activation scales are per batch)",
        group=EMBEDDING,
    )
    embedding_call_size: int = _setting(
        128,
        "RAGRPC_EMBEDDING_CALL_SIZE",
        "Chunks gathered across concurrent documents into one model call (ordered by token count, then run in forward "
        "batches over the streams): larger calls let more documents finish, and write, together",
        group=EMBEDDING,
    )
    embedding_streams: int = _setting(
        2,
        "RAGRPC_EMBEDDING_STREAMS",
        "Model instances the ingest service runs side by side, each with cores/streams threads (cores: OMP_NUM_THREADS"
        " when set): independent 1-thread streams keep cores that other work shares busier than one multi-threaded "
        "stream. Provider openai: calls in flight at once. The query service always uses 1",
        group=EMBEDDING,
    )
    query_embedding_threads: int = _setting(
        1,
        "RAGRPC_QUERY_EMBEDDING_THREADS",
        "Threads of one query embedding in the query service (ONNX backends; 0: all cores). 1 leaves the other cores "
        "to BM25, the store and concurrent queries, which then run side by side",
        group=EMBEDDING,
    )
    ingest_concurrency: int = _setting(
        256,
        "RAGRPC_INGEST_CONCURRENCY",
        "Documents processed at once across all ingestion jobs (their embeddings share model calls; enough to fill "
        "RAGRPC_EMBEDDING_STREAMS calls of RAGRPC_EMBEDDING_CALL_SIZE chunks with more waiting)",
        group=INGESTION,
    )
    ingest_processes: int = _setting(
        0,
        "RAGRPC_INGEST_PROCESSES",
        "Worker processes of the ingest service that extract, clean, chunk and frame documents, one document at a "
        "time each (0: one per core); -1: none, that work runs in the service's own threads (RAGRPC_WORKERS). A worker "
        "that dies is replaced and its document prepared once more; one busy past RAGRPC_DOCUMENT_TIMEOUT_S is killed",
        group=INGESTION,
    )
    query_instruction: str = _setting(
        "",
        "RAGRPC_QUERY_INSTRUCTION",
        "Prefix added to queries before embedding (e.g. 'query: ')",
        group=EMBEDDING,
    )
    chunk_size_tokens: int = _setting(
        200,
        "RAGRPC_CHUNK_SIZE_TOKENS",
        "Default chunk size (model tokens)",
        group=INGESTION,
    )
    chunk_overlap_tokens: int = _setting(
        30,
        "RAGRPC_CHUNK_OVERLAP_TOKENS",
        "Default overlap of fixed-size chunks (model tokens)",
        group=INGESTION,
    )
    context_headers: bool = _setting(
        True,
        "RAGRPC_CONTEXT_HEADERS",
        "Embed (ingest) and BM25-index (query: rank_bm25; ingest: the Milvus BM25 field) each chunk with a header "
        "naming its document's title and section path (at most 32 model tokens, within what the chunk leaves free of "
        "the window); Chunk.text stays the chunk's own text",
        group=INGESTION,
    )
    enrichers: str = _setting(
        "",
        "RAGRPC_ENRICHERS",
        "Enrichers, comma-separated, run in this order (both services read it: the ingest service runs their "
        "document side, the query service their question side): filings (SEC filings and financial reports: "
        "organisation, trading symbol, document type and period as metadata and in the context headers; the "
        "periods a question names added to its BM25 query), language (metadata language), or your own as "
        "module:attribute (see ragrpc/enrich and the README); empty: none, no domain rules",
        group=INGESTION,
    )
    metadata_filter_keys: str = _setting(
        "",
        "RAGRPC_METADATA_FILTER_KEYS",
        "Metadata keys a new chunks collection can filter on (MetadataFilter.metadata, the CLI's --where), "
        "comma-separated lower-case identifiers, at most 16, each a VARCHAR field of at most 512 bytes; fixed and "
        "recorded when the ingest service creates the collection (a service whose setting differs follows the "
        "collection and logs a warning); empty: none",
        group=STORE,
    )
    host: str = _setting("127.0.0.1", "RAGRPC_HOST", "Address the services bind to", group=SERVER)
    ingest_port: int = _setting(50051, "RAGRPC_INGEST_PORT", "Port of the ingest service", group=SERVER)
    query_port: int = _setting(50052, "RAGRPC_QUERY_PORT", "Port of the query service", group=SERVER)
    workers: int = _setting(0, "RAGRPC_WORKERS", "CPU worker threads (0: one per core)", group=SERVER)
    query_processes: int = _setting(
        1,
        "RAGRPC_QUERY_PROCESSES",
        "Query service: processes serving its port together (SO_REUSEPORT; the kernel spreads connections, not "
        "calls, over them), each with its own model and registry follower, started and restarted by a supervisor; "
        "0: one per core. More than 1 needs RAGRPC_INDEX_SNAPSHOT_DIR (the processes share the indexes' memory-mapped"
        " snapshot; one writes it). RAGRPC_MAX_CONCURRENT_RPCS and the metrics port are per process (process i "
        "serves metrics on RAGRPC_QUERY_METRICS_PORT + i)",
        group=SERVER,
    )
    max_message_bytes: int = _setting(
        16 * 1024 * 1024,
        "RAGRPC_MAX_MESSAGE_BYTES",
        "Largest gRPC message accepted or sent",
        group=SERVER,
    )
    max_upload_bytes: int = _setting(
        100 * 1024 * 1024,
        "RAGRPC_MAX_UPLOAD_BYTES",
        "Largest document accepted (bytes)",
        group=SERVER,
    )
    upload_memory_bytes: int = _setting(
        8 * 1024 * 1024,
        "RAGRPC_UPLOAD_MEMORY_BYTES",
        "An upload larger than this is spooled to a temporary file while it arrives and waits for its turn",
        group=INGESTION,
    )
    upload_spool_dir: str = _setting(
        "",
        "RAGRPC_UPLOAD_SPOOL_DIR",
        "Directory of spooled uploads (empty: the system's temporary directory)",
        group=INGESTION,
    )
    extraction_memory_bytes: int = _setting(
        256 * 1024 * 1024,
        "RAGRPC_EXTRACTION_MEMORY_BYTES",
        "Bytes of documents extracted and chunked at once (a larger document runs alone); bounds the memory of many "
        "large uploads",
        group=INGESTION,
    )
    max_chunks_per_document: int = _setting(
        20_000,
        "RAGRPC_MAX_CHUNKS_PER_DOCUMENT",
        "Most chunks one document may be stored as (retrievable + parent rows); a document that chunks into more is "
        "refused with RESOURCE_EXHAUSTED (TOO_MANY_CHUNKS) and nothing of it is stored; at least 1 (no unlimited)",
        group=INGESTION,
    )
    max_batch_documents: int = _setting(
        256,
        "RAGRPC_MAX_BATCH_DOCUMENTS",
        "Most documents in one IngestDocuments request",
        group=SERVER,
    )
    max_query_chars: int = _setting(4096, "RAGRPC_MAX_QUERY_CHARS", "Longest query accepted (characters)", group=SERVER)
    max_top_k: int = _setting(100, "RAGRPC_MAX_TOP_K", "Largest top_k accepted", group=SERVER)
    max_candidates: int = _setting(1000, "RAGRPC_MAX_CANDIDATES", "Largest candidates value accepted", group=SERVER)
    document_timeout_s: float = _setting(
        900.0,
        "RAGRPC_DOCUMENT_TIMEOUT_S",
        "A document still PROCESSING after this is marked FAILED",
        group=INGESTION,
    )
    replaced_version_grace_s: float = _setting(
        5.0,
        "RAGRPC_REPLACED_VERSION_GRACE_S",
        "Ingest service: how long the chunks of a replaced version stay stored after the switch to the new one, so "
        "that a query service that has not applied the switch yet finds the old version instead of neither "
        "(at least a few RAGRPC_REGISTRY_FOLLOW_INTERVAL_S); 0 removes them at once",
        group=INGESTION,
    )
    shutdown_grace_s: float = _setting(10.0, "RAGRPC_SHUTDOWN_GRACE_S", "Grace period on SIGTERM", group=SERVER)
    tenant: str = _setting(
        "default",
        "RAGRPC_TENANT",
        "Tenant of every request when authentication is off",
        group=SECURITY,
    )
    max_concurrent_rpcs: int = _setting(
        64,
        "RAGRPC_MAX_CONCURRENT_RPCS",
        "Calls served at once per service; more get RESOURCE_EXHAUSTED",
        group=SERVER,
    )
    max_pending_documents: int = _setting(
        2048,
        "RAGRPC_MAX_PENDING_DOCUMENTS",
        "Documents queued for ingestion at once; more get RESOURCE_EXHAUSTED",
        group=INGESTION,
    )
    writer_lease_ttl_s: float = _setting(
        30.0,
        "RAGRPC_WRITER_LEASE_TTL_S",
        "The ingest service holds a lease on the collection, renewed every third of this; a second ingest service "
        "refuses to start (FAILED_PRECONDITION) until the holder stops or its lease expires",
        group=INGESTION,
    )
    ingest_call_timeout_s: float = _setting(
        1800.0,
        "RAGRPC_INGEST_CALL_TIMEOUT_S",
        "Server-side deadline of an ingest call",
        group=SERVER,
    )
    query_call_timeout_s: float = _setting(
        120.0,
        "RAGRPC_QUERY_CALL_TIMEOUT_S",
        "Server-side deadline of a Retrieve/Ask call",
        group=SERVER,
    )
    api_keys: str = _setting(
        "",
        "RAGRPC_API_KEYS",
        "API keys as 'tenant=key,...'; setting keys turns authentication on",
        group=SECURITY,
    )
    api_keys_file: str = _setting(
        "",
        "RAGRPC_API_KEYS_FILE",
        "File of '<tenant> sha256:<hex>' lines; turns authentication on",
        group=SECURITY,
    )
    tls_cert_file: str = _setting(
        "",
        "RAGRPC_TLS_CERT_FILE",
        "Server certificate (PEM); with the key, TLS is on",
        group=SECURITY,
    )
    tls_key_file: str = _setting("", "RAGRPC_TLS_KEY_FILE", "Server private key (PEM)", group=SECURITY)
    tls_client_ca_file: str = _setting(
        "",
        "RAGRPC_TLS_CLIENT_CA_FILE",
        "CA bundle of client certificates; setting it requires mutual TLS",
        group=SECURITY,
    )
    allow_plaintext_remote: bool = _setting(
        False,
        "RAGRPC_ALLOW_PLAINTEXT_REMOTE",
        "Allow binding a non-loopback address without TLS",
        group=SECURITY,
    )
    log_level: str = _setting("INFO", "RAGRPC_LOG_LEVEL", "Logging level", group=OBSERVABILITY)
    log_format: str = _setting(
        "text",
        "RAGRPC_LOG_FORMAT",
        "Log format: text or json (one object per line)",
        group=OBSERVABILITY,
    )
    ingest_metrics_port: int = _setting(
        9464,
        "RAGRPC_INGEST_METRICS_PORT",
        "Prometheus metrics port of the ingest service (-1: off)",
        group=OBSERVABILITY,
    )
    query_metrics_port: int = _setting(
        9465,
        "RAGRPC_QUERY_METRICS_PORT",
        "Prometheus metrics port of the query service (-1: off)",
        group=OBSERVABILITY,
    )
    tracing: str = _setting(
        "off",
        "RAGRPC_TRACING",
        "off or otel (OpenTelemetry spans; needs the tracing extra)",
        group=OBSERVABILITY,
    )
    candidates: int = _setting(100, "RAGRPC_CANDIDATES", "Candidates per retriever (N)", group=RETRIEVAL)
    rrf_k: int = _setting(20, "RAGRPC_RRF_K", "RRF constant k when a request leaves rrf_k 0", group=RETRIEVAL)
    dense_weight: float = _setting(
        0.5,
        "RAGRPC_DENSE_WEIGHT",
        "Weighted fusion: weight of the dense list when a request sets none",
        group=RETRIEVAL,
    )
    sparse_weight: float = _setting(
        0.5,
        "RAGRPC_SPARSE_WEIGHT",
        "Weighted fusion: weight of the sparse list when a request sets none",
        group=RETRIEVAL,
    )
    dense_search: str = _setting(
        "auto",
        "RAGRPC_DENSE_SEARCH",
        "Dense search: store (the store's vector index), in_process (exact search over the vectors held in the query "
        "service, 4 bytes a dimension of each chunk) or auto (in_process on milvus-lite, whose own search is slow, and"
        " on a Milvus server whose collection holds at most RAGRPC_DENSE_IN_PROCESS_MAX_CHUNKS chunks at start; store "
        "otherwise)",
        group=RETRIEVAL,
    )
    dense_in_process_max_chunks: int = _setting(
        50_000,
        "RAGRPC_DENSE_IN_PROCESS_MAX_CHUNKS",
        "RAGRPC_DENSE_SEARCH=auto on a Milvus server: hold the vectors and search them exactly while the collection "
        "has at most this many chunks at start (below it, exact search in memory is faster than a round trip to the "
        "server's index); 0: always the server's index",
        group=RETRIEVAL,
    )
    dense_partitions_min_chunks: int = _setting(
        200_000,
        "RAGRPC_DENSE_PARTITIONS_MIN_CHUNKS",
        "Vectors held in the query service: a tenant with at least this many chunks is searched over the nearest of"
        " its coarse partitions (k-means, about 2 x sqrt(chunks) lists, the vectors stored list by list) instead of"
        " every vector; below it, exact search; 0: always exact. Approximate: docs/benchmarks.md has its recall",
        group=RETRIEVAL,
    )
    dense_partitions_probe_percent: float = _setting(
        10.0,
        "RAGRPC_DENSE_PARTITIONS_PROBE_PERCENT",
        "Share of a partitioned tenant's lists a held-vector search reads, the nearest to the query (percent, over 0"
        " and at most 100): more is slower and nearer exact",
        group=RETRIEVAL,
    )
    sparse_backend: str = _setting(
        "rank_bm25",
        "RAGRPC_SPARSE_BACKEND",
        "Sparse retriever: rank_bm25 (an index in the query service), milvus_bm25 (Milvus' BM25 function, 2.5+, over "
        "the same analysed terms; nothing held per replica) or none",
        group=RETRIEVAL,
    )
    bm25_k1: float = _setting(1.5, "RAGRPC_BM25_K1", "rank_bm25: term-frequency saturation k1 (>= 0)", group=RETRIEVAL)
    bm25_b: float = _setting(0.75, "RAGRPC_BM25_B", "rank_bm25: document-length normalisation b (0-1)", group=RETRIEVAL)
    registry_follow_interval_s: float = _setting(
        0.5,
        "RAGRPC_REGISTRY_FOLLOW_INTERVAL_S",
        "Query service: how often a background task applies registry changes (new, replaced, updated, deleted "
        "documents) to its BM25 index and visibility map; queries never wait for it (an acknowledged document is found"
        " by dense search at once, by BM25 and with its deletes within about this interval)",
        group=RETRIEVAL,
    )
    index_snapshot_dir: str = _setting(
        "",
        "RAGRPC_INDEX_SNAPSHOT_DIR",
        "Query service: a local directory where it keeps a snapshot of its in-memory indexes and loads it at start, "
        "then follows the registry from the snapshot's position instead of reading the whole collection; replicas on "
        "one host may share it (the snapshot is memory-mapped). Empty: no snapshots, every start loads in full",
        group=RETRIEVAL,
    )
    index_snapshot_interval_s: float = _setting(
        600.0,
        "RAGRPC_INDEX_SNAPSHOT_INTERVAL_S",
        "Query service: how often it writes a new snapshot (also once after a full load)",
        group=RETRIEVAL,
    )
    index_build_in_child: bool = _setting(
        True,
        "RAGRPC_INDEX_BUILD_IN_CHILD",
        "Query service with a snapshot directory: a start that finds no usable snapshot runs the full load in a child "
        "process, which writes the snapshot and exits; the service then starts from it, so its memory is that of a "
        "start from a snapshot (the load's working heap leaves with the child). Off: the full load runs in the service",
        group=RETRIEVAL,
    )
    index_snapshot_max_age_s: float = _setting(
        518400.0,
        "RAGRPC_INDEX_SNAPSHOT_MAX_AGE_S",
        "Query service: an older snapshot is not used at start (full load instead); keep it below the deletion "
        "journal's 7 days",
        group=RETRIEVAL,
    )
    consistency_max_wait_s: float = _setting(
        10.0,
        "RAGRPC_CONSISTENCY_MAX_WAIT_S",
        "Query service: the longest a Retrieve or Ask that passes a consistency token waits for the service to "
        "reflect that write (never past shortly before the call's deadline); then FAILED_PRECONDITION "
        "(CONSISTENCY_LAG)",
        group=RETRIEVAL,
    )
    index_give_up_after_s: float = _setting(
        60.0,
        "RAGRPC_INDEX_GIVE_UP_AFTER_S",
        "Query service: a document whose chunks the store keeps returning short (fewer than its registry record "
        "counts) stays at its previous version for at most this long, then is indexed with what the store returns "
        "(logged as an error)",
        group=RETRIEVAL,
    )
    registry_reconcile_interval_s: float = _setting(
        60.0,
        "RAGRPC_REGISTRY_RECONCILE_INTERVAL_S",
        "Query service: how often the background task also lists every registry key, a backstop for deletes whose "
        "journal entry it missed (deletes reach it through the journal); at least 20x the last listing's duration",
        group=RETRIEVAL,
    )
    registry_change_journal: str = _setting(
        "auto",
        "RAGRPC_REGISTRY_CHANGE_JOURNAL",
        "Both services, set alike: on (the ingest service journals each document it writes, and the query service's "
        "polls read the journal and the changed rows by key, sweeping the registry every "
        "RAGRPC_REGISTRY_SWEEP_INTERVAL_S), off (no journal: every poll filters the whole registry on updated_at) or "
        "auto (on for milvus-lite, whose filters scan the whole collection; off for a Milvus server, where the filter "
        "is cheap and the journal's write per document cost a quarter of the ingestion ceiling)",
        group=RETRIEVAL,
    )
    registry_sweep_interval_s: float = _setting(
        30.0,
        "RAGRPC_REGISTRY_SWEEP_INTERVAL_S",
        "Query service: how often the background task also reads every registry row changed since its last sweep, "
        "a backstop for changes whose change-journal entry the writer failed to write (changes reach it through the "
        "journal); at least 20x the last sweep's duration. A change whose journal write failed is searchable within "
        "about this long",
        group=RETRIEVAL,
    )
    reranker_provider: str = _setting(
        "auto",
        "RAGRPC_RERANKER_PROVIDER",
        "Reranker: none, local (the cross-encoder RAGRPC_RERANKER_MODEL in the query service), remote (the HTTP rerank"
        " API at RAGRPC_RERANKER_URL) or auto (remote when RAGRPC_RERANKER_URL is set, else local when "
        "RAGRPC_RERANKER_MODEL is set, else none)",
        group=RERANKING,
    )
    reranker_model: str = _setting(
        "",
        "RAGRPC_RERANKER_MODEL",
        "local: cross-encoder directory or hub name; remote: the model name sent to the API (omitted when empty)",
        group=RERANKING,
    )
    reranker_url: str = _setting(
        "",
        "RAGRPC_RERANKER_URL",
        "Remote reranker: the full URL of the rerank endpoint, e.g. https://api.cohere.com/v2/rerank, "
        "http://tei:8080/rerank, http://vllm:8000/v1/rerank",
        group=RERANKING,
    )
    reranker_api: str = _setting(
        "cohere",
        "RAGRPC_RERANKER_API",
        "Remote reranker's request shape: cohere ({model, query, documents, top_n} -> results[{index, "
        "relevance_score}]: Cohere, Jina, vLLM) or tei (TEI's native /rerank: {query, texts} -> [{index, score}])",
        group=RERANKING,
    )
    reranker_api_key_env: str = _setting(
        "",
        "RAGRPC_RERANKER_API_KEY_ENV",
        "Remote reranker: environment variable holding the API key (sent as a Bearer token; it must be set); empty: no"
        " key",
        group=RERANKING,
    )
    reranker_timeout_s: float = _setting(
        5.0,
        "RAGRPC_RERANKER_TIMEOUT_S",
        "Remote reranker: longest wait for one rerank call, never past the request's deadline; a request whose call "
        "fails or times out keeps the fused order and its summary says why",
        group=RERANKING,
    )
    rerank_top_n: int = _setting(30, "RAGRPC_RERANK_TOP_N", "Candidates given to the reranker", group=RERANKING)
    tiktoken_encoding: str = _setting(
        "cl100k_base",
        "RAGRPC_TIKTOKEN_ENCODING",
        "Prompt token encoding: cl100k_base or o200k_base",
        group=ANSWERS,
    )
    token_budget: int = _setting(4000, "RAGRPC_TOKEN_BUDGET", "Default prompt token budget of Ask", group=ANSWERS)
    max_answer_tokens: int = _setting(512, "RAGRPC_MAX_ANSWER_TOKENS", "Default answer length limit", group=ANSWERS)
    llm_endpoints: str = _setting(
        "",
        "RAGRPC_LLM_ENDPOINTS",
        "OpenAI-compatible chat endpoints tried in order before the local extractive answerer: comma-separated "
        "'base_url|model[|api_key_env[|timeout_s]]' entries (api_key_env default OPENAI_API_KEY, timeout_s 30) or a "
        "JSON list of objects with those keys; empty: extractive answers only",
        group=ANSWERS,
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        source = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = source.get(f.metadata["env"])
            if raw is None or raw == "":
                continue
            values[f.name] = _convert(f, raw)
        return cls(**values)

    @property
    def cpu_workers(self) -> int:
        return self.workers or (os.cpu_count() or 1)

    @property
    def document_worker_processes(self) -> int:
        """The ingest service's document worker processes (RAGRPC_INGEST_PROCESSES); 0: none."""
        if self.ingest_processes < -1:
            raise ValueError(
                f"RAGRPC_INGEST_PROCESSES must be -1 (none), 0 (one per core) or more, got {self.ingest_processes}"
            )
        if self.ingest_processes == -1:
            return 0
        return self.ingest_processes or (os.cpu_count() or 1)


def _convert(f: dataclasses.Field[Any], raw: str) -> Any:
    kind = type(f.default)
    try:
        if kind is bool:
            return raw.strip().lower() in {"1", "true", "yes", "on"}
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError as exc:
        raise ValueError(f"{f.metadata['env']}={raw!r} is not a valid {kind.__name__}") from exc
    return raw


def settings_table(group: str | None = None) -> str:
    """Markdown table of every setting (or of one group's): environment variable, default, meaning."""
    lines = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for f in dataclasses.fields(Settings):
        if group is not None and f.metadata["group"] != group:
            continue
        default = f.default if f.default != "" else "(empty)"
        meaning = f.metadata["help"].replace("|", "\\|")  # a bare | would end the cell
        lines.append(f"| `{f.metadata['env']}` | `{default}` | {meaning} |")
    return "\n".join(lines)


def ungrouped_settings() -> list[str]:
    """The environment variables of settings whose group is not one of GROUPS (each must name one)."""
    known = {g.key for g in GROUPS}
    return [f.metadata["env"] for f in dataclasses.fields(Settings) if f.metadata["group"] not in known]
