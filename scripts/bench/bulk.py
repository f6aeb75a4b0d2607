"""The benches' bulk path into a collection (never a path users can call): one-chunk documents of
real text with vectors derived from embedded ones, chunk rows and registry rows written in
batches of 4,096 straight through the store adapter, so the query service sees current
generations of ACTIVE documents. Their registry rows carry update times as if they had been ingested
at DOCUMENTS_PER_SECOND, the last an hour before the load (not all in the load's last seconds: the
query service's registry follower re-reads the newest couple of seconds of updates at every poll,
which for a collection loaded in one burst would be thousands of rows twice a second).

Vectors: `base` (a few thousand embedded texts) plus Gaussian noise, renormalised, so that a
collection of a million chunks does not need a million model calls; neighbourhoods stay those of
real embeddings (each base vector's cloud of variants) and exact search over the same matrix is
the recall reference.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator

import numpy as np

from ragrpc.models import ChunkKind, ChunkRecord, DocumentRecord, DocumentState, chunk_id_for
from ragrpc.store import schema as s
from ragrpc.store.collections import CollectionNames
from ragrpc.store.factory import MilvusStores
from ragrpc.store.milvus_registry import record_to_row

TENANT = "default"
COLLECTION = "bench"
GENERATION = "bench-g1"
BATCH = 4096


def derived_vectors(base: np.ndarray, count: int, noise: float = 0.03, seed: int = 5) -> Iterator[np.ndarray]:
    """`count` unit vectors in batches of BATCH: base[i % len(base)] + N(0, noise), renormalised."""
    rng = np.random.default_rng(seed)
    for start in range(0, count, BATCH):
        stop = min(start + BATCH, count)
        batch = base[np.arange(start, stop) % len(base)] + rng.normal(0, noise, size=(stop - start, base.shape[1]))
        yield (batch / np.linalg.norm(batch, axis=1, keepdims=True)).astype(np.float32)


def document_id(number: int) -> str:
    return f"doc-{number:07d}"


def chunk_id(number: int) -> str:
    """The chunk id of document `number` (its one chunk)."""
    return chunk_id_for(TENANT, document_id(number), GENERATION, 0)


def chunk_rows(texts: list[str], vectors: np.ndarray, start: int) -> list[ChunkRecord]:
    now = int(time.time())
    out = []
    for offset, text in enumerate(texts):
        doc = document_id(start + offset)
        out.append(
            ChunkRecord(
                chunk_id=chunk_id(start + offset),
                document_id=doc,
                tenant=TENANT,
                collection=COLLECTION,
                generation=GENERATION,
                text=text,
                vector=vectors[offset].tolist(),
                chunk_index=0,
                chunker="bench",
                source=f"{doc}.txt",
                title=doc,
                media_type="text/plain",
                kind=ChunkKind.RETRIEVABLE,
                content_hash=hashlib.sha256(doc.encode()).hexdigest(),
                created_at=now,
            )
        )
    return out


DOCUMENTS_PER_SECOND = 10  # the bulk-loaded documents look ingested at this rate, the last an hour ago
_LAST_UPDATE_AGO_S = 3600


def registry_record(chunk: ChunkRecord, updated_at: int | None = None) -> DocumentRecord:
    return DocumentRecord(
        tenant=chunk.tenant,
        document_id=chunk.document_id,
        collection=chunk.collection,
        source=chunk.source,
        title=chunk.title,
        media_type="text/plain",
        content_hash=chunk.content_hash,
        state=DocumentState.ACTIVE,
        chunk_count=1,
        chunker="bench",
        created_at=chunk.created_at,
        generation=chunk.generation,
        updated_at=int(time.time()) if updated_at is None else updated_at,
    )


def bulk_load(stores: MilvusStores, prefix: str, texts: list[str], vectors: Iterator[np.ndarray]) -> float:
    """Writes one document per text; returns the seconds it took (writes and the final flush)."""
    started = time.perf_counter()
    names = CollectionNames.with_prefix(prefix)
    first_update = int(time.time()) - _LAST_UPDATE_AGO_S - len(texts) // DOCUMENTS_PER_SECOND
    for start, batch in zip(range(0, len(texts), BATCH), vectors, strict=False):
        chunks = chunk_rows(texts[start : start + len(batch)], batch, start)
        stores.chunks.insert_chunks(chunks)
        rows = [
            record_to_row(registry_record(c, first_update + (start + i) // DOCUMENTS_PER_SECOND))
            for i, c in enumerate(chunks)
        ]
        stores.connection.write_rows("upsert", names.documents, rows, s.DOC_KEY)
    stores.connection.flush([names.chunks, names.documents])
    return time.perf_counter() - started
