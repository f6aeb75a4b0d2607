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


async def test_a_refused_text_fails_only_the_documents_that_hold_it() -> None:
    """An endpoint that refuses one text (HTTP 400) in a call shared by three documents: the texts are
    embedded one by one, the two clean documents get the vectors they get alone, the third fails with
    the refusal, naming its chunk."""
    from ragrpc import errors

    embedder = HashingEmbedder()
    calls: list[int] = []

    def refusing(texts: list[str]) -> np.ndarray:
        calls.append(len(texts))
        if any("forbidden" in t for t in texts):
            raise errors.PreconditionError("HTTP 400: input refused", reason="EMBEDDING_REQUEST_REFUSED")
        return embedder.embed_documents(texts)

    batcher = EmbeddingBatcher(refusing, batch_size=64, max_wait_s=0.05)
    clean_a, poisoned, clean_b = ["a one", "a two"], ["b one", "b forbidden", "b three"], ["c one"]
    outcomes = await asyncio.gather(*(batcher.embed(t) for t in (clean_a, poisoned, clean_b)), return_exceptions=True)
    assert calls[0] == 6  # one shared call first
    np.testing.assert_allclose(outcomes[0], embedder.embed_documents(clean_a), rtol=1e-6)
    np.testing.assert_allclose(outcomes[2], embedder.embed_documents(clean_b), rtol=1e-6)
    refused = outcomes[1]
    assert isinstance(refused, errors.PreconditionError) and refused.reason == "EMBEDDING_REQUEST_REFUSED"
    assert refused.metadata["chunk_index"] == "1" and "chunk 1 of the document" in refused.message
    await batcher.close()


async def test_an_outage_fails_every_caller_without_retrying_texts_alone() -> None:
    from ragrpc import errors

    calls: list[int] = []

    def down(texts: list[str]) -> np.ndarray:
        calls.append(len(texts))
        raise errors.UnavailableError("endpoint unreachable")

    batcher = EmbeddingBatcher(down, batch_size=64, max_wait_s=0.05)
    outcomes = await asyncio.gather(batcher.embed(["a", "b"]), batcher.embed(["c"]), return_exceptions=True)
    assert all(isinstance(o, errors.UnavailableError) for o in outcomes) and calls == [3]
    await batcher.close()


async def test_an_endpoint_that_refuses_one_document_of_a_batch_fails_only_that_document() -> None:
    """The real OpenAI-compatible provider against a local embeddings server that refuses one text:
    a batch of three documents through the ingest pipeline ends with two ACTIVE and one FAILED."""
    import dataclasses

    from ingest_service.app import build_components
    from ingest_service.requests import DocumentSpecInput, IngestItem
    from ragrpc.config import Settings
    from ragrpc.models import DocumentState
    from ragrpc.openai_embeddings import OpenAiEmbedder
    from ragrpc.testing import InMemoryChunkStore, InMemoryDocumentRegistry
    from tests.support.embeddings_server import EmbeddingsServer

    with EmbeddingsServer(dimension=32) as server:
        server.refused_word = "forbidden"
        embedder = OpenAiEmbedder("hashing", base_url=server.url, max_retries=0, request_size=64)
        chunks, registry = InMemoryChunkStore(), InMemoryDocumentRegistry()
        settings = dataclasses.replace(Settings(), embedding_call_size=64, embedding_batch_size=64)
        app = build_components(settings, embedder, chunks, registry)
        texts = {"clean-1": "Herons wait.", "poisoned": "A forbidden word.", "clean-2": "Cranes fly."}
        items = [
            IngestItem("t", DocumentSpecInput(document_id=name, file_name=f"{name}.txt"), text.encode())
            for name, text in texts.items()
        ]
        outcomes = await asyncio.gather(*(app.pipeline.ingest(i) for i in items), return_exceptions=True)
        states = {name: registry.get("t", name).state for name in texts}
        assert states == {
            "clean-1": DocumentState.ACTIVE,
            "poisoned": DocumentState.FAILED,
            "clean-2": DocumentState.ACTIVE,
        }, outcomes
        assert "refused" in registry.get("t", "poisoned").error
        app.shutdown()
