"""Several model streams in one embedder: the same vectors as one stream, in the callers' order,
with callers on many threads at once (each stream owns its model instance and tokenizer)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from ragrpc.embeddings import SentenceTransformerEmbedder

TEXTS = [f"Passage {i}: " + " ".join(["vitamin D and bone density in older adults"] * (1 + i % 7)) for i in range(40)]


@pytest.fixture
def torch_threads_restored() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()  # streams set the per-process intra-op pool to cores/streams
    yield
    torch.set_num_threads(before)


def test_streams_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SentenceTransformerEmbedder(streams=0)


@pytest.mark.slow
@pytest.mark.usefixtures("torch_threads_restored")
def test_two_streams_give_the_vectors_of_one_in_order() -> None:
    one = SentenceTransformerEmbedder(batch_size=4)
    reference = one.embed_documents(TEXTS)
    two = SentenceTransformerEmbedder(batch_size=4, streams=2)
    two.warm_up()
    try:
        assert two.streams == 2 and two.dimension == one.dimension
        vectors = two.embed_documents(TEXTS)
        assert vectors.dtype == np.float32 and vectors.shape == reference.shape
        np.testing.assert_allclose(vectors, reference, atol=1e-5)
        # Callers on several threads at once (the batcher and the semantic chunker do this).
        parts = [TEXTS[i : i + 7] for i in range(0, len(TEXTS), 7)]
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(two.embed_documents, parts * 3))
        for part, got in zip(parts * 3, results, strict=True):
            np.testing.assert_allclose(got, reference[TEXTS.index(part[0]) :][: len(part)], atol=1e-5)
        np.testing.assert_allclose(two.embed_query(TEXTS[3]), reference[3], atol=1e-5)
    finally:
        two.close()


def test_cores_follow_omp_num_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    from ragrpc.embeddings import available_cores

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert available_cores() == 3  # a container's CPU limit, not the node's CPUs
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert available_cores() >= 1


def test_onnx_streams_limit_torch_threads_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ONNX backends pool and normalise in torch: with 1-thread streams torch gets 1 thread too (its
    pool is per process; one pool of every core under each stream would oversubscribe the cores)."""
    import torch

    from ragrpc.embeddings import _limit_threads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        options: dict[str, object] = {}
        _limit_threads("onnx-int8", 1, options)
        assert torch.get_num_threads() == 1
        session_options = options["session_options"]
        assert session_options.intra_op_num_threads == 1  # type: ignore[attr-defined]
    finally:
        torch.set_num_threads(before)
