"""TruncatedEmbedder: Matryoshka truncation of a local model's vectors (RAGRPC_EMBEDDING_DIMENSIONS
with RAGRPC_EMBEDDING_PROVIDER=local): the first `dimension` components of each vector,
re-normalised to unit length.

Models trained with Matryoshka representation learning (nomic-embed-text-v1.5, mxbai-embed-large-v1,
OpenAI's text-embedding-3-*) keep most of their quality in a prefix of their vector; for other
models a prefix is a lossier projection. The collection records the truncated dimension (and the
provider and model), so a collection built at 256 dimensions refuses a service at 384. The openai
provider does not need this wrapper: it asks the endpoint for `dimensions`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ragrpc.tokens import TokenCounter

if TYPE_CHECKING:
    from ragrpc.embeddings import Embedder


def truncate_normalised(vectors: np.ndarray, dimension: int) -> np.ndarray:
    """The first `dimension` components of each row (or of one vector), scaled to unit L2 norm (an
    all-zero prefix, which a trained model does not produce, stays zero)."""
    head = np.asarray(vectors, dtype=np.float32)[..., :dimension]
    norms = np.linalg.norm(head, axis=-1, keepdims=True)
    return (head / np.maximum(norms, np.finfo(np.float32).tiny)).astype(np.float32, copy=False)


class TruncatedEmbedder:
    """An Embedder whose vectors are the wrapped one's, cut to `dimension` and re-normalised."""

    def __init__(self, inner: Embedder, dimension: int) -> None:
        if dimension < 1:
            raise ValueError(f"RAGRPC_EMBEDDING_DIMENSIONS must be at least 1 to truncate, got {dimension}")
        self._inner = inner
        self._dimension = dimension

    @property
    def inner(self) -> Embedder:
        return self._inner

    @property
    def provider(self) -> str:
        return self._inner.provider

    @property
    def model_id(self) -> str:
        return self._inner.model_id

    @property
    def dimension(self) -> int:
        return self._dimension

    @property
    def max_tokens(self) -> int:
        return self._inner.max_tokens

    @property
    def streams(self) -> int:
        return self._inner.streams

    def token_counter(self) -> TokenCounter:
        return self._inner.token_counter()

    def warm_up(self) -> None:
        self._inner.warm_up()
        self._check(self._inner.dimension)

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        vectors = self._inner.embed_documents(texts)
        self._check(vectors.shape[-1])
        return truncate_normalised(vectors, self._dimension)

    def embed_query(self, text: str) -> np.ndarray:
        vector = self._inner.embed_query(text)
        self._check(vector.shape[-1])
        return truncate_normalised(vector, self._dimension)

    def _check(self, native: int) -> None:
        if self._dimension > native:
            raise ValueError(
                f"RAGRPC_EMBEDDING_DIMENSIONS={self._dimension} exceeds the {native} dimensions of embedding "
                f"model {self._inner.model_id!r}; use at most {native}, or 0 for the model's own"
            )
