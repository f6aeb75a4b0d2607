"""The query service's in-process BM25 index at collection size (section `bm25_scale`): memory, search
latency, recall against exact BM25, compaction, and index snapshots (write, load, RSS after load).

Corpus: the scale section's (scripts/bench/scale.py `_texts`): the text pool of scripts/bench/querydata.py
(SciFact abstracts' sentences in windows of 1-3 and the shared documents' sentences, 135,450 distinct
texts), then numbered variants of them ("<text> (variant k)") up to the size, one chunk a document, the
chunks made as the index sync makes them (query_service.index_sync.indexed_chunk, with the analysed terms a
schema-2 collection stores). Each distinct text is analysed once; a variant's terms are its text's plus
"variant" and k (checked against the analyzer on a sample). Queries: 100 SciFact claims, as in the scale
section.

Figures per size (100k and 1M chunks; 20k with --quick):
  * build: seconds to add every document one by one (as the sync's start-up load does) and the final
    `compact()`; the process's RSS growth for the index (glibc's free memory handed back first) and the
    index's own array bytes (`memory_bytes`);
  * search: p50/p99 of top-10 (no filter) and of top-100 with the request's tenant filter through
    `HeldFilter` (what `Retrieve`'s sparse stage asks), after one untimed pass;
  * recall@10 against exact BM25: the index's top-10 against the top-10 of an independent vectorised
    computation of rank_bm25's formula over the flat (chunk, term) arrays (`_ExactBm25`; ties by chunk id),
    itself checked against rank_bm25.BM25Okapi on the first 5,000 chunks (rank_bm25 at 1M takes too long);
  * snapshot, of the BM25 index alone (a Milvus server's query service) and with as many random unit
    vectors of 384 floats held by the dense index (milvus-lite's): write seconds and size; a full sha256
    verification with the page cache warm (just written) and cold (the files' pages dropped with
    posix_fadvise DONTNEED first); a fresh process loading it from a cold cache with the sampled and with
    the full verification - seconds to load, RSS before/after the load and after the 100 queries (and 100
    dense searches), anonymous and file-backed; replace_document p50 in the loaded index, a search that
    finds the new documents, and a compaction of the loaded index (its seconds and RSS after).

With RAGRPC_BENCH_BM25_BEFORE=<commit>, the same build and searches are run on that commit's
query_service/sparse_index.py (and the modules it imports that differ), for a before/after in one run.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from query_service.chunk_attrs import HeldFilter
from query_service.dense_index import InProcessDenseIndex, VectorChunk
from query_service.index_snapshot import save_snapshot, verify_snapshot
from query_service.index_sync import indexed_chunk
from query_service.sparse_index import IndexedChunk, InProcessBm25Index
from ragrpc.analyzer import EnglishAnalyzer
from ragrpc.models import ChunkKind, ChunkRecord
from ragrpc.store.request_filter import filter_from_request
from scripts.bench import bulk
from scripts.bench.common import BENCH_DIR, BenchConfig, SectionResult, load_scifact, percentile
from scripts.bench.querydata import text_pool
from scripts.processes import REPO

SIZES = (100_000, 1_000_000)
QUICK_SIZES = (20_000,)
QUERIES = 100
CHECK_CHUNKS = 5_000
IDENTITY = {"bench": "bm25_scale", "analyzer": "english"}
DIMENSION = 384


# --- corpus ------------------------------------------------------------------------------


def _corpus(size: int, pool: list[str], pool_terms: list[list[str]]) -> list[IndexedChunk]:
    """The scale section's texts (pool, then numbered variants) as the index sync's chunks."""
    analyzer = EnglishAnalyzer()
    for i in range(len(pool), min(size, len(pool) + 50), 7):  # a variant's terms are what the analyzer makes
        k = i // len(pool)
        assert analyzer.analyze(f"{pool[i % len(pool)]} (variant {k})") == [
            *pool_terms[i % len(pool)],
            "variant",
            str(k),
        ]
    now = int(time.time())
    chunks = []
    for i in range(size):
        k = i // len(pool)
        terms = pool_terms[i % len(pool)] + (["variant", str(k)] if k else [])
        document_id = bulk.document_id(i)
        record = ChunkRecord(
            chunk_id=bulk.chunk_id(i),
            document_id=document_id,
            tenant=bulk.TENANT,
            collection=bulk.COLLECTION,
            generation=bulk.GENERATION,
            text="",
            vector=[],
            chunk_index=0,
            chunker="bench",
            source=f"{document_id}.txt",
            title=document_id,
            media_type="text/plain",
            kind=ChunkKind.RETRIEVABLE,
            created_at=now,
        )
        record.bm25_terms = tuple(terms)
        chunks.append(indexed_chunk(record))
    return chunks


# --- exact reference ---------------------------------------------------------------------


class _ExactBm25:
    """rank_bm25.BM25Okapi's scores computed afresh in numpy from the flat (chunk, term) pairs: an
    independent reference for recall (it shares no code with the index)."""

    def __init__(self, chunks: Sequence[IndexedChunk], k1: float = 1.5, b: float = 0.75, epsilon: float = 0.25):
        vocabulary: dict[str, int] = {}
        term_ids = [
            np.fromiter((vocabulary.setdefault(t, len(vocabulary)) for t in c.terms or ()), np.int64) for c in chunks
        ]
        self.lengths = np.array([len(t) for t in term_ids], dtype=np.float64)
        self.terms = np.concatenate(term_ids) if term_ids else np.zeros(0, np.int64)
        self.chunk_of = np.repeat(np.arange(len(chunks)), [len(t) for t in term_ids])
        self.vocabulary = vocabulary
        self.ids = [c.chunk_id for c in chunks]
        n = len(chunks)
        pairs = np.unique(self.chunk_of * len(vocabulary) + self.terms)  # each (chunk, term) once
        df = np.bincount(pairs % len(vocabulary), minlength=len(vocabulary)).astype(np.float64)
        idf = np.log(n - df + 0.5) - np.log(df + 0.5)
        self.idf = np.where(idf < 0, epsilon * idf.mean(), idf)
        self.k1, self.b, self.avg = k1, b, self.lengths.mean()

    def scores(self, query: Sequence[str]) -> np.ndarray:
        total = np.zeros(len(self.lengths))
        for term in query:
            term_id = self.vocabulary.get(term)
            if term_id is None:
                continue
            tf = np.bincount(self.chunk_of[self.terms == term_id], minlength=len(self.lengths)).astype(np.float64)
            norm = self.k1 * (1 - self.b + self.b * self.lengths / self.avg)
            total += self.idf[term_id] * (tf * (self.k1 + 1) / (tf + norm))
        return total

    def top(self, query: Sequence[str], k: int) -> list[str]:
        """The k best chunks holding a query term, ties by chunk id."""
        scores = self.scores(query)
        held = self._holding(set(query))
        if len(held) > k:  # every chunk scoring at least the k-th best, then the exact order among them
            kth = -np.partition(-scores[held], k - 1)[k - 1]
            held = held[scores[held] >= kth]
        ordered = sorted(held.tolist(), key=lambda i: (-scores[i], self.ids[i]))
        return [self.ids[i] for i in ordered[:k]]

    def _holding(self, terms: set[str]) -> np.ndarray:
        ids = [self.vocabulary[t] for t in terms if t in self.vocabulary]
        return np.unique(self.chunk_of[np.isin(self.terms, ids)])


def _check_reference(chunks: Sequence[IndexedChunk], queries: list[list[str]]) -> float:
    """Largest relative difference of _ExactBm25 from rank_bm25.BM25Okapi on the first chunks."""
    from rank_bm25 import BM25Okapi

    part = list(chunks[:CHECK_CHUNKS])
    reference = BM25Okapi([list(c.terms or ()) for c in part])
    ours = _ExactBm25(part)
    worst = 0.0
    for query in queries[:20]:
        expected, got = reference.get_scores(query), ours.scores(query)
        worst = max(worst, float(np.max(np.abs(expected - got) / np.maximum(np.abs(expected), 1e-12))))
    return worst


# --- measuring ---------------------------------------------------------------------------


def _rss_kb() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0])
    return out


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _build(index_type: Callable[[], Any], chunks: list[IndexedChunk]) -> tuple[Any, dict[str, float]]:
    _trim()
    before = _rss_kb()["VmRSS"]
    started = time.perf_counter()
    index = index_type()
    for chunk in chunks:
        index.replace_document(bulk.TENANT, str(chunk.attrs["document_id"]), [chunk])
    added = time.perf_counter() - started
    compact = getattr(index, "compact", None)
    if compact is not None:
        compact()
    seconds = time.perf_counter() - started
    _trim()
    grown = (_rss_kb()["VmRSS"] - before) * 1024
    return index, {"add_s": added, "build_s": seconds, "rss_bytes_per_chunk": grown / len(chunks)}


def _latencies(index: Any, queries: list[str]) -> dict[str, float]:
    expr = filter_from_request(bulk.TENANT)
    for query in queries:  # untimed pass
        index.search(query, 10, tenant=bulk.TENANT)
    plain, filtered = [], []
    for query in queries:
        started = time.perf_counter()
        index.search(query, 10, tenant=bulk.TENANT)
        plain.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        index.search(query, 100, tenant=bulk.TENANT, allow=HeldFilter(expr))
        filtered.append((time.perf_counter() - started) * 1000)
    return {
        "top10_p50_ms": percentile(plain, 50),
        "top10_p99_ms": percentile(plain, 99),
        "top100_filtered_p50_ms": percentile(filtered, 50),
        "top100_filtered_p99_ms": percentile(filtered, 99),
    }


def _recall(index: Any, reference: _ExactBm25, queries: list[str]) -> dict[str, float]:
    analyzer = EnglishAnalyzer()
    recalls, identical = [], 0
    for query in queries:
        exact = reference.top(analyzer.analyze(query), 10)
        got = [chunk_id for chunk_id, _ in index.search(query, 10, tenant=bulk.TENANT)]
        recalls.append(len(set(got) & set(exact)) / max(1, len(exact)))
        identical += got == exact
    return {"recall_at_10": float(np.mean(recalls)), "identical_top10": identical / len(queries)}


_PROBE = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path

    import numpy as np

    def rss():
        out = {}
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
        return out

    from query_service.index_snapshot import load_snapshot
    from query_service.sparse_index import IndexedChunk
    from ragrpc.analyzer import EnglishAnalyzer
    directory, identity, queries, dense = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    before = rss()
    started = time.perf_counter()
    analyzer, verify = EnglishAnalyzer(), sys.argv[5]
    loaded = load_snapshot(
        directory, identity=identity, max_age_s=86400, analyzer=analyzer, dense=dense == "1", verify=verify
    )
    load_s = time.perf_counter() - started
    after_load = rss()
    index = loaded.bm25
    times = []
    for query in queries:
        started = time.perf_counter()
        index.search(query, 10, tenant="default")
        times.append(time.perf_counter() - started)
    dense_times = []
    if loaded.dense is not None:
        vectors = np.random.default_rng(3).standard_normal((len(queries), loaded.dense.dimension)).astype(np.float32)
        for vector in vectors:
            started = time.perf_counter()
            loaded.dense.search(vector, 10, tenant="default")
            dense_times.append(time.perf_counter() - started)
    after_queries = rss()
    replaces = []
    for i in range(200):  # new versions of existing documents, then new documents: the recent part
        started = time.perf_counter()
        chunk = IndexedChunk(f"probe-{i}", "", {}, ["probe", "term", str(i)])
        index.replace_document("default", f"doc-{i * 997:07d}", [chunk])
        replaces.append(time.perf_counter() - started)
    search_after = time.perf_counter()
    found = index.search("probe term", 10, tenant="default")
    search_after = time.perf_counter() - search_after
    after_updates = rss()
    started = time.perf_counter()
    index.compact()
    compact_s = time.perf_counter() - started
    first = times[0]
    times.sort(); replaces.sort(); dense_times.sort()
    print(json.dumps({
        "load_s": load_s, "rss_before": before, "rss_after_load": after_load, "rss_after_queries": after_queries,
        "rss_after_updates": after_updates, "first_search_ms": first * 1000,
        "search_p50_ms": times[len(times) // 2] * 1000, "replace_p50_ms": replaces[len(replaces) // 2] * 1000,
        "dense_search_p50_ms": dense_times[len(dense_times) // 2] * 1000 if dense_times else None,
        "search_after_updates_ms": search_after * 1000, "updates_found": len(found), "compact_s": compact_s,
        "rss_after_compact": rss(),
    }))
    """
)


