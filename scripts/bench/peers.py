"""Peers on SciFact train: rank-bm25 BM25Okapi (lowercase \\w+ tokens, as the shared eval
README's baseline) and brute-force numpy dense top-k over the same embeddings (latency per
query and nDCG@10 for both), and Haystack doing the same ingestion with the same model
directory in a separate venv under .bench/ (never a project dependency)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ragrpc.config import BUNDLED_MODEL
from ragrpc.embeddings import resolve_model_path
from ragrpc.evaluation import BeirDataset
from scripts.bench.common import BenchConfig, SectionResult, load_scifact, ratio, summary_ms
from scripts.bench.embed import corpus_texts, dense_run, ndcg10

_TOKEN = re.compile(r"\w+")
PEER_PACKAGES = ("haystack-ai", "sentence-transformers-haystack", "sentence-transformers")
TORCH_PIN = "torch==2.13.0"  # the CPU wheel; an unpinned torch pulls a multi-GB CUDA build


class DocumentEmbedder(Protocol):
    def embed_documents(self, texts: list[str]) -> np.ndarray: ...


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def bm25_peer(dataset: BeirDataset, k: int = 100) -> dict[str, Any]:
    """rank-bm25 BM25Okapi over whole documents: build time, per-query latency, nDCG@10."""
    from rank_bm25 import BM25Okapi

    ids, texts = corpus_texts(dataset)
    started = time.perf_counter()
    index = BM25Okapi([tokenize(t) for t in texts])
    build = time.perf_counter() - started
    run: dict[str, list[str]] = {}
    latencies = []
    for qid, text in dataset.judged_queries().items():
        started = time.perf_counter()
        scores = index.get_scores(tokenize(text))
        top = np.argpartition(-scores, min(k, len(ids)) - 1)[: min(k, len(ids))]
        run[qid] = [ids[i] for i in top[np.argsort(-scores[top])]]
        latencies.append(time.perf_counter() - started)
    return {"build_s": build, "latency_ms": summary_ms(latencies), "ndcg@10": ndcg10(dataset, run), "run": run}


def dense_peer(
    dataset: BeirDataset, doc_vectors: np.ndarray, query_vectors: np.ndarray, k: int = 100
) -> dict[str, Any]:
    """Exact numpy top-k per query over precomputed vectors: latency per query (search only) and nDCG@10."""
    ids, _ = corpus_texts(dataset)
    qids = list(dataset.judged_queries())
    latencies = []
    for row in range(len(qids)):
        started = time.perf_counter()
        dense_run(ids, doc_vectors, qids[row : row + 1], query_vectors[row : row + 1], k)
        latencies.append(time.perf_counter() - started)
    run = dense_run(ids, doc_vectors, qids, query_vectors, k)
    return {"latency_ms": summary_ms(latencies), "ndcg@10": ndcg10(dataset, run)}


def ensure_peer_venv(venv: Path, allow_install: bool) -> tuple[Path | None, str]:
    """(python of the peers venv, "") when Haystack imports there, else (None, why not)."""
    python = venv / "bin" / "python"
    probe = [
        str(python),
        "-c",
        "import haystack, haystack_integrations.components.embedders.sentence_transformers",
    ]
    if python.exists() and subprocess.run(probe, capture_output=True, timeout=300).returncode == 0:
        return python, ""
    if not allow_install:
        return None, f"Haystack is not installed in {venv} (a full run installs it; --quick does not)"
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "-q", TORCH_PIN],
        [str(python), "-m", "pip", "install", "-q", *PEER_PACKAGES],
    ]
    for step in steps:
        print(f"  peers: {' '.join(step[-3:])}", file=sys.stderr, flush=True)
        done = subprocess.run(step, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            return None, f"installing {' '.join(step[3:]) or 'the venv'} failed: {done.stderr.strip()[-300:]}"
    if subprocess.run(probe, capture_output=True, timeout=300).returncode != 0:
        return None, "Haystack installed but does not import"
    return python, ""


def _peer_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HAYSTACK_TELEMETRY_ENABLED": "False"}


def haystack_peer(config: BenchConfig, dataset: BeirDataset) -> dict[str, Any]:
    python, why = ensure_peer_venv(config.bench_dir / "peers-venv", allow_install=not config.quick)
    if python is None:
        return {"skipped": why}
    ids, _ = corpus_texts(dataset)
    docs = [[d, f"{dataset.corpus[d].title}\n\n{dataset.corpus[d].text}"] for d in ids]
    work = config.bench_dir / "haystack"
    work.mkdir(parents=True, exist_ok=True)
    spec = {
        "model": resolve_model_path(BUNDLED_MODEL),
        "docs": docs,
        "top_k": 100,
        "queries": [[q, t] for q, t in dataset.judged_queries().items()],
    }
    (work / "input.json").write_text(json.dumps(spec))
    script = Path(__file__).with_name("haystack_peer.py")
    done = subprocess.run(
        [str(python), str(script), str(work / "input.json"), str(work / "output.json")],
        capture_output=True,
        text=True,
        timeout=7200,
        env=_peer_env(),
    )
    if done.returncode != 0:
        return {"skipped": f"Haystack run failed offline: {done.stderr.strip()[-400:]}"}
    out = json.loads((work / "output.json").read_text())
    return {
        "versions": out["versions"],
        "documents": out["documents"],
        "docs_per_s": out["docs_per_s"],
        "index_seconds": out["index_seconds"],
        "latency_ms": {name: summary_ms(values) for name, values in out["latency_s"].items()},
        "ndcg@10": {name: ndcg10(dataset, run) for name, run in out["runs"].items()},
    }


def run(config: BenchConfig, context: dict[str, Any] | None = None) -> SectionResult:
    from scripts.bench.embed import cached_vectors, make_embedder

    context = context or {}
    result = SectionResult("peers")
    dataset = load_scifact(config.peer_docs)
    bm25 = bm25_peer(dataset)
    embedder = make_embedder("torch", config)
    ids, texts = corpus_texts(dataset)
    doc_vectors = cached_vectors(config, f"scifact{len(ids)}", texts, embedder)
    query_vectors = embedder.embed_documents(list(dataset.judged_queries().values()))
    dense = dense_peer(dataset, doc_vectors, query_vectors)
    haystack = haystack_peer(config, dataset)
    result.data.update(
        bm25=bm25,
        numpy_dense=dense,
        haystack=haystack,
        documents=len(ids),
        queries=len(dataset.judged_queries()),
    )
    result.add("rank-bm25 BM25Okapi nDCG@10", bm25["ndcg@10"], "")
    result.add(
        "rank-bm25 BM25Okapi per query p50",
        bm25["latency_ms"]["p50"],
        "ms",
        note=f"p99 {bm25['latency_ms']['p99']:.1f}; build {bm25['build_s']:.1f} s",
    )
    result.add(
        "numpy dense (torch fp32) nDCG@10",
        dense["ndcg@10"],
        "",
        ratio=dense["ndcg@10"] - bm25["ndcg@10"],
        versus="BM25 (difference)",
    )
    result.add(
        "numpy dense top-100 per query p50",
        dense["latency_ms"]["p50"],
        "ms",
        note=f"search only, {len(ids)} x 384 matrix",
    )
    if "skipped" in haystack:
        result.notes.append(f"Haystack: {haystack['skipped']}")
    else:
        ingest_rate = context.get("ragrpc_docs_per_s")
        result.add(
            "Haystack ingestion (embed + write)",
            haystack["docs_per_s"],
            "docs/s",
            ratio=ratio(ingest_rate, haystack["docs_per_s"]) if ingest_rate else None,
            versus="ragrpc gRPC docs/s / Haystack" if ingest_rate else "",
            note=f"{haystack['documents']} docs in {haystack['index_seconds']:.0f} s",
        )
        result.add(
            "Haystack dense nDCG@10",
            haystack["ndcg@10"]["dense"],
            "",
            ratio=haystack["ndcg@10"]["dense"] - dense["ndcg@10"],
            versus="numpy dense (difference)",
        )
        result.add("Haystack BM25 nDCG@10", haystack["ndcg@10"]["bm25"], "")
        for name in ("embed_query", "dense_retrieve", "bm25_retrieve"):
            result.add(f"Haystack {name} p50", haystack["latency_ms"][name]["p50"], "ms")
        result.notes.append(
            "Haystack "
            + ", ".join(f"{k} {v}" for k, v in haystack["versions"].items())
            + "; whole abstracts (no splitter), the same bundled model directory, torch fp32"
        )
    result.notes.append(
        f"{len(ids)} documents, {len(dataset.judged_queries())} judged train queries"
        + (" (a judged subset, not comparable to published numbers)" if config.peer_docs else "")
    )
    return result
