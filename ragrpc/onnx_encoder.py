"""The ONNX backends' encode path without sentence-transformers' per-call machinery.

`SentenceTransformer.encode` on an ONNX model runs, per forward batch: the transformers tokenizer
call, torch tensors handed to optimum and back, then mean pooling and normalisation as torch
operators. Each torch operator and each hand-over releases and takes back the GIL; on two cores
shared with the query service's BM25 scoring (Python and small numpy operations, which hold the
GIL), every take-back waits up to the interpreter's switch interval, which makes a query embedding
beside a hybrid search several times slower (figures: docs/benchmarks.md, `make bench` embed section).

`OnnxEncoder` does the same computation with one GIL release per forward batch (the ONNX Runtime
call): the model's Rust tokenizer (a private copy, truncation set once), the session, then mean
pooling over the attention mask and L2 normalisation in numpy. A call's texts are tokenized first and
ordered by token count, not by characters as `encode` orders them, so its forward batches pad less.
Each batch's vectors are `encode`'s own for that batch (the fp32 model's are the same whatever the
batch; with dynamically quantised int8 weights, whose activation scales depend on the whole batch,
they move slightly when a text lands in another batch, so the default batch is one text).

`OnnxEncoder.of(model)` returns None for any model it does not reproduce (another pooling, a
lower-casing module, a slow tokenizer, other session inputs); the caller then uses `encode`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from ragrpc.tokens import private_rust_tokenizer

logger = logging.getLogger(__name__)

RunBatches = Callable[[list[list[Any]]], list[np.ndarray]]  # forward batches of encodings -> their vectors

_KNOWN_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids"})
_OUTPUT = "last_hidden_state"


class OnnxEncoder:
    """Mean-pooled, L2-normalised sentence embeddings from an ONNX feature-extraction session."""

    def __init__(self, session: Any, tokenizer: Any, input_names: list[str], pad_id: int) -> None:
        """`tokenizer`: a `tokenizers.Tokenizer` with truncation set and padding off (owned here: encoding
        with fixed settings only reads it, so threads may tokenize with it at once)."""
        self._session = session
        self._tokenizer = tokenizer
        self._inputs = input_names
        self._pad_id = pad_id

    @classmethod
    def of(cls, model: Any) -> OnnxEncoder | None:
        """The encoder for a loaded SentenceTransformer whose modules are an ONNX Transformer, mean
        Pooling and (optionally) Normalize; None when the model is anything else."""
        why = _unsupported(model)
        if why:
            logger.info("embedding through sentence-transformers' encode: %s", why)
            return None
        transformer = model[0]
        session = transformer.model.model
        hf_tokenizer = model.tokenizer
        tokenizer = private_rust_tokenizer(hf_tokenizer)
        tokenizer.enable_truncation(max_length=int(model.max_seq_length), strategy="longest_first")
        tokenizer.no_padding()
        return cls(session, tokenizer, [i.name for i in session.get_inputs()], int(hf_tokenizer.pad_token_id))

    def tokenize(self, texts: list[str]) -> list[Any]:
        """The model's input of each text (`tokenizers.Encoding`: special tokens added, truncated to the
        model's window, not padded)."""
        return self._tokenizer.encode_batch(texts)

    def encode(self, texts: list[str], batch_size: int, run: RunBatches | None = None) -> np.ndarray:
        """Vectors of `texts` (float32, unit length), in their order; forward batches of `batch_size`
        texts of similar token length (`forward_batches`), each through `forward`, or all of them through
        `run` (which returns their vectors in order: e.g. spread over several encoders' streams)."""
        encodings = self.tokenize(texts)
        batches = forward_batches([len(e.ids) for e in encodings], batch_size)
        groups = [[encodings[i] for i in batch] for batch in batches]
        parts = run(groups) if run is not None else [self.forward(group) for group in groups]
        vectors = np.empty((len(texts), parts[0].shape[1]), dtype=np.float32)
        for batch, part in zip(batches, parts, strict=True):
            vectors[batch] = part
        return vectors

    def forward(self, encodings: list[Any]) -> np.ndarray:
        """One forward batch: the encodings padded to the longest of them, through the session, then mean
        pooling over the attention mask and L2 normalisation."""
        lengths = [len(e.ids) for e in encodings]
        ids = np.full((len(encodings), max(lengths)), self._pad_id, dtype=np.int64)
        mask = np.zeros(ids.shape, dtype=np.int64)
        types = np.zeros(ids.shape, dtype=np.int64) if "token_type_ids" in self._inputs else None
        for row, (encoding, length) in enumerate(zip(encodings, lengths, strict=True)):
            ids[row, :length] = encoding.ids
            mask[row, :length] = 1
            if types is not None:
                types[row, :length] = encoding.type_ids
        feed = {"input_ids": ids, "attention_mask": mask}
        if types is not None:
            feed["token_type_ids"] = types
        (hidden,) = self._session.run([_OUTPUT], feed)
        weights = mask.astype(np.float32)[:, :, None]
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return (pooled / norms).astype(np.float32, copy=False)


def forward_batches(token_lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indexes of the texts, longest first by token count (ties in their order), cut into forward batches
    of `batch_size`: every batch is padded to its longest text, so texts of similar token length go
    together. (sentence-transformers' `encode` orders by characters: on SciFact's chunks, whose
    headers and truncation at the window make characters a poor guide, a call of 128 chunks then ran
    1.18 tokens for every real one, against 1.03 ordered by tokens.)"""
    order = sorted(range(len(token_lengths)), key=lambda i: -token_lengths[i])
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def _unsupported(model: Any) -> str:
    """Why `model` is not one this encoder reproduces ("" when it is)."""
    modules = list(model)
    names = [type(module).__name__ for module in modules]
    if names not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return f"modules {names}"
    transformer, pooling = modules[0], modules[1]
    if getattr(transformer, "backend", None) != "onnx":
        return f"backend {getattr(transformer, 'backend', None)!r}"
    if getattr(transformer, "do_lower_case", False):
        return "the Transformer module lower-cases its input"
    config = pooling.get_config_dict() if hasattr(pooling, "get_config_dict") else {}
    if config.get("pooling_mode") != "mean":
        return f"pooling {config.get('pooling_mode')!r}"
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None or not getattr(tokenizer, "is_fast", False) or tokenizer.pad_token_id is None:
        return "no fast tokenizer with a padding token"
    session = getattr(getattr(transformer, "model", None), "model", None)
    if session is None or not hasattr(session, "get_inputs"):
        return "no ONNX Runtime session"
    inputs = {i.name for i in session.get_inputs()}
    if not {"input_ids", "attention_mask"} <= inputs <= _KNOWN_INPUTS:
        return f"session inputs {sorted(inputs)}"
    if _OUTPUT not in {o.name for o in session.get_outputs()}:
        return f"no {_OUTPUT} output"
    return ""
