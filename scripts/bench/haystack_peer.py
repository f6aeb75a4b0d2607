"""Runs inside the separate peers venv (.bench/peers-venv), never in the project's: Haystack
ingests the same documents with the same model directory (SentenceTransformersDocumentEmbedder
-> DocumentWriter -> InMemoryDocumentStore) and answers the queries with
InMemoryEmbeddingRetriever and InMemoryBM25Retriever. Imports nothing from the project.

    python haystack_peer.py INPUT.json OUTPUT.json

INPUT: {"model": dir, "docs": [[id, text], ...], "queries": [[qid, text], ...], "top_k": 100}
OUTPUT: timings, versions and the rankings (scored by the caller).
"""

from __future__ import annotations

import json
import os
import sys
import time
from importlib import metadata


def main(source: str, target: str) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
    from haystack import Document, Pipeline
    from haystack.components.retrievers.in_memory import InMemoryBM25Retriever, InMemoryEmbeddingRetriever
    from haystack.components.writers import DocumentWriter
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack.utils import ComponentDevice
    from haystack_integrations.components.embedders.sentence_transformers import (
        SentenceTransformersDocumentEmbedder,
        SentenceTransformersTextEmbedder,
    )

    spec = json.loads(open(source, encoding="utf-8").read())
    device = ComponentDevice.from_str("cpu")
    store = InMemoryDocumentStore(embedding_similarity_function="cosine")
    doc_embedder = SentenceTransformersDocumentEmbedder(
        model=spec["model"],
        device=device,
        batch_size=32,
        progress_bar=False,
        normalize_embeddings=True,
        local_files_only=True,
    )
    indexing = Pipeline()
    indexing.add_component("embedder", doc_embedder)
    indexing.add_component("writer", DocumentWriter(document_store=store))
    indexing.connect("embedder", "writer")
    documents = [Document(content=text, meta={"beir_id": doc_id}) for doc_id, text in spec["docs"]]
    started = time.perf_counter()
    doc_embedder.warm_up()
    warm = time.perf_counter() - started
    started = time.perf_counter()
    indexing.run({"embedder": {"documents": documents}})
    index_seconds = time.perf_counter() - started

    text_embedder = SentenceTransformersTextEmbedder(
        model=spec["model"],
        device=device,
        progress_bar=False,
        normalize_embeddings=True,
        local_files_only=True,
    )
    text_embedder.warm_up()
    dense = InMemoryEmbeddingRetriever(document_store=store)
    bm25 = InMemoryBM25Retriever(document_store=store)
    top_k = int(spec.get("top_k", 100))
    runs: dict[str, dict[str, list[str]]] = {"dense": {}, "bm25": {}}
    latency: dict[str, list[float]] = {"embed_query": [], "dense_retrieve": [], "bm25_retrieve": []}
    for qid, text in spec["queries"]:
        started = time.perf_counter()
        vector = text_embedder.run(text=text)["embedding"]
        latency["embed_query"].append(time.perf_counter() - started)
        started = time.perf_counter()
        hits = dense.run(query_embedding=vector, top_k=top_k)["documents"]
        latency["dense_retrieve"].append(time.perf_counter() - started)
        runs["dense"][qid] = [d.meta["beir_id"] for d in hits]
        started = time.perf_counter()
        hits = bm25.run(query=text, top_k=top_k)["documents"]
        latency["bm25_retrieve"].append(time.perf_counter() - started)
        runs["bm25"][qid] = [d.meta["beir_id"] for d in hits]
    versions = {
        name: metadata.version(name)
        for name in ("haystack-ai", "sentence-transformers-haystack", "sentence-transformers", "torch")
    }
    result = {
        "versions": versions,
        "documents": len(documents),
        "warm_up_seconds": warm,
        "index_seconds": index_seconds,
        "docs_per_s": len(documents) / index_seconds,
        "latency_s": latency,
        "runs": runs,
    }
    with open(target, "w", encoding="utf-8") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
