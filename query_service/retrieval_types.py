"""Domain form of retrieval requests and results (no protobuf)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ragrpc.consistency import ConsistencyToken
from ragrpc.models import ScoredChunk
from ragrpc.store.request_filter import MetadataCondition


@dataclass
class RetrievalQuery:
    """A validated retrieval request for one tenant."""

    text: str
    tenant: str
    top_k: int = 10
    mode: str = "hybrid"  # hybrid | dense | sparse
    fusion: str = "rrf"  # rrf | weighted
    candidates: int = 100
    rrf_k: int = 20
    dense_weight: float = 0.5
    sparse_weight: float = 0.5
    rerank: bool = True
    mmr_lambda: float | None = None
    min_score: float | None = None
    include_parent: bool = False
    collection: str = ""
    document_ids: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    media_types: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    time_after: int | None = None
    time_before: int | None = None
    # exact matches on metadata keys the collection declares (MetadataFilter.metadata and its deprecated fields)
    metadata: list[MetadataCondition] = field(default_factory=list)
    consistency: ConsistencyToken | None = None  # read your writes: answer once this write is reflected


@dataclass
class StageTimer:
    """Collects per-stage wall-clock milliseconds in order."""

    timings: list[tuple[str, float]] = field(default_factory=list)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings.append((name, (time.perf_counter() - start) * 1000.0))

    def add(self, name: str, millis: float) -> None:
        self.timings.append((name, millis))


@dataclass
class RetrievalResult:
    hits: list[ScoredChunk]
    score_kind: str  # cosine | bm25 | rrf | weighted | rerank
    timings: list[tuple[str, float]]
    dense_candidates: int = 0
    sparse_candidates: int = 0
    reranked: bool = False
    rerank_skipped_reason: str = ""
    sparse_backend: str = ""
