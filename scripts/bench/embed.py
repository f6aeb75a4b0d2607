"""Embedding backends: torch fp32, ONNX fp32 and ONNX int8 (dynamically quantised) of the
bundled all-MiniLM-L6-v2.

Throughput: passages/second encoding the same sample of SciFact abstracts (title + text,
truncated by the model at 256 tokens), backends interleaved round by round, median of
rounds. Quality: nDCG@10 on SciFact train with brute-force numpy retrieval over each
backend's embeddings of the whole corpus (cached under .bench/cache/ between runs), and
the mean cosine of each backend's vectors to torch fp32 on the sample.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from ragrpc.embeddings import SentenceTransformerEmbedder, cpu_quantization_config
from ragrpc.evaluation import BeirDataset, evaluate
from scripts.bench.common import BenchConfig, SectionResult, load_scifact, ratio

BACKENDS = ("torch", "onnx", "onnx-int8")


def make_embedder(backend: str, config: BenchConfig, batch_size: int = 32) -> SentenceTransformerEmbedder:
    embedder = SentenceTransformerEmbedder(backend=backend, batch_size=batch_size, onnx_cache_dir=config.onnx_cache)
    embedder.warm_up()
    return embedder


def corpus_texts(dataset: BeirDataset) -> tuple[list[str], list[str]]:
    ids = list(dataset.corpus)
    return ids, [dataset.corpus[d].full_text for d in ids]


def cached_vectors(
    config: BenchConfig, name: str, texts: list[str], embed: SentenceTransformerEmbedder, chunk: int = 512
) -> np.ndarray:
    """Vectors of `texts` by `embed`, cached as .npy keyed by the texts and the backend."""
    digest = hashlib.sha256("\x1e".join(texts).encode()).hexdigest()[:16]
    path = config.bench_dir / "cache" / f"{name}-{embed.backend}-{digest}.npy"
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
    embedders: dict[str, SentenceTransformerEmbedder] = {}
    for backend in BACKENDS:
        started = time.perf_counter()
        embedders[backend] = make_embedder(backend, config)
        result.data.setdefault("load_seconds", {})[backend] = time.perf_counter() - started
        embedders[backend].embed_documents(sample[:32])  # warm the kernels on real lengths
    rates: dict[str, list[float]] = {b: [] for b in BACKENDS}
    vectors: dict[str, np.ndarray] = {}
    for _ in range(config.embed_rounds):
        for backend in BACKENDS:
            started = time.perf_counter()
            vectors[backend] = embedders[backend].embed_documents(sample)
            rates[backend].append(len(sample) / (time.perf_counter() - started))
    medians = {b: statistics.median(r) for b, r in rates.items()}
    result.data["passages_per_s_rounds"] = rates
    result.data["passages_per_s"] = medians
    qids = list(dataset.judged_queries())
    qtexts = [dataset.queries[q] for q in qids]
    quality: dict[str, float] = {}
    for backend in BACKENDS:
        matrix = cached_vectors(config, f"scifact{len(ids)}", texts, embedders[backend])
        queries = embedders[backend].embed_documents(qtexts)
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
            note=f"median of {config.embed_rounds} round(s) x {len(sample)} abstracts",
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
    return result
