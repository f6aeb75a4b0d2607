"""HashingEmbedder: a deterministic bag-of-words embedder (feature hashing of word tokens).

Texts sharing words get similar vectors, so retrieval behaves sensibly in tests without
loading a model. Vectors are L2-normalised float32.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ragrpc.tokens import TokenCounter, WordTokenCounter


class HashingEmbedder:
    def __init__(
        self,
        dimension: int = 64,
        max_tokens: int = 254,
        model_id: str = "test/hashing-embedder",
        provider: str = "local",
    ) -> None:
        self._dimension = dimension
        self._max_tokens = max_tokens
        self._model_id = model_id
        self._provider = provider
        self._counter = WordTokenCounter()
        self.calls = 0

    @property
    def provider(self) -> str:
        return self._provider

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dimension(self) -> int:
        return self._dimension

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    @property
    def streams(self) -> int:
        return 1

    def token_counter(self) -> TokenCounter:
        return self._counter

    def warm_up(self) -> None:
        return None

    def _vector(self, text: str) -> np.ndarray:
        vector = np.zeros(self._dimension, dtype=np.float32)
        for start, end in self._counter.spans(text.lower()):
            token = text.lower()[start:end]
            digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
            index = int.from_bytes(digest[:4], "little") % self._dimension
            sign = 1.0 if digest[4] & 1 else -1.0
            vector[index] += sign
        norm = float(np.linalg.norm(vector))
        if norm == 0:
            vector[0] = 1.0
            return vector
        return vector / norm

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        if not texts:
            return np.zeros((0, self._dimension), dtype=np.float32)
        return np.stack([self._vector(t) for t in texts])

    def embed_query(self, text: str) -> np.ndarray:
        return self._vector(text)
