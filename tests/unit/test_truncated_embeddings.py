"""Matryoshka truncation of a local model's vectors: unit length, the direction of the full vector's
prefix, the wrapped model's identity at the truncated dimension, and a clear refusal above the
model's own dimension."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ragrpc.config import Settings
from ragrpc.embeddings import TruncatedEmbedder, embedder_from_settings, truncate_normalised
from ragrpc.testing import HashingEmbedder

TEXTS = [
    "Ducks swim on ponds and eat water plants all summer long",
    "Mallards live near lakes and rivers across the northern hemisphere",
    "The stock market fell sharply on Tuesday after the central bank raised interest rates",
]


def test_truncated_vectors_are_unit_prefixes_of_the_full_ones() -> None:
    full = HashingEmbedder(dimension=64)
    small = TruncatedEmbedder(full, 32)
    small.warm_up()
    vectors = small.embed_documents(TEXTS)
    assert vectors.shape == (3, 32) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    prefix = full.embed_documents(TEXTS)[:, :32]
    np.testing.assert_allclose(vectors, prefix / np.linalg.norm(prefix, axis=1, keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(small.embed_query(TEXTS[1]), vectors[1], rtol=1e-6)


def test_the_wrapper_keeps_the_models_identity_at_its_own_dimension() -> None:
    inner = HashingEmbedder(dimension=64, model_id="test/matryoshka")
    small = TruncatedEmbedder(inner, 32)
    assert (small.provider, small.model_id, small.dimension) == ("local", "test/matryoshka", 32)
    assert (small.max_tokens, small.streams) == (inner.max_tokens, inner.streams)
    assert small.token_counter().count("two words") == 2
    assert small.embed_documents([]).shape == (0, 32)


def test_more_dimensions_than_the_model_has_are_refused_at_warm_up() -> None:
    with pytest.raises(ValueError, match=r"RAGRPC_EMBEDDING_DIMENSIONS=128 exceeds the 64 dimensions"):
        TruncatedEmbedder(HashingEmbedder(dimension=64), 128).warm_up()
    with pytest.raises(ValueError, match="at least 1"):
        TruncatedEmbedder(HashingEmbedder(), 0)


def test_truncate_normalised_of_one_vector() -> None:
    vector = truncate_normalised(np.array([3.0, 4.0, 12.0]), 2)
    np.testing.assert_allclose(vector, [0.6, 0.8])


@pytest.mark.slow
def test_the_bundled_model_truncated_still_ranks_the_relevant_text_first() -> None:
    settings = dataclasses.replace(Settings(), embedding_backend="torch", embedding_dimensions=128)
    embedder = embedder_from_settings(settings)
    embedder.warm_up()
    vectors = embedder.embed_documents(TEXTS)
    assert vectors.shape == (3, 128)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    scores = vectors @ embedder.embed_query("where do mallards live?")
    assert int(np.argmax(scores)) == 1
