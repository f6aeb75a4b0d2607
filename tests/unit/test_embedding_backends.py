"""The ONNX backends of SentenceTransformerEmbedder: exported offline into a cache
directory by a child process, same model id, vectors close to torch fp32."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragrpc import onnx_export
from ragrpc.embeddings import SentenceTransformerEmbedder
from ragrpc.onnx_export import cpu_quantization_config, prepare_onnx_model_isolated

SENTENCES = [
    "The cat sat on the mat.",
    "Cryo-electron microscopy resolves protein structures at near-atomic resolution.",
    "Milvus stores dense vectors and searches them with an HNSW index.",
    "Vitamin D supplementation did not reduce the risk of fractures in older adults.",
    "gRPC streams let the server send ranked chunks before the answer is complete.",
]


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="onnx-int8"):
        SentenceTransformerEmbedder(backend="tensorflow")


def test_negative_threads_are_refused() -> None:
    with pytest.raises(ValueError, match="threads"):
        SentenceTransformerEmbedder(backend="onnx-int8", threads=-1)


@pytest.mark.slow
def test_query_embedding_threads_set_the_onnx_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """RAGRPC_QUERY_EMBEDDING_THREADS reaches ONNX Runtime: one intra-op thread, the same vectors."""
    from ragrpc.config import Settings
    from ragrpc.embeddings import embedder_from_settings

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    one = embedder_from_settings(Settings(), threads=1)
    default = embedder_from_settings(Settings())
    assert isinstance(one, SentenceTransformerEmbedder) and isinstance(default, SentenceTransformerEmbedder)
    one.warm_up()
    default.warm_up()
    session = one._model[0].auto_model.model  # optimum's ORTModel holds the InferenceSession
    assert session.get_session_options().intra_op_num_threads == 1
    assert default._model[0].auto_model.model.get_session_options().intra_op_num_threads != 1
    assert np.allclose(one.embed_query(SENTENCES[1]), default.embed_query(SENTENCES[1]), atol=1e-5)


def test_quantization_config_follows_cpu_flags() -> None:
    import platform

    if platform.machine().lower() in ("aarch64", "arm64"):
        pytest.skip("ARM picks arm64 regardless of flags")
    assert cpu_quantization_config("flags\t: fpu sse avx2 avx512f avx512_vnni\n") == "avx512_vnni"
    assert cpu_quantization_config("flags\t: fpu sse avx2\n") == "avx2"


@pytest.mark.slow
def test_onnx_int8_exports_offline_and_matches_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    children = _record_children(monkeypatch)
    torch_fp32 = SentenceTransformerEmbedder(backend="torch")
    int8 = SentenceTransformerEmbedder(backend="onnx-int8", onnx_cache_dir=tmp_path)
    reference = torch_fp32.embed_documents(SENTENCES)
    quantised = int8.embed_documents(SENTENCES)
    assert int8.model_id == torch_fp32.model_id
    assert quantised.shape == reference.shape
    assert np.allclose(np.linalg.norm(quantised, axis=1), 1.0, atol=1e-3)
    cosine = np.sum(reference * quantised, axis=1)
    assert float(cosine.mean()) > 0.98, cosine
    written = list(tmp_path.rglob("model_*int8_*.onnx"))
    assert written, "the int8 file was not written into the cache directory"
    # The export ran in one child process (the service never holds the export's memory).
    assert [command[1:3] for command in children] == [["-m", "ragrpc.onnx_export"]]
    # A second embedder reuses the cached files (no re-export) and gives the same vectors.
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.onnx")}
    again = SentenceTransformerEmbedder(backend="onnx-int8", onnx_cache_dir=tmp_path)
    assert np.allclose(again.embed_documents(SENTENCES), quantised, atol=1e-5)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.onnx")} == stamps
    assert len(children) == 1, "files already in the cache must not start another export"


@pytest.mark.slow
def test_a_failed_export_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(RuntimeError, match="ONNX export of .*no-such-model failed"):
        prepare_onnx_model_isolated(missing, tmp_path / "cache", quantization="avx2")
    assert not list((tmp_path / "cache").rglob("*.onnx"))


def test_unknown_quantization_config_is_refused_before_any_export(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="avx512_vnni"):
        prepare_onnx_model_isolated("any", tmp_path, quantization="sse2")


def _record_children(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The commands onnx_export starts (each still runs for real)."""
    commands: list[list[str]] = []
    run = subprocess.run

    def recording_run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        commands.append(list(command))
        return run(command, **kwargs)

    monkeypatch.setattr(onnx_export.subprocess, "run", recording_run)
    return commands
