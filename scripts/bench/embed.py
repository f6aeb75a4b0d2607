"""Embedding backends: torch fp32, ONNX fp32 and ONNX int8 (O2-optimised graph, dynamically
quantised) of the bundled all-MiniLM-L6-v2.

Throughput: passages/second encoding the same sample of SciFact abstracts (title + text,
truncated by the model at 256 tokens), backends and forward batch sizes interleaved round by
round, median of rounds; each at one stream on every core and at two streams of half the
cores each (as the ingest service runs it); each backend is quoted at its fastest batch size and
stream count (torch fp32 runs batches of 8 faster than 32 on a 2-core CPU), so no ratio rests on a
slow baseline.
Quality: nDCG@10 on SciFact train with brute-force numpy retrieval over each backend's
embeddings of the whole corpus (cached under .bench/cache/ between runs), and the mean
cosine of each backend's vectors to torch fp32 on the sample.
Query embedding: one claim's embedding as the query service makes it, through sentence-transformers'
`encode` and through ragrpc.onnx_encoder, alone and beside a thread running Python
(scripts/bench/query_embedding.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ragrpc.embeddings import SentenceTransformerEmbedder, available_cores
from ragrpc.evaluation import BeirDataset, evaluate
from ragrpc.onnx_export import cpu_quantization_config, quantized_file_name
from scripts.bench.common import BenchConfig, SectionResult, load_scifact, ratio
from scripts.bench.query_embedding import add_rows as add_query_embedding_rows

BACKENDS = ("torch", "onnx", "onnx-int8")
BATCH_SIZES = (8, 32)
STREAMS = (1, 2)


def make_embedder(
    backend: str, config: BenchConfig, batch_size: int = 32, streams: int = 1
) -> SentenceTransformerEmbedder:
    embedder = SentenceTransformerEmbedder(
        backend=backend, batch_size=batch_size, onnx_cache_dir=config.onnx_cache, streams=streams
    )
    with torch_threads_for(embedder):
        embedder.warm_up()
    return embedder


@contextlib.contextmanager
def torch_threads_for(embedder: SentenceTransformerEmbedder) -> Iterator[None]:
    """torch's intra-op pool is per process: cores/streams threads while `embedder` runs, then back."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, available_cores() // embedder.streams))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def corpus_texts(dataset: BeirDataset) -> tuple[list[str], list[str]]:
    ids = list(dataset.corpus)
    return ids, [dataset.corpus[d].full_text for d in ids]


