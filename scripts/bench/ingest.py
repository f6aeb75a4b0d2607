"""Ingestion: chunks/second end to end through the gRPC ingest service (IngestDocuments
batches of SciFact abstracts, as `make eval` sends them) against the embedder alone
encoding what the service embedded (the chunks read back from the store, each text after its
context header) in the same run; PDF extraction
pages/second in-process; peak RSS of the ingest process.

With `--ingest-base-size N` the collection already holds N one-chunk documents (the benches' bulk
path, scripts/bench/bulk.py) when the ingest service starts and SciFact is sent, so the figure is
ingestion into a collection of that size (the registry, the WAL flushes and the store's segments
at N documents), not into an empty one."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from ingest_service.extract import build_default_registry
from ragrpc.config import Settings
from ragrpc.context_header import embedded_text
from ragrpc.embeddings import SentenceTransformerEmbedder
from ragrpc.models import ChunkKind
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.factory import open_milvus_stores
from scripts.bench.common import (
    PDF_DIR,
    BenchConfig,
    SectionResult,
    load_scifact,
    proc_cpu_seconds,
    proc_status_kb,
    ratio,
)
from scripts.bench.embed import torch_threads_for
from scripts.eval import ingest as ingest_over_grpc
from scripts.processes import Stack

PREFIX = "bench_ingest"
PER_DOCUMENT_LIMIT = 1000  # documents of the one-call-per-document pass (it is the slowest mode)
COLLECTION = "scifact"


def pdf_extraction(pdf_dir: Path = PDF_DIR, every: int = 1) -> dict[str, Any]:
    """Extracts every `every`-th PDF in-process; failing ones (encrypted, empty, broken) are skipped and
    counted; pages/second over the rest."""
    registry = build_default_registry()
    pages, seconds, cpu_seconds, ok = 0, 0.0, 0.0, 0
    skipped: dict[str, str] = {}
    for path in sorted(pdf_dir.glob("*.pdf"))[::every]:
        data = path.read_bytes()
        started, cpu = time.perf_counter(), time.process_time()
        try:
            document = registry.extract(data, file_name=path.name, media_type="application/pdf")
        except Exception as exc:  # noqa: BLE001 - a benchmark skips what fails and says why
            skipped[path.name] = f"{type(exc).__name__}: {str(exc)[:80]}"
            continue
        seconds += time.perf_counter() - started
        cpu_seconds += time.process_time() - cpu
        count = document.metadata.page_count or len({b.page for b in document.blocks if b.page})
        pages += count
        ok += 1
    return {
        "pages": pages,
        "seconds": seconds,
        "documents": ok,
        "skipped": skipped,
        "pages_per_s": pages / seconds if seconds else None,
        "pages_per_cpu_s": pages / cpu_seconds if cpu_seconds else None,
    }


def stored_chunk_texts(settings: Settings, embedder: SentenceTransformerEmbedder) -> dict[str, list[tuple[str, str]]]:
    """document id -> (text, embedded text) of the retrievable chunks of the ingested collection, in
    chunk order, read back from the store (the bulk-loaded base, a collection of its own, is left
    out). The embedded text is what the service gave the model: the chunk's text after its context
    header (when those are on), rebuilt from the stored title, section path and metadata by the
    function the pipeline uses."""
    stores = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=False)
    counter, window = embedder.token_counter(), embedder.max_tokens
    rows: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    retrievable = f.and_(f.eq(s.KIND, int(ChunkKind.RETRIEVABLE)), f.eq(s.COLLECTION, COLLECTION))
    for batch in stores.chunks.scan_chunks(retrievable):
        for chunk in batch:
            embedded = (
                embedded_text(chunk.title, chunk.section_path, chunk.metadata, chunk.text, counter, window)
                if settings.context_headers
                else chunk.text
            )
            rows[chunk.document_id].append((chunk.chunk_index, chunk.text, embedded))
    stores.connection.reset()
    return {doc: [(text, embedded) for _, text, embedded in sorted(items)] for doc, items in rows.items()}


def embed_alone(
    embedder: SentenceTransformerEmbedder,
    single_stream: SentenceTransformerEmbedder | None,
    stored: dict[str, list[tuple[str, str]]],
) -> dict[str, float]:
    """Chunks/second of the embedder alone on what the service embedded (each chunk's text after its
    context header): all texts in one call with batches of the configured size and the service's
    streams, and (when it uses more than one) with one stream on every core, and one call per
    document (the batches the ingest pipeline forms); then the chunk texts alone, without their
    headers, in one call (what the headers cost the model)."""
    by_document = {doc: [embedded for _, embedded in items] for doc, items in stored.items()}
    texts = [t for items in by_document.values() for t in items]
    started, cpu = time.perf_counter(), time.process_time()
    embedder.embed_documents(texts)
    batched, batched_cpu = time.perf_counter() - started, time.process_time() - cpu
    result = {
        "chunks": float(len(texts)),
        "batched_chunks_per_s": len(texts) / batched,
        "batched_chunks_per_cpu_s": len(texts) / batched_cpu if batched_cpu else float("nan"),
    }
    plain = [text for items in stored.values() for text, _ in items]
    started, cpu = time.perf_counter(), time.process_time()
    embedder.embed_documents(plain)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    result["without_headers_chunks_per_s"] = len(plain) / seconds
    result["without_headers_chunks_per_cpu_s"] = len(plain) / cpu_seconds if cpu_seconds else float("nan")
    one_call = embedder
    with contextlib.ExitStack() as stack:
        if single_stream is not None:
            stack.enter_context(torch_threads_for(single_stream))  # per process: the streams set cores/streams
            single_stream.warm_up()
            started, cpu = time.perf_counter(), time.process_time()
            single_stream.embed_documents(texts)
            seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
            result["one_stream_chunks_per_s"] = len(texts) / seconds
            result["one_stream_chunks_per_cpu_s"] = len(texts) / cpu_seconds if cpu_seconds else float("nan")
            one_call = single_stream  # calls of one or two texts do not split over streams
        documents = list(by_document.values())[:PER_DOCUMENT_LIMIT]
        started = time.perf_counter()
        for items in documents:
            one_call.embed_documents(items)
        result["per_document_chunks_per_s"] = sum(map(len, documents)) / (time.perf_counter() - started)
        result["per_document_documents"] = float(len(documents))
    return result


def run(config: BenchConfig) -> SectionResult:
    result = SectionResult("ingest")
    pdf = pdf_extraction(every=4 if config.quick else 1)  # quick: every 4th PDF
    result.data["pdf"] = pdf
    result.add(
        "PDF extraction",
        pdf["pages_per_s"],
        "pages/s",
        note=f"{pdf['pages']} pages of {pdf['documents']} PDFs; {len(pdf['skipped'])} skipped; "
        f"{pdf['pages_per_cpu_s'] or 0:.2f} pages per CPU-second",
    )
    if pdf["skipped"]:
        result.notes.append(
            "PDFs skipped (encrypted/empty/unreadable without a password): " + ", ".join(sorted(pdf["skipped"]))
        )

    dataset = load_scifact(config.ingest_docs)
    data_dir = config.bench_dir / "ingest-stack"
    shutil.rmtree(data_dir, ignore_errors=True)  # fresh: otherwise every document is "unchanged"
    settings = dataclasses.replace(Settings.from_env(), collection_prefix=PREFIX)
    embedder = SentenceTransformerEmbedder(
        settings.embedding_model,
        backend=settings.embedding_backend,
        batch_size=settings.embedding_batch_size,
        onnx_cache_dir=config.onnx_cache,
        streams=settings.embedding_streams,
    )
    embedder.warm_up()
    with Stack(data_dir) as stack:
        stack.start_milvus()
        base_seconds = _bulk_base(dataclasses.replace(settings, milvus_uri=stack.milvus_uri), embedder, config)
        address = stack.start_ingest({"RAGRPC_COLLECTION_PREFIX": PREFIX})
        pid = stack.processes["ingest"].pid
        before = proc_status_kb(pid)
        pids = (pid, stack.processes["milvus"].pid)
        cpu_before = [proc_cpu_seconds(p) for p in pids]
        print(f"  ingesting {len(dataset.corpus)} SciFact documents over gRPC", file=sys.stderr, flush=True)
        outcome = ingest_over_grpc(address, dataset, COLLECTION)
        after = proc_status_kb(pid)
        ingest_cpu, milvus_cpu = (proc_cpu_seconds(p) - before_s for p, before_s in zip(pids, cpu_before, strict=True))
        service_cpu = ingest_cpu + milvus_cpu
        milvus = proc_status_kb(stack.processes["milvus"].pid)
        stored = stored_chunk_texts(dataclasses.replace(settings, milvus_uri=stack.milvus_uri), embedder)
    service_rate = outcome["chunks_written"] / outcome["seconds"] if outcome["seconds"] else None
    alone = embed_alone(embedder, _one_stream(embedder, settings, config), stored)
    # The reference is the embedder's fastest mode (the service's streams, one multi-threaded stream,
    # one call per document), so the ratio never flatters the service.
    modes = ("batched_chunks_per_s", "one_stream_chunks_per_s", "per_document_chunks_per_s")
    best_alone = max(alone[mode] for mode in modes if mode in alone)
    best_cpu_alone = max(alone["batched_chunks_per_cpu_s"], alone.get("one_stream_chunks_per_cpu_s", 0.0))
    result.data.update(
        grpc=outcome,
        embedder_alone=alone,
        ingest_rss_kb={"ready": before, "after": after},
        milvus_rss_kb=milvus,
        service_cpu_s=service_cpu,
        ingest_cpu_s=ingest_cpu,
        milvus_cpu_s=milvus_cpu,
        backend=settings.embedding_backend,
        batch_size=settings.embedding_batch_size,
        streams=settings.embedding_streams,
        base_documents=config.ingest_base_size,
        base_load_seconds=base_seconds,
    )
    base = f"into a collection of {config.ingest_base_size:,} documents; " if config.ingest_base_size else ""
    result.add(
        "gRPC IngestDocuments",
        service_rate,
        "chunks/s",
        ratio=ratio(service_rate, best_alone),
        versus="embedder alone (faster mode)",
        note=f"{base}{outcome['chunks_written']} chunks of {outcome['documents']} docs in {outcome['seconds']} s; "
        f"{outcome['failed']} failed",
    )
    result.add(
        f"embedder alone, batches of {settings.embedding_batch_size}, {settings.embedding_streams} stream(s)",
        alone["batched_chunks_per_s"],
        "chunks/s",
        note=f"the {alone['chunks']:.0f} stored chunks as the service embedded them (context header + text)",
    )
    result.add(
        "embedder alone, chunk texts without their headers",
        alone["without_headers_chunks_per_s"],
        "chunks/s",
        ratio=ratio(alone["without_headers_chunks_per_s"], alone["batched_chunks_per_s"]),
        versus="with headers",
        note=f"{1000 / alone['without_headers_chunks_per_cpu_s']:.1f} ms CPU a chunk without headers; "
        "what the context headers cost the model, not the service",
    )
    if "one_stream_chunks_per_s" in alone:
        result.add(
            "embedder alone, one stream on every core",
            alone["one_stream_chunks_per_s"],
            "chunks/s",
            ratio=ratio(alone["one_stream_chunks_per_s"], alone["batched_chunks_per_s"]),
            versus=f"{settings.embedding_streams} streams",
        )
    result.add(
        "embedder alone, one call per doc",
        alone["per_document_chunks_per_s"],
        "chunks/s",
        ratio=ratio(alone["per_document_chunks_per_s"], alone["batched_chunks_per_s"]),
        versus="batched",
        note=f"first {alone['per_document_documents']:.0f} documents, one stream on every core",
    )
    per_cpu = outcome["chunks_written"] / service_cpu if service_cpu > 0 else None
    result.add(
        "gRPC ingestion chunks per CPU-second",
        per_cpu,
        "chunks/cpu-s",
        ratio=ratio(per_cpu, best_cpu_alone),
        versus="embedder alone (better mode)",
        note="CPU of the ingest + milvus-lite processes; steadier than wall time on a shared machine",
    )
    chunks = outcome["chunks_written"] or 1
    result.add(
        "CPU per chunk: ingest process / milvus-lite",
        1000 * ingest_cpu / chunks,
        "ms",
        note=f"milvus-lite {1000 * milvus_cpu / chunks:.1f} ms; the embedder alone "
        f"{1000 / best_cpu_alone:.1f} ms (its better mode)",
    )
    result.add(
        "ingest process peak RSS (VmHWM)",
        after.get("VmHWM", 0) / 1024,
        "MiB",
        note=f"ready: {before.get('VmRSS', 0) / 1024:.0f} MiB RSS",
    )
    result.add("milvus-lite peak RSS (VmHWM)", milvus.get("VmHWM", 0) / 1024, "MiB")
    result.notes.append(
        f"embedding backend {settings.embedding_backend} (service default) in both measurements; "
        "target: gRPC ingestion >= 0.85 of the embedder alone on the same texts"
    )
    return result


def _bulk_base(settings: Settings, embedder: SentenceTransformerEmbedder, config: BenchConfig) -> float:
    """Bulk-loads `config.ingest_base_size` one-chunk documents (collection "bench", vectors derived
    from 256 embedded pool texts) before the ingest service starts; returns the seconds it took."""
    if config.ingest_base_size <= 0:
        return 0.0
    from scripts.bench import bulk
    from scripts.bench.querydata import text_pool

    texts = text_pool(config.ingest_base_size)
    print(f"  bulk-loading {len(texts):,} documents as the collection's base", file=sys.stderr, flush=True)
    stores = open_milvus_stores(settings, model_id=embedder.model_id, dimension=embedder.dimension, writer=True)
    try:
        base = embedder.embed_documents(texts[:256])
        return bulk.bulk_load(stores, settings.collection_prefix, texts, bulk.derived_vectors(base, len(texts)))
    finally:
        stores.connection.reset()


def _one_stream(
    embedder: SentenceTransformerEmbedder, settings: Settings, config: BenchConfig
) -> SentenceTransformerEmbedder | None:
    """The same embedder as one stream on every core, when the service runs several."""
    if embedder.streams == 1:
        return None
    return SentenceTransformerEmbedder(
        settings.embedding_model,
        backend=settings.embedding_backend,
        batch_size=settings.embedding_batch_size,
        onnx_cache_dir=config.onnx_cache,
    )
