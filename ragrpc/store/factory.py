"""Opens the Milvus-backed stores described by Settings."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ragrpc import errors
from ragrpc.analyzer import EnglishAnalyzer
from ragrpc.config import Settings
from ragrpc.store.bm25_text import Bm25Text
from ragrpc.store.collections import CollectionNames, CollectionSetup, IndexConfig
from ragrpc.store.metadata_fields import parse_keys
from ragrpc.store.milvus_chunks import MilvusChunkStore
from ragrpc.store.milvus_connection import MilvusConnection
from ragrpc.store.milvus_registry import MilvusDocumentRegistry
from ragrpc.store.model_record import LOCAL_PROVIDER
from ragrpc.store.paging import KEYED_SCAN_MIN_PAGES
from ragrpc.store.wal_flusher import WalFlusher, flush_enabled


@dataclass
class MilvusStores:
    connection: MilvusConnection
    setup: CollectionSetup
    chunks: MilvusChunkStore
    registry: MilvusDocumentRegistry


def index_config(settings: Settings) -> IndexConfig:
    return IndexConfig(
        index_type=settings.index_type.upper(),
        hnsw_m=settings.hnsw_m,
        hnsw_ef_construction=settings.hnsw_ef_construction,
        hnsw_ef=settings.hnsw_ef,
        ivf_nlist=settings.ivf_nlist,
        ivf_nprobe=settings.ivf_nprobe,
    )


def connection_for(settings: Settings, *, writer: bool) -> MilvusConnection:
    """The (not yet connected) connection of a service. Only the writer's grouped calls linger
    under load (ingestion is about throughput); a query's registry read never waits."""
    if settings.store_group_linger_ms < 0:
        raise ValueError(f"RAGRPC_STORE_GROUP_LINGER_MS must be >= 0, got {settings.store_group_linger_ms}")
    return MilvusConnection(
        settings.milvus_uri,
        settings.milvus_token,
        settings.store_timeout_s,
        group_linger_s=settings.store_group_linger_ms / 1000.0 if writer else 0.0,
    )


def open_milvus_stores(
    settings: Settings,
    *,
    model_id: str,
    dimension: int,
    writer: bool,
    wait_s: float = 60.0,
    provider: str = LOCAL_PROVIDER,
) -> MilvusStores:
    """Connects (waiting up to wait_s for the server), ensures the collections (only the writer
    creates them) and checks the embedding provider, model and dimension recorded on them."""
    connection = connection_for(settings, writer=writer)
    names = CollectionNames.with_prefix(settings.collection_prefix)
    connection.wait_until_ready(wait_s)
    index = index_config(settings)
    setup = CollectionSetup(connection, names, index, metadata_keys=parse_keys(settings.metadata_filter_keys))
    deadline = time.monotonic() + wait_s
    while True:
        try:
            setup.ensure(model_id, dimension, provider=provider, create=writer)
            break
        except errors.PreconditionError as exc:
            # A reader started before the writer created the collections: wait for it.
            if isinstance(exc, errors.ModelMismatchError) or time.monotonic() > deadline:
                raise
            logging.getLogger(__name__).info("waiting for the collections: %s", exc.message)
            time.sleep(1.0)
    # milvus-lite: scans of a large collection go by key (see ragrpc.store.paging)
    key_scan_from = KEYED_SCAN_MIN_PAGES * settings.store_page_size if setup.embedded else None
    return MilvusStores(
        connection,
        setup,
        MilvusChunkStore(
            connection,
            names,
            index,
            setup,
            page_size=settings.store_page_size,
            bm25_text=Bm25Text(EnglishAnalyzer(), context_headers=settings.context_headers),
            key_scan_from_rows=key_scan_from,
        ),
        MilvusDocumentRegistry(connection, names, page_size=settings.store_page_size, key_scan_from_rows=key_scan_from),
    )


def read_own_registry_writes(stores: MilvusStores) -> None:
    """The sole writer's registry reads from now on wait only for its own writes (Session consistency,
    milvus_connection.ConsistentReads) instead of Milvus' time tick, and its reads by key only for its own
    writes of those keys (key_write_times): call it once the writer holds the lease and its recovery has
    read the registry with the collections' own (Strong) consistency."""
    names = stores.registry.names
    stores.connection.read_consistency.update({names.documents: "Session", names.jobs: "Session"})
    stores.connection.follow_key_writes(names.documents, names.jobs)


def wal_flusher(settings: Settings, stores: MilvusStores) -> WalFlusher | None:
    """The writer's flusher, or None where flushing is off (RAGRPC_MILVUS_FLUSH, see wal_flusher)."""
    if not flush_enabled(settings.milvus_flush, stores.setup.server_version):
        return None
    names = CollectionNames.with_prefix(settings.collection_prefix)
    return WalFlusher(
        stores.connection,
        [names.chunks, names.documents, names.jobs],
        idle_s=settings.milvus_flush_idle_s,
        max_interval_s=settings.milvus_flush_max_interval_s,
    )