def _evict(path: Path) -> None:
    """Drop the snapshot's files from the page cache (they are clean: written and fsynced), so what
    follows reads them from the disk, as a replica starting on a cold host does."""
    for file in path.iterdir():
        descriptor = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def _probe(directory: Path, queries: list[str], dense: bool, verify: str) -> dict[str, Any]:
    arguments = [str(directory), json.dumps(IDENTITY), json.dumps(queries), "1" if dense else "0", verify]
    probe = subprocess.run(
        [sys.executable, "-c", _PROBE, *arguments],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return dict(json.loads(probe.stdout.strip().splitlines()[-1]))


def _snapshot(
    index: InProcessBm25Index, queries: list[str], directory: Path, dense: InProcessDenseIndex | None = None
) -> dict[str, Any]:
    """Write a snapshot, verify it in full (page cache warm, then cold), and load it in fresh processes
    (sampled verification, cold; full verification, cold)."""
    started = time.perf_counter()
    path = save_snapshot(
        directory, identity=IDENTITY, follower_state={"bench": True}, watermark=1, bm25=index, dense=dense
    )
    write_s = time.perf_counter() - started
    size = sum(p.stat().st_size for p in path.iterdir())
    timings: dict[str, float] = {}
    for cache in ("warm", "cold"):
        if cache == "cold":
            _evict(path)
        started = time.perf_counter()
        problem = verify_snapshot(path)
        timings[f"full_verify_{cache}_s"] = time.perf_counter() - started
        assert problem is None, problem
    _evict(path)
    sampled = _probe(directory, queries, dense is not None, "sampled")
    _evict(path)
    full = _probe(directory, queries, dense is not None, "full")
    return {"write_s": write_s, "bytes": size, **timings, **sampled, "full_verify_load_cold_s": full["load_s"]}


def _dense_index(size: int) -> InProcessDenseIndex:
    """`size` random unit vectors of DIMENSION floats, one a document, added one by one and compacted."""
    index = InProcessDenseIndex(DIMENSION)
    rng = np.random.default_rng(5)
    for start in range(0, size, 4096):
        vectors = rng.standard_normal((min(4096, size - start), DIMENSION)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        for offset, vector in enumerate(vectors):
            number = start + offset
            chunk = VectorChunk(bulk.chunk_id(number), vector, {"collection": bulk.COLLECTION})
            index.replace_document(bulk.TENANT, bulk.document_id(number), [chunk])
    index.compact()
    return index


def _before_index_type(commit: str) -> Callable[[], Any]:
    """The InProcessBm25Index of `commit`, loaded from git beside this tree's modules."""
    package = types.ModuleType("bm25_before")
    package.__path__ = []
    sys.modules["bm25_before"] = package
    modules = ("growable_array", "chunk_attrs", "sparse_index")
    for name in modules:
        source = subprocess.run(
            ["git", "show", f"{commit}:query_service/{name}.py"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
        for other in modules:
            source = source.replace(f"from query_service.{other} import", f"from bm25_before.{other} import")
        module = types.ModuleType(f"bm25_before.{name}")
        sys.modules[module.__name__] = module
        exec(compile(source, f"{commit}:query_service/{name}.py", "exec"), module.__dict__)  # noqa: S102
    index_type = sys.modules["bm25_before.sparse_index"].InProcessBm25Index
    return lambda: index_type(EnglishAnalyzer())


# --- the section -------------------------------------------------------------------------


def run(config: BenchConfig) -> SectionResult:
    result = SectionResult("bm25_scale")
    sizes = QUICK_SIZES if config.quick else SIZES
    pool = text_pool(None)
    analyzer = EnglishAnalyzer()
    pool_terms = [analyzer.analyze(text) for text in pool[: max(sizes)]]
    queries = list(load_scifact().queries.values())[:QUERIES]
    before_commit = os.environ.get("RAGRPC_BENCH_BM25_BEFORE", "")
    work = Path(tempfile.mkdtemp(prefix="bm25-scale-", dir=BENCH_DIR if BENCH_DIR.exists() else None))
    try:
        for size in sizes:
            chunks = _corpus(size, pool, pool_terms)
            data: dict[str, Any] = {"chunks": size}
            reference = _ExactBm25(chunks)
            data["reference_max_rel_diff_vs_rank_bm25"] = _check_reference(
                chunks, [analyzer.analyze(q) for q in queries]
            )
            index, data["build"] = _build(lambda: InProcessBm25Index(EnglishAnalyzer()), chunks)
            data["memory_bytes_per_chunk"] = index.memory_bytes() / size
            data["search"] = _latencies(index, queries)
            data["recall"] = _recall(index, reference, queries)
            del reference
            data["snapshot"] = _snapshot(index, queries, work / f"snapshot-{size}")
            dense = _dense_index(size)
            data["snapshot_with_vectors"] = _snapshot(index, queries, work / f"snapshot-vectors-{size}", dense)
            del index, dense
            if before_commit:
                before, data["before_build"] = _build(_before_index_type(before_commit), chunks)
                data["before_search"] = _latencies(before, queries)
                data["before_commit"] = before_commit
                del before
            del chunks
            _report(result, size, data)
            result.data[f"size_{size}"] = data
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _report(result: SectionResult, size: int, data: dict[str, Any]) -> None:
    label = f"{size:,} chunks"
    build, search = data["build"], data["search"]
    result.add(f"BM25 index RSS growth, {label}", build["rss_bytes_per_chunk"], "B/chunk", note="compacted")
    result.add(f"BM25 index arrays, {label}", data["memory_bytes_per_chunk"], "B/chunk")
    result.add(f"build (add one by one + compact), {label}", build["build_s"], "s")
    for key, name in (("top10", "top-10"), ("top100_filtered", "top-100 with the tenant filter")):
        p99 = search[f"{key}_p99_ms"]
        result.add(f"search {name} p50, {label}", search[f"{key}_p50_ms"], "ms", note=f"p99 {p99:.1f}")
    result.add(f"recall@10 against exact BM25, {label}", data["recall"]["recall_at_10"], "")
    for key, what in (("snapshot", "BM25"), ("snapshot_with_vectors", f"BM25 + {DIMENSION}-d vectors")):
        snapshot = data[key]
        megabytes = f"{snapshot['bytes'] / 2**20:.0f} MiB"
        result.add(f"snapshot ({what}) write, {label}", snapshot["write_s"], "s", note=megabytes)
        result.add(f"snapshot ({what}) load, cold, sampled check, {label}", snapshot["load_s"], "s")
        result.add(f"snapshot ({what}) load, cold, full check, {label}", snapshot["full_verify_load_cold_s"], "s")
        rss = snapshot["rss_after_queries"]
        anon = f"anon {rss['RssAnon'] / 2**20:.0f} MiB"
        result.add(f"snapshot ({what}) RSS after load and queries, {label}", rss["VmRSS"] / 2**20, "MiB", note=anon)
    if "before_build" in data:
        before = data["before_build"]
        result.add(f"before: BM25 index RSS growth, {label}", before["rss_bytes_per_chunk"], "B/chunk")
        result.add(f"before: build, {label}", before["build_s"], "s")
        for key, name in (("top10", "top-10"), ("top100_filtered", "top-100 with the tenant filter")):
            p99 = data["before_search"][f"{key}_p99_ms"]
            result.add(
                f"before: search {name} p50, {label}",
                data["before_search"][f"{key}_p50_ms"],
                "ms",
                note=f"p99 {p99:.1f}",
            )


def main() -> None:  # pragma: no cover - `python -m scripts.bench --sections bm25_scale` is the way in
    print(json.dumps(run(BenchConfig(quick="--quick" in sys.argv)).data, indent=1, default=str))


if __name__ == "__main__":  # pragma: no cover
    main()
