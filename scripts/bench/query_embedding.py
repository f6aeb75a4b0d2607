"""One query embedding as the query service makes it (onnx-int8, one intra-op thread): through
sentence-transformers' `encode` and through ragrpc.onnx_encoder, alone and beside a thread that runs
Python (as BM25 scoring does during a hybrid `Retrieve`, holding the GIL between its small numpy
operations). The two paths alternate round by round over the same SciFact claims; medians."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from ragrpc.config import Settings
from ragrpc.embeddings import SentenceTransformerEmbedder
from scripts.bench.common import BenchConfig, SectionResult, load_scifact, ratio

PATHS = ("encode", "onnx_encoder")
ROUNDS = 3
QUERIES = 100


def _embedder(config: BenchConfig, onnx_encoder: bool) -> SentenceTransformerEmbedder:
    settings = Settings()
    embedder = SentenceTransformerEmbedder(
        settings.embedding_model,
        backend=settings.embedding_backend,
        onnx_cache_dir=config.onnx_cache,
        threads=settings.query_embedding_threads,
        onnx_encoder=onnx_encoder,
    )
    embedder.warm_up()
    return embedder


@contextmanager
def _python_thread() -> Iterator[None]:
    """A thread running pure Python for the duration."""
    stop = threading.Event()

    def spin() -> None:
        total = 0
        while not stop.is_set():
            for i in range(1000):
                total += i

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _median_ms(embed: Callable[[str], np.ndarray], queries: list[str]) -> float:
    seconds = []
    for query in queries:
        started = time.perf_counter()
        embed(query)
        seconds.append(time.perf_counter() - started)
    return 1000 * statistics.median(seconds)


def add_rows(result: SectionResult, config: BenchConfig) -> None:
    queries = list(load_scifact().queries.values())[:QUERIES]
    embedders = {path: _embedder(config, path == "onnx_encoder") for path in PATHS}
    same = max(
        float(np.abs(embedders["encode"].embed_query(q) - embedders["onnx_encoder"].embed_query(q)).max())
        for q in queries[:20]
    )
    times: dict[tuple[str, bool], list[float]] = {(path, busy): [] for path in PATHS for busy in (False, True)}
    for _ in range(ROUNDS):
        for busy in (False, True):
            for path in PATHS:
                if busy:
                    with _python_thread():
                        times[path, busy].append(_median_ms(embedders[path].embed_query, queries))
                else:
                    times[path, busy].append(_median_ms(embedders[path].embed_query, queries))
    medians = {key: statistics.median(values) for key, values in times.items()}
    result.data["query_embedding_ms"] = {
        f"{path}{' beside Python' if busy else ''}": value for (path, busy), value in medians.items()
    }
    for busy in (False, True):
        where = "beside a thread running Python" if busy else "alone"
        result.add(
            f"query embedding {where}: onnx_encoder / encode",
            medians["onnx_encoder", busy],
            "ms",
            ratio=ratio(medians["onnx_encoder", busy], medians["encode", busy]),
            versus=f"encode {medians['encode', busy]:.2f} ms",
            note=f"onnx-int8, 1 thread; median of {ROUNDS} rounds x {len(queries)} SciFact claims",
        )
    result.notes.append(f"query embedding: the two paths' vectors differ by at most {same:.1e} (20 claims)")
