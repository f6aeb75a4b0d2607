"""Memory per chunk of the query service's in-process indexes (BM25 and held vectors), in-process by
tracemalloc: every SciFact abstract (5,183, about 150 analysed terms each) as a chunk built the way
the index sync builds them (`query_service.index_sync.indexed_chunk`: the stored analysed terms and
the filterable attributes), grouped into documents of 1 and of 10 chunks (a collection of short
documents, and one of long documents whose chunks share their document's attributes). Also the
median top-100 BM25 search with a request's filter over the same index (the filter reads each
candidate's attributes).

Each index is measured compacted (`compact()`: numpy arrays only, what a replica holds after its load
or a snapshot load), and the BM25 index also as added, before any compaction (its recent part: what the
chunks added since the last compaction cost), with the attribute columns' share of the compacted figure.

What a collection of N chunks costs the query service on top of the model and the runtime is about N
times these figures (plus the registry's documents), so they say how large a collection fits a
machine's memory.
"""

from __future__ import annotations

import gc
import statistics
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

from query_service.dense_index import InProcessDenseIndex, VectorChunk
from query_service.index_sync import indexed_chunk
from query_service.sparse_index import IndexedChunk, InProcessBm25Index
from ragrpc.analyzer import EnglishAnalyzer
from ragrpc.models import ChunkKind, ChunkRecord
from ragrpc.store.request_filter import filter_from_request
from scripts.bench.common import BenchConfig, SectionResult, load_scifact

DIMENSION = 384
GROUPS = (1, 10)


def _chunks(group: int, docs: int) -> list[IndexedChunk]:
    analyzer = EnglishAnalyzer()
    corpus = list(load_scifact(docs).corpus.values())
    chunks = []
    for i, doc in enumerate(corpus):
        record = ChunkRecord(
            chunk_id=f"{i:032x}",
            document_id=f"doc-{i // group}",
            tenant="acme",
            collection="papers",
            generation=f"{i // group:016x}",
            text=doc.text,
            vector=[],
            chunk_index=i % group,
            chunker="recursive",
            kind=ChunkKind.RETRIEVABLE,
            source=f"/data/papers/{i // group}.pdf",
            title=doc.title,
            page_start=1 + (i % group) // 2,
            page_end=1 + (i % group) // 2,
        )
        record.bm25_terms = tuple(analyzer.analyze(f"{doc.title}\n{doc.text}"))
        chunks.append(indexed_chunk(record))
    return chunks


def _allocated(build: Callable[[], object]) -> tuple[int, object]:
    """Bytes still allocated by what `build` returns (tracemalloc), and the built object."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    built = build()
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    return sum(stat.size_diff for stat in after.compare_to(before, "filename")), built


def _documents(chunks: list[IndexedChunk], group: int) -> list[tuple[str, list[IndexedChunk]]]:
    return [(str(chunks[s].attrs["document_id"]), chunks[s : s + group]) for s in range(0, len(chunks), group)]


def _bm25(documents: list[tuple[str, list[IndexedChunk]]], compact: bool = True) -> InProcessBm25Index:
    index = InProcessBm25Index(EnglishAnalyzer(), merge_min_chunks=10**9)  # compacted at the end, or never
    for document_id, part in documents:
        index.add_document("acme", document_id, part)
    if compact:
        index.compact()
    return index


def _dense(documents: list[tuple[str, list[IndexedChunk]]], vector: np.ndarray) -> InProcessDenseIndex:
    index = InProcessDenseIndex(DIMENSION)
    for document_id, part in documents:
        index.replace_document("acme", document_id, [VectorChunk(c.chunk_id, vector, c.attrs) for c in part])
    index.compact()
    return index


def run(config: BenchConfig) -> SectionResult:
    """Each index is built from chunks made inside the measurement and dropped after it (as the index
    sync's scan pages are), so what the index keeps of them is counted, whoever allocated it."""
    result = SectionResult("index_memory")
    docs = 1000 if config.quick else 0
    queries = list(load_scifact(docs).queries.values())[:300]
    allow = filter_from_request("acme", collection="papers").matches
    vector = np.random.default_rng(5).normal(size=DIMENSION).astype(np.float32)
    for group in GROUPS:
        recent_bytes, _ = _allocated(lambda: _bm25(_documents(_chunks(group, docs), group), compact=False))  # noqa: B023
        sparse_bytes, sparse_index = _allocated(lambda: _bm25(_documents(_chunks(group, docs), group)))  # noqa: B023
        dense_bytes, _ = _allocated(lambda: _dense(_documents(_chunks(group, docs), group), vector))  # noqa: B023
        assert isinstance(sparse_index, InProcessBm25Index)
        attrs_bytes = sum(scope.slots.attrs.nbytes for scope in sparse_index._scopes.values())  # noqa: SLF001
        times = []
        for query in queries:
            started = time.perf_counter()
            sparse_index.search(query, 100, tenant="acme", allow=allow)
            times.append(time.perf_counter() - started)
        n = sparse_index.chunk_count("acme")
        label = f"documents of {group} chunk{'s' if group > 1 else ''}"
        result.data[f"group_{group}"] = {
            "chunks": n,
            "bm25_bytes_per_chunk": sparse_bytes / n,
            "bm25_uncompacted_bytes_per_chunk": recent_bytes / n,
            "attrs_bytes_per_chunk": attrs_bytes / n,
            "dense_bytes_per_chunk": dense_bytes / n,
            "bm25_search_p50_ms": statistics.median(times) * 1000,
        }
        result.add(f"BM25 index, {label}", sparse_bytes / n, "B/chunk", note=f"{n} SciFact abstracts, compacted")
        result.add(f"of which attribute columns, {label}", attrs_bytes / n, "B/chunk")
        result.add(f"BM25 index before compaction, {label}", recent_bytes / n, "B/chunk", note="recent part")
        result.add(f"held vectors and attributes, {label}", dense_bytes / n, "B/chunk", note=f"{DIMENSION} float32")
        result.add(f"BM25 top-100 with a filter, {label}", statistics.median(times) * 1000, "ms", note="p50")
    return result
