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
