"""Bench collections for the query and concurrency sections: real text (SciFact abstract
sentences in windows of 1-3, and the shared documents' sentences), embedded once and cached
as .npy under .bench/cache/, bulk-loaded through the store adapter with registry rows so the
query service sees the chunks as current generations of ACTIVE documents."""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
import time
from pathlib import Path

import numpy as np

from ingest_service.extract import build_default_registry
from ragrpc.config import Settings
from ragrpc.embeddings import SentenceTransformerEmbedder
from ragrpc.models import ChunkKind, ChunkRecord, DocumentRecord, DocumentState, chunk_id_for
from ragrpc.onnx_export import file_lock
from ragrpc.store.collections import CollectionNames
from ragrpc.store.factory import MilvusStores, open_milvus_stores
from scripts.bench.common import DOCS_DIR, BenchConfig, load_scifact

TENANT = "default"
COLLECTION = "bench"
GENERATION = "bench-g1"
CHUNKS_PER_DOCUMENT = 100
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9(\"'])")
_PART = 2048


def _sentences(text: str) -> list[str]:
    return [p.strip() for p in _SENTENCE.split(" ".join(text.split())) if len(p.strip()) > 20]


def _shared_document_sentences() -> list[list[str]]:
    """Sentences of every shared PDF/DOCX/HTML/Markdown document that extracts without a password."""
    registry = build_default_registry()
    out: list[list[str]] = []
    for path in sorted(p for p in DOCS_DIR.rglob("*") if p.suffix.lower() in (".pdf", ".docx", ".html", ".md")):
        if "groundtruth" in path.parts:
            continue
        try:
            document = registry.extract(path.read_bytes(), file_name=path.name)
        except Exception:  # noqa: BLE001 - encrypted, empty or broken: not bench text
            continue
        sentences = _sentences(" ".join(b.text for b in document.blocks))
        if sentences:
            out.append(sentences)
    return out


def text_pool(limit: int | None, seed: int = 7) -> list[str]:
    """`limit` distinct texts in a fixed order (None: all of them); any shorter prefix is itself a valid pool."""
    dataset = load_scifact()
    sources = [_sentences(d.full_text) for d in dataset.corpus.values()] + _shared_document_sentences()
    seen: dict[str, None] = {}
    for width in (3, 2, 1):
        for sentences in sources:
            for start in range(0, max(1, len(sentences) - width + 1)):
                text = " ".join(sentences[start : start + width])[:1500]
                seen.setdefault(text, None)
    pool = list(seen)
    random.Random(seed).shuffle(pool)
    if limit is None:
        return pool
    if len(pool) < limit:
        raise RuntimeError(f"only {len(pool)} distinct texts available, {limit} asked")
    return pool[:limit]


def _pool_texts(cache: Path, total: int) -> list[str]:
    """The first `total` pool texts, from any saved pool at least that long (pools are
    prefixes of each other), else built now."""
    for path in sorted(cache.glob("pool-*.texts.json")):
        if int(path.name.split("-")[1]) >= total:
            return list(json.loads(path.read_text())[:total])
    return text_pool(total)


def _cached_pool(cache: Path, n: int) -> tuple[list[str], np.ndarray, str] | None:
    for meta_path in sorted(cache.glob("pool-*.json")):
        if meta_path.name.endswith(".texts.json"):
            continue
        meta = json.loads(meta_path.read_text())
        vectors_path = meta_path.with_suffix(".npy")
        if meta["n"] >= n and vectors_path.exists():
            texts = json.loads(Path(meta["texts"]).read_text())[:n]
            return texts, np.load(vectors_path, mmap_mode="r")[:n].astype(np.float32), str(meta["backend"])
    return None


def cached_texts_and_vectors(config: BenchConfig, n: int, backend: str) -> tuple[list[str], np.ndarray, str]:
    """The first n texts of the pool and their vectors. Vectors come from any existing cache
    of a pool at least n long (whatever backend made it), else are embedded now with
    `backend` in parts of 2048 (only the parts the first n texts need): a killed run resumes
    with the backend it started with, and a file lock per pool size keeps two runs from
    embedding the same pool twice."""
    cache = config.bench_dir / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    found = _cached_pool(cache, n)
    if found is not None:
        return found
    total = max(n, config.pool_size)
    with file_lock(cache / f"pool-{total}.lock"):
        found = _cached_pool(cache, n)  # another run may have finished it while we waited
        if found is not None:
            return found
        started = sorted(cache.glob(f"pool-{total}-*.texts.json"))
        if started:  # resume an interrupted embedding with its backend
            stem = cache / started[0].name.removesuffix(".texts.json")
            backend = "-".join(stem.name.split("-")[2:-1])
            texts = list(json.loads(started[0].read_text()))
        else:
            texts = _pool_texts(cache, total)
            digest = hashlib.sha256("\x1e".join(texts).encode()).hexdigest()[:12]
            stem = cache / f"pool-{total}-{backend}-{digest}"
            Path(f"{stem}.texts.json").write_text(json.dumps(texts))
        vectors, seconds = _embed_in_parts(config, stem, texts, backend, upto=n)
        if len(vectors) < total:  # only the prefix asked for: the rest waits for a run that needs it
            return texts[:n], vectors[:n], backend
        np.save(f"{stem}.npy", vectors)
        meta = {"n": total, "backend": backend, "texts": f"{stem}.texts.json", "embed_seconds": seconds}
        Path(f"{stem}.json").write_text(json.dumps(meta))
        for part in cache.glob(f"{stem.name}.part*.npy"):
            part.unlink(missing_ok=True)
        return texts[:n], vectors[:n], backend