def cached_vectors(
    config: BenchConfig, name: str, texts: list[str], embed: SentenceTransformerEmbedder, chunk: int = 512
) -> np.ndarray:
    """Vectors of `texts` by `embed`, cached as .npy keyed by the texts and the backend."""
    digest = hashlib.sha256("\x1e".join(texts).encode()).hexdigest()[:16]
    variant = embed.backend
    if variant == "onnx-int8":  # the quantisation recipe is part of the vectors' identity
        variant += "-" + quantized_file_name(cpu_quantization_config()).removesuffix(".onnx")
    path = config.bench_dir / "cache" / f"{name}-{variant}-{digest}.npy"
    if path.exists():
        return np.load(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = []
    for start in range(0, len(texts), chunk):
        parts.append(embed.embed_documents(texts[start : start + chunk]))
        print(
            f"    embedded {min(start + chunk, len(texts))}/{len(texts)} ({embed.backend})",
            file=sys.stderr,
            flush=True,
        )
    vectors = np.concatenate(parts).astype(np.float32)
    np.save(path.with_suffix(".tmp.npy"), vectors)
    Path(path.with_suffix(".tmp.npy")).replace(path)
    return vectors


def dense_run(
    doc_ids: list[str], matrix: np.ndarray, query_ids: list[str], query_vectors: np.ndarray, k: int = 100
) -> dict[str, list[str]]:
    """Exact cosine top-k (vectors are normalised: inner product) per query, best first."""
    scores = query_vectors @ matrix.T
    k = min(k, matrix.shape[0])
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    run: dict[str, list[str]] = {}
    for row, qid in enumerate(query_ids):
        order = top[row][np.argsort(-scores[row, top[row]])]
        run[qid] = [doc_ids[i] for i in order]
    return run


def ndcg10(dataset: BeirDataset, run: dict[str, list[str]]) -> float:
    judged = {q: dataset.qrels[q] for q in dataset.judged_queries()}
    return evaluate(run, judged, k_values=(10,))["ndcg@10"]


def run(config: BenchConfig) -> SectionResult:
    result = SectionResult("embed")
    quant = cpu_quantization_config()
    result.notes.append(
        f"onnx-int8: dynamic quantisation config '{quant}' "
        f"(avx512_vnni {'present' if quant == 'avx512_vnni' else 'absent'} in /proc/cpuinfo flags)"
    )
    dataset = load_scifact(config.ndcg_docs)
    ids, texts = corpus_texts(dataset)
    sample = texts[: config.embed_sample]
    embedders: dict[tuple[str, int, int], SentenceTransformerEmbedder] = {}
    for backend in BACKENDS:
        for size in BATCH_SIZES:
            for streams in STREAMS:
                key = (backend, size, streams)
                started = time.perf_counter()
                embedders[key] = make_embedder(backend, config, batch_size=size, streams=streams)
                result.data.setdefault("load_seconds", {})[_label(key)] = time.perf_counter() - started
                with torch_threads_for(embedders[key]):
                    embedders[key].embed_documents(sample[:32])  # warm the kernels on real lengths
    rates: dict[tuple[str, int, int], list[float]] = {key: [] for key in embedders}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(config.embed_rounds):
        for key, embedder in embedders.items():
            with torch_threads_for(embedder):
                started = time.perf_counter()
                vectors[key[0]] = embedder.embed_documents(sample)
                rates[key].append(len(sample) / (time.perf_counter() - started))
    by_mode = {_label(key): statistics.median(r) for key, r in rates.items()}
    best_mode = {b: max((k for k in embedders if k[0] == b), key=lambda k: by_mode[_label(k)]) for b in BACKENDS}
    medians = {b: by_mode[_label(best_mode[b])] for b in BACKENDS}
    result.data["passages_per_s_rounds"] = {_label(key): r for key, r in rates.items()}
    result.data["passages_per_s_by_mode"] = by_mode
    result.data["best_mode"] = {b: _label(k) for b, k in best_mode.items()}
    result.data["passages_per_s"] = medians
    qids = list(dataset.judged_queries())
    qtexts = [dataset.queries[q] for q in qids]
    quality: dict[str, float] = {}
    for backend in BACKENDS:
        embedder = embedders[best_mode[backend]]
        with torch_threads_for(embedder):
            matrix = cached_vectors(config, f"scifact{len(ids)}", texts, embedder)
            queries = embedder.embed_documents(qtexts)
        quality[backend] = ndcg10(dataset, dense_run(ids, matrix, qids, queries))
    result.data["ndcg@10"] = quality
    cosine = {b: float(np.mean(np.sum(vectors[b] * vectors["torch"], axis=1))) for b in BACKENDS}
    result.data["mean_cosine_to_torch"] = cosine
    for backend in BACKENDS:
        result.add(
            f"{backend} passages/s",
            medians[backend],
            "passages/s",
            ratio=ratio(medians[backend], medians["torch"]),
            versus="torch",
            note=f"best: {_label(best_mode[backend])} ({_modes_of(backend, by_mode)}); "
            f"median of {config.embed_rounds} round(s) x {len(sample)} abstracts",
        )
    for backend in BACKENDS:
        result.add(
            f"{backend} nDCG@10",
            quality[backend],
            "",
            ratio=quality[backend] - quality["torch"],
            versus="torch (difference)",
        )
    for backend in BACKENDS[1:]:
        result.add(f"{backend} mean cosine to torch", cosine[backend], "")
    fastest = max(BACKENDS, key=lambda b: medians[b])
    result.data["fastest"] = fastest
    result.notes.append(
        f"fastest: {fastest}; target >= 2x torch with nDCG@10 within 0.01: "
        f"{medians[fastest] / medians['torch']:.2f}x, "
        f"nDCG difference {quality[fastest] - quality['torch']:+.4f}"
    )
    result.notes.append(
        f"nDCG@10 over {len(ids)} documents, {len(qids)} judged train queries; whole abstracts "
        "(title + text), truncated by the model at 256 tokens, no chunking; exact numpy top-100"
        + (" (a judged subset, not comparable to published numbers)" if config.ndcg_docs else "")
    )
    add_query_embedding_rows(result, config)
    return result


def _label(key: tuple[str, int, int]) -> str:
    backend, size, streams = key
    return f"{backend}/b{size}/s{streams}"


def _modes_of(backend: str, by_mode: dict[str, float]) -> str:
    return ", ".join(
        f"{label[len(backend) + 1 :]}: {rate:.2f}" for label, rate in by_mode.items() if label.startswith(backend + "/")
    )
