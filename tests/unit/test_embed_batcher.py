"""Cross-document embedding batches: results go back to the right caller, concurrent
callers share model calls, a model failure reaches every waiting caller."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from ingest_service.embed_batcher import EmbeddingBatcher
from ragrpc.testing import HashingEmbedder


async def test_concurrent_callers_share_batches_and_get_their_own_vectors() -> None:
    embedder = HashingEmbedder()
    batcher = EmbeddingBatcher(embedder.embed_documents, batch_size=64, max_wait_s=0.05)
    texts = [[f"document {d} chunk {c} about ducks" for c in range(3)] for d in range(10)]
    results = await asyncio.gather(*(batcher.embed(t) for t in texts))
    for group, vectors in zip(texts, results, strict=True):
        np.testing.assert_allclose(vectors, embedder.embed_documents(group), rtol=1e-6)
    assert batcher.batches < 10  # 30 texts from 10 callers in fewer model calls
    await batcher.close()


async def test_model_failure_reaches_every_caller() -> None:
    def broken(texts: list[str]) -> np.ndarray:
        raise RuntimeError("model crashed")

    batcher = EmbeddingBatcher(broken, batch_size=8, max_wait_s=0.01)
    outcomes = await asyncio.gather(batcher.embed(["a"]), batcher.embed(["b"]), return_exceptions=True)
    assert all(isinstance(o, RuntimeError) for o in outcomes)
    with pytest.raises(RuntimeError):
        await batcher.embed(["c"])  # the worker survives a failed batch
    await batcher.close()


async def test_concurrency_keeps_that_many_model_calls_in_flight() -> None:
    import threading

    embedder = HashingEmbedder()
    running, most = 0, 0
    guard = threading.Lock()

    def slow(texts: list[str]) -> np.ndarray:
        nonlocal running, most
        with guard:
            running += 1
            most = max(most, running)
        threading.Event().wait(0.05)
        with guard:
            running -= 1
        return embedder.embed_documents(texts)

    batcher = EmbeddingBatcher(slow, batch_size=4, max_wait_s=0.001, concurrency=2)
    texts = [[f"document {d} chunk {c}" for c in range(4)] for d in range(8)]
    results = await asyncio.gather(*(batcher.embed(t) for t in texts))
    for group, vectors in zip(texts, results, strict=True):
        np.testing.assert_allclose(vectors, embedder.embed_documents(group), rtol=1e-6)
    assert most == 2 and batcher.most_in_flight == 2  # never more than asked, and the slots were used
    await batcher.close()


def test_concurrency_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        EmbeddingBatcher(HashingEmbedder().embed_documents, concurrency=0)
