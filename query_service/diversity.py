"""Maximal marginal relevance (MMR): re-order candidates so near-duplicates do not crowd
the top of the ranking.

    next = argmax over unpicked i of  lambda * rel(i) - (1 - lambda) * max over picked j of cos(i, j)

rel is the candidates' `score` min-max normalised to [0, 1] (all equal -> 1.0); cos is the
dot product of the L2-normalised embedding rows. lambda = 1 keeps relevance order, 0 only
looks at novelty. Ties go to the candidate that came first in the input.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ragrpc.errors import InvalidInputError
from ragrpc.models import ScoredChunk

logger = logging.getLogger(__name__)


class Diversifier(Protocol):
    """Selects top_k of the candidates, trading relevance against redundancy."""

    def diversify(self, candidates: Sequence[ScoredChunk], embeddings: np.ndarray, top_k: int) -> list[ScoredChunk]: ...


class MmrDiversifier:
    """MMR selection; returns the picked candidates (unchanged objects) in MMR order."""

    def __init__(self, lambda_: float) -> None:
        valid = not isinstance(lambda_, bool) and isinstance(lambda_, int | float) and 0.0 <= lambda_ <= 1.0
        if not valid:  # NaN fails the range check
            raise InvalidInputError(f"mmr_lambda {lambda_!r} is not in [0, 1]", field="options.mmr_lambda")
        self.lambda_ = float(lambda_)

    def diversify(self, candidates: Sequence[ScoredChunk], embeddings: np.ndarray, top_k: int) -> list[ScoredChunk]:
        vectors = np.asarray(embeddings, dtype=np.float64)
        if vectors.ndim != 2 or vectors.shape[0] != len(candidates):
            raise ValueError(
                f"need one embedding row per candidate, got shape {vectors.shape} for {len(candidates)} candidates"
            )
        count = min(top_k, len(candidates))
        if count <= 0:
            return []
        relevance = _normalised_relevance([c.score for c in candidates])
        similarity = vectors @ vectors.T
        max_similarity = np.full(len(candidates), -np.inf)
        available = np.ones(len(candidates), dtype=bool)
        picked: list[int] = []
        for _ in range(count):
            redundancy = np.where(np.isfinite(max_similarity), max_similarity, 0.0)
            gain = self.lambda_ * relevance - (1.0 - self.lambda_) * redundancy
            gain[~available] = -np.inf
            best = int(np.argmax(gain))  # first index among equal gains
            picked.append(best)
            available[best] = False
            max_similarity = np.maximum(max_similarity, similarity[best])
        return [candidates[i] for i in picked]


def _normalised_relevance(scores: list[float]) -> np.ndarray:
    values = np.asarray(scores, dtype=np.float64)
    low, high = float(values.min()), float(values.max())
    if not high > low:
        return np.ones_like(values)
    return (values - low) / (high - low)
