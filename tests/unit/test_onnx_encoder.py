"""The ONNX encode path (ragrpc.onnx_encoder) gives sentence-transformers' own vectors of each forward
batch it forms (texts of similar token length together), on the bundled model's ONNX backends, for
texts that exercise its batching, padding and truncation."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from ragrpc.config import Settings
from ragrpc.embeddings import SentenceTransformerEmbedder, embedder_from_settings
from ragrpc.onnx_encoder import OnnxEncoder, forward_batches

pytestmark = pytest.mark.slow

LONG = " ".join(f"Sentence {i} about the fiscal quarter's operating income and the segment results." for i in range(80))
TEXTS = (
    [
        "The cat sat on the mat.",
        "",
        "Cryo-electron microscopy resolves protein structures at near-atomic resolution.",
        LONG,  # far beyond the model's 256 tokens: truncated
        "Vitamin D",
        "Vitamin E",  # as long as the one before: the order of ties is encode's
        "Ünïcödé — 数据 and emoji 🙂 in one line",
        "gRPC streams let the server send ranked chunks before the answer is complete.",
        LONG[: len(LONG) // 3],
        "Milvus stores dense vectors and searches them with an HNSW index.",
        "a",
    ]
    + [f"Question {i}: what changed in revenue between the two periods?" for i in range(8)]
)  # 19: not a multiple of 8


def _embedder(backend: str, monkeypatch: pytest.MonkeyPatch, **kwargs: object) -> SentenceTransformerEmbedder:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    embedder = embedder_from_settings(dataclasses.replace(Settings(), embedding_backend=backend), **kwargs)  # type: ignore[arg-type]
    assert isinstance(embedder, SentenceTransformerEmbedder)
    embedder.warm_up()
    return embedder


def _st_encode(model: object, texts: list[str], batch_size: int) -> np.ndarray:
    return np.asarray(
        model.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True),  # type: ignore[attr-defined]
        dtype=np.float32,
    )


def _st_batchwise(model: object, encoder: OnnxEncoder, texts: list[str], batch_size: int) -> np.ndarray:
    """sentence-transformers' vectors of every forward batch the encoder forms (each batch one `encode`
    call of one forward pass: the same texts padded to the same length)."""
    lengths = [len(e.ids) for e in encoder.tokenize(texts)]
    expected = np.empty((len(texts), 384), dtype=np.float32)
    for batch in forward_batches(lengths, batch_size):
        expected[batch] = _st_encode(model, [texts[i] for i in batch], len(batch))
    return expected


@pytest.mark.parametrize("backend", ["onnx-int8", "onnx"])
@pytest.mark.parametrize("batch_size", [1, 8, 32])
def test_vectors_are_sentence_transformers_own(backend: str, batch_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    embedder = _embedder(backend, monkeypatch)
    model = embedder._model
    encoder = OnnxEncoder.of(model)
    assert encoder is not None
    got = encoder.encode(TEXTS, batch_size)
    expected = _st_batchwise(model, encoder, TEXTS, batch_size)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    if backend == "onnx":  # fp32: a text's vector does not depend on its batch (padding is masked)
        np.testing.assert_allclose(got, _st_encode(model, TEXTS, batch_size), atol=2e-5)


def test_forward_batches_pad_less_than_ordering_by_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Texts whose characters and tokens disagree (a long word is one token, digits and symbols a token
    each): by tokens, each batch holds similar token lengths and pads less."""
    encoder = OnnxEncoder.of(_embedder("onnx-int8", monkeypatch)._model)
    assert encoder is not None
    texts = ["international " * (2 + i) for i in range(8)] + ["1 % " * (5 + i) for i in range(8)]
    lengths = [len(e.ids) for e in encoder.tokenize(texts)]
    by_characters = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    by_characters_batches = [by_characters[i : i + 4] for i in range(0, 16, 4)]

    def padded(batches: list[list[int]]) -> int:
        return sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)

    by_tokens = forward_batches(lengths, 4)
    assert sorted(i for batch in by_tokens for i in batch) == list(range(16))
    flat = [lengths[i] for batch in by_tokens for i in batch]
    assert flat == sorted(lengths, reverse=True)  # longest first
    assert padded(by_tokens) < padded(by_characters_batches)


def test_the_embedder_takes_the_onnx_path_and_keeps_its_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    embedder = _embedder("onnx-int8", monkeypatch, threads=1)
    encoder = embedder._direct[id(embedder._model)]
    assert encoder is not None
    expected = _st_batchwise(embedder._model, encoder, TEXTS, embedder._batch_size)
    np.testing.assert_allclose(embedder.embed_documents(TEXTS), expected, atol=2e-5)
    np.testing.assert_allclose(embedder.embed_query(TEXTS[2]), _st_encode(embedder._model, [TEXTS[2]], 1)[0], atol=2e-5)


def test_streams_each_use_their_own_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    embedder = _embedder("onnx-int8", monkeypatch, streams=2)
    assert len(embedder._direct) == 2 and all(encoder is not None for encoder in embedder._direct.values())
    one_stream = _embedder("onnx-int8", monkeypatch)
    # the streams cut a call into the same forward batches as one stream (int8 activation scales
    # depend on the batch, so the vectors are the same only if the batches are)
    np.testing.assert_allclose(embedder.embed_documents(TEXTS), one_stream.embed_documents(TEXTS), atol=2e-5)
    embedder.close()


def test_concurrent_queries_get_their_own_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    embedder = _embedder("onnx-int8", monkeypatch, threads=1)
    expected = {text: embedder.embed_query(text) for text in TEXTS}
    failures: list[str] = []

    def ask(offset: int) -> None:
        for round_ in range(5):
            text = TEXTS[(offset + round_) % len(TEXTS)]
            if not np.allclose(embedder.embed_query(text), expected[text], atol=1e-6):
                failures.append(text)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_models_it_does_not_reproduce_use_encode(monkeypatch: pytest.MonkeyPatch) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    onnx = _embedder("onnx-int8", monkeypatch)._model
    cls_pooled = SentenceTransformer(modules=[onnx[0], Pooling(384, pooling_mode="cls")])
    assert OnnxEncoder.of(cls_pooled) is None
    torch_model = _embedder("torch", monkeypatch)
    assert OnnxEncoder.of(torch_model._model) is None
    assert torch_model._direct == {}  # the torch backend embeds through encode


def test_the_encode_path_stays_selectable(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnx_encoder=False embeds through sentence-transformers' encode (the bench's comparison): same vectors."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    through_encode = SentenceTransformerEmbedder(backend="onnx-int8", threads=1, onnx_encoder=False)
    through_encode.warm_up()
    assert through_encode._direct == {}
    direct = _embedder("onnx-int8", monkeypatch, threads=1)
    np.testing.assert_allclose(through_encode.embed_query(TEXTS[2]), direct.embed_query(TEXTS[2]), atol=2e-5)