def _embed_in_parts(
    config: BenchConfig, stem: Path, texts: list[str], backend: str, upto: int
) -> tuple[np.ndarray, float]:
    """Vectors of texts[:upto] rounded up to whole parts, embedding the parts not yet on disk."""
    embedder = SentenceTransformerEmbedder(backend=backend, batch_size=64, onnx_cache_dir=config.onnx_cache)
    parts = []
    started = time.perf_counter()
    stop = min(len(texts), -(-upto // _PART) * _PART)  # whole parts covering the first `upto`
    for number, start in enumerate(range(0, stop, _PART)):
        part = Path(f"{stem}.part{number}.npy")
        if part.exists():
            parts.append(np.load(part))
            continue
        np.save(part.with_suffix(".tmp.npy"), embedder.embed_documents(texts[start : start + _PART]))
        part.with_suffix(".tmp.npy").replace(part)
        parts.append(np.load(part))
        done = start + len(parts[-1])
        print(
            f"    embedded {done}/{len(texts)} bench texts ({backend}, {time.perf_counter() - started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    return np.concatenate(parts).astype(np.float32), time.perf_counter() - started


def chunk_records(texts: list[str], vectors: np.ndarray, start: int, stop: int) -> list[ChunkRecord]:
    now = int(time.time())
    out = []
    for i in range(start, stop):
        document_id = f"bench-{i // CHUNKS_PER_DOCUMENT:06d}"
        out.append(
            ChunkRecord(
                chunk_id=chunk_id_for(TENANT, document_id, GENERATION, i % CHUNKS_PER_DOCUMENT),
                document_id=document_id,
                tenant=TENANT,
                collection=COLLECTION,
                generation=GENERATION,
                text=texts[i],
                vector=vectors[i].tolist(),
                chunk_index=i % CHUNKS_PER_DOCUMENT,
                chunker="bench",
                source=f"{document_id}.txt",
                title=document_id,
                media_type="text/plain",
                kind=ChunkKind.RETRIEVABLE,
                content_hash=hashlib.sha256(document_id.encode()).hexdigest(),
                created_at=now,
            )
        )
    return out


def _drop(stores: MilvusStores, prefix: str) -> None:
    client = stores.connection.client()
    names = CollectionNames.with_prefix(prefix)
    for name in (names.chunks, names.documents, names.jobs):
        if client.has_collection(name):
            client.drop_collection(name)


def ensure_collection(settings: Settings, model_id: str, texts: list[str], vectors: np.ndarray) -> dict[str, float]:
    """Makes settings.collection_prefix hold exactly these chunks (reused when it already
    does); returns load timings. The bench is the only writer while it loads."""
    dimension = int(vectors.shape[1])
    stores = open_milvus_stores(settings, model_id=model_id, dimension=dimension, writer=True)
    client = stores.connection.client()
    names = CollectionNames.with_prefix(settings.collection_prefix)
    existing = client.query(names.chunks, filter="", output_fields=["count(*)"])[0]["count(*)"]
    documents = client.query(names.documents, filter="", output_fields=["count(*)"])[0]["count(*)"]
    expected_documents = (len(texts) + CHUNKS_PER_DOCUMENT - 1) // CHUNKS_PER_DOCUMENT + 1  # + model-info row
    if existing == len(texts) and documents == expected_documents:
        stores.connection.reset()
        return {"reused": 1.0, "insert_s": 0.0}
    if existing or documents > 1:
        _drop(stores, settings.collection_prefix)
        stores.connection.reset()
        stores = open_milvus_stores(settings, model_id=model_id, dimension=dimension, writer=True)
    started = time.perf_counter()
    for start in range(0, len(texts), 4096):
        stores.chunks.insert_chunks(chunk_records(texts, vectors, start, min(start + 4096, len(texts))))
    insert_s = time.perf_counter() - started
    for number in range(0, (len(texts) + CHUNKS_PER_DOCUMENT - 1) // CHUNKS_PER_DOCUMENT):
        document_id = f"bench-{number:06d}"
        count = min(CHUNKS_PER_DOCUMENT, len(texts) - number * CHUNKS_PER_DOCUMENT)
        stores.registry.put(
            DocumentRecord(
                tenant=TENANT,
                document_id=document_id,
                collection=COLLECTION,
                source=f"{document_id}.txt",
                title=document_id,
                media_type="text/plain",
                content_hash=hashlib.sha256(document_id.encode()).hexdigest(),
                state=DocumentState.ACTIVE,
                chunk_count=count,
                chunker="bench",
                created_at=int(time.time()),
                generation=GENERATION,
            )
        )
    registry_s = time.perf_counter() - started - insert_s
    client.flush(names.chunks)
    stores.connection.reset()
    return {
        "reused": 0.0,
        "insert_s": insert_s,
        "registry_s": registry_s,
        "rows_per_s": len(texts) / insert_s if insert_s else 0.0,
    }


def drop_collection(settings: Settings, model_id: str, dimension: int) -> None:
    stores = open_milvus_stores(settings, model_id=model_id, dimension=dimension, writer=True)
    _drop(stores, settings.collection_prefix)
    stores.connection.reset()


def prefix_for(size: int, index_type: str) -> str:
    return f"bench_q{size}_{index_type.lower()}"


__all__ = [
    "COLLECTION",
    "TENANT",
    "cached_texts_and_vectors",
    "chunk_records",
    "drop_collection",
    "ensure_collection",
    "prefix_for",
]
