"""Second-stage reranking of the fused candidates: the `Reranker` protocol, the error a
reranker raises when it cannot rerank this request, and the local cross-encoder (the remote
HTTP provider is `query_service.remote_rerank`).

`CrossEncoderReranker` loads the sentence-transformers CrossEncoder in `warm_up()` (called
by the server at start-up; the first `rerank` loads it otherwise), never at import or in
the constructor. Scores are raw logits (identity activation), stored in
StageScores.rerank and as the hit's `score`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ragrpc import errors
from ragrpc.models import ScoredChunk

logger = logging.getLogger(__name__)


class RerankUnavailableError(errors.UnavailableError):
    """This request could not be reranked (upstream down, slow, wrong answer, no time left); the
    pipeline keeps the fused order and reports `summary` as the rerank_skipped_reason.

    cause: a short machine label (connection, timeout, deadline, http_status, malformed,
    bad_indexes), used as the metric label.
    """

    default_reason = "RERANKER_UNAVAILABLE"

    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(f"rerank failed ({cause}): {detail}", metadata={"cause": cause})
        self.cause = cause
        self.detail = detail

    @property
    def summary(self) -> str:
        return f"{self.message}; fused order kept"


class Reranker(Protocol):
    """Re-scores hits against the query and returns the best top_n, best first; raises
    RerankUnavailableError when it cannot for this request (the fused order is kept)."""

    def rerank(self, query: str, hits: Sequence[ScoredChunk], top_n: int) -> list[ScoredChunk]: ...


class CrossEncoderReranker:
    """Cross-encoder reranking (query, chunk text) -> logit.

    num_labels: passed to CrossEncoder (1 for a model without a trained ranking head); the
    model must produce one score per pair.
    """

    def __init__(
        self,
        model_name_or_path: str,
        device: str = "cpu",
        batch_size: int = 32,
        max_length: int = 256,
        *,
        num_labels: int | None = None,
    ) -> None:
        self.model_name_or_path = model_name_or_path
        self.device = device
        self.batch_size = batch_size
        self.max_length = max_length
        self.num_labels = num_labels
        self._model: Any = None
        self._load_lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def warm_up(self) -> None:
        """Load the model and run one pair through it (idempotent)."""
        model = self._load()
        self._predict(model, [("warm up", "warm up")])

    def rerank(self, query: str, hits: Sequence[ScoredChunk], top_n: int) -> list[ScoredChunk]:
        if top_n <= 0 or not hits:
            return []
        scores = self._predict(self._load(), [(query, hit.chunk.text) for hit in hits])
        order = sorted(range(len(hits)), key=lambda i: (-scores[i], hits[i].chunk.chunk_id))
        return [with_rerank_score(hits[i], float(scores[i])) for i in order[:top_n]]

    def _load(self) -> Any:
        with self._load_lock:
            if self._model is None:
                from sentence_transformers import CrossEncoder

                logger.info("loading cross-encoder %s on %s", self.model_name_or_path, self.device)
                kwargs: dict[str, Any] = {"device": self.device, "max_length": self.max_length}
                if self.num_labels is not None:
                    kwargs["num_labels"] = self.num_labels
                self._model = CrossEncoder(self.model_name_or_path, **kwargs)
            return self._model

    def _predict(self, model: Any, pairs: list[tuple[str, str]]) -> np.ndarray:
        import torch

        scores = model.predict(
            pairs,
            batch_size=self.batch_size,
            show_progress_bar=False,
            activation_fn=torch.nn.Identity(),
            convert_to_numpy=True,
        )
        scores = np.asarray(scores, dtype=np.float64)
        if scores.ndim == 2 and scores.shape[1] == 1:
            scores = scores[:, 0]
        if scores.shape != (len(pairs),):
            raise ValueError(f"cross-encoder must give one score per pair, got shape {scores.shape}")
        return scores


def with_rerank_score(hit: ScoredChunk, score: float) -> ScoredChunk:
    """The hit scored `score`, kept as StageScores.rerank too (the earlier stages' scores stay)."""
    return dataclasses.replace(hit, score=score, scores=dataclasses.replace(hit.scores, rerank=score))
