"""Coarse partitions of a held vector matrix (an inverted-file index, "IVF"), so that a dense
search over a large tenant reads a few percent of its vectors instead of all of them.

Exact search over the vectors held in memory (query_service.dense_index) is bound by memory
bandwidth: at 1M chunks x 384 dimensions it reads 1.5 GB a query, 34-56 ms on this project's
2-core machine. The partitions cut that: k-means (spherical, on a sample) gives `lists`
centroids, every row of the compact matrix belongs to the list of its nearest centroid, and a
query scores only the rows of the `probes` lists whose centroids are nearest to it.

Sizes (`PartitionPolicy`): about 2 x sqrt(rows) lists (2,000 at 1M chunks, about 500 rows each)
and 64 probes by default. On the scale bench's 1M chunks of real text, with the bundled model,
the top-100's recall against exact search was 0.997 / 0.988 / 0.991 for the SciFact, CISI and
Cranfield queries, at 6-8 ms a query against 41 ms for exact search (docs/benchmarks.md). Where fewer rows than that are held,
exact search is cheap and no partitions are kept.

The partitions cover the compact rows only and are built with them, never changed in place: a
compaction (which makes a new compact matrix) carries the kept rows' lists over and assigns the
rows that join to their nearest centroid, and trains new centroids once the rows have grown so
far that the lists would hold more than twice their size. A snapshot carries them
(`export` / `restore`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

_ASSIGN_BATCH = 32768  # rows scored against the centroids at once (32k x 2,000 x 4 B = 256 MB at most)
_SAMPLE_PER_LIST = 40  # k-means trains on at most this many rows a list
_ITERATIONS = 10


@dataclass(frozen=True)
class PartitionPolicy:
    """When a tenant's compact rows get partitions, how many lists, and how many a query probes.
    `min_chunks` 0: never (every search is exact)."""

    min_chunks: int = 200_000
    probes: int = 64

    def __post_init__(self) -> None:
        if self.min_chunks < 0:
            raise ValueError(f"the partitions' minimum chunks must be 0 (never) or more, got {self.min_chunks}")
        if self.probes < 1:
            raise ValueError(f"the partitions probed per query must be at least 1, got {self.probes}")

    def wanted(self, rows: int) -> bool:
        return bool(self.min_chunks) and rows >= self.min_chunks

    @staticmethod
    def lists_for(rows: int) -> int:
        return max(1, min(rows, round(2 * math.sqrt(rows))))

    def outgrown(self, partitions: CoarsePartitions, rows: int) -> bool:
        """Whether `rows` rows call for new centroids (more than twice the lists these have)."""
        return self.lists_for(rows) > 2 * partitions.lists


EXACT = PartitionPolicy(min_chunks=0)


class CoarsePartitions:
    """The lists of one compact matrix: `centroids` (lists x dimension, unit rows), `order` (the
    matrix's row numbers grouped by list) and `offsets` (list i holds order[offsets[i]:offsets[i+1]])."""

    def __init__(self, centroids: np.ndarray, order: np.ndarray, offsets: np.ndarray) -> None:
        self.centroids, self.order, self.offsets = centroids, order, offsets

    @property
    def lists(self) -> int:
        return len(self.centroids)

    @property
    def rows(self) -> int:
        return len(self.order)

    @property
    def nbytes(self) -> int:
        return self.centroids.nbytes + self.order.nbytes + self.offsets.nbytes

    # --- building ------------------------------------------------------------------------
    @classmethod
    def train(cls, vectors: np.ndarray, lists: int, *, seed: int = 0) -> CoarsePartitions:
        """New centroids for `vectors` (k-means on a sample) and every row's list."""
        started = time.monotonic()
        rng = np.random.default_rng(seed)
        rows = len(vectors)
        lists = max(1, min(lists, rows))
        sample_size = min(rows, lists * _SAMPLE_PER_LIST)
        sample = np.asarray(vectors[np.sort(rng.choice(rows, sample_size, replace=False))], dtype=np.float32)
        centroids = sample[rng.choice(sample_size, lists, replace=False)].copy()
        for _ in range(_ITERATIONS):
            nearest = _nearest(sample, centroids)
            sums = np.zeros_like(centroids)
            np.add.at(sums, nearest, sample)
            empty = np.bincount(nearest, minlength=lists) == 0
            sums[empty] = sample[rng.choice(sample_size, int(empty.sum()))]  # an empty list restarts at a row
            norms = np.linalg.norm(sums, axis=1, keepdims=True)
            centroids = sums / np.where(norms > 0, norms, 1)
        partitions = cls.of(centroids.astype(np.float32), _nearest(vectors, centroids))
        logger.info(
            "dense partitions: %d lists trained over %d vectors (%d sampled) in %.1fs",
            lists,
            rows,
            sample_size,
            time.monotonic() - started,
        )
        return partitions

    @classmethod
    def of(cls, centroids: np.ndarray, assignment: np.ndarray) -> CoarsePartitions:
        """Partitions from each row's list number."""
        order = np.argsort(assignment, kind="stable").astype(np.int32)
        offsets = np.searchsorted(assignment[order], np.arange(len(centroids) + 1)).astype(np.int64)
        return cls(centroids, order, offsets)

    def assignment(self) -> np.ndarray:
        """Each row's list number."""
        lists = np.empty(self.rows, dtype=np.int32)
        lists[self.order] = np.repeat(np.arange(self.lists, dtype=np.int32), np.diff(self.offsets))
        return lists

    def carried(self, kept_rows: np.ndarray, joining: np.ndarray) -> CoarsePartitions:
        """The partitions of a new compact matrix: the rows `kept_rows` of this one (in that order),
        then the vectors `joining`, each in its nearest list."""
        assignment = np.concatenate((self.assignment()[kept_rows], _nearest(joining, self.centroids)))
        return self.of(self.centroids, assignment)

    # --- searching -----------------------------------------------------------------------
    def probed(self, matrix: np.ndarray, query: np.ndarray, probes: int) -> tuple[np.ndarray, np.ndarray]:
        """(row numbers, their scores `matrix[row] @ query`) of the `probes` lists whose centroids are
        nearest `query`. Scored a list at a time: each list's rows, gathered, stay in the CPU's cache
        for their product (5.3 ms for 64 lists at 1M rows, against 9.1 gathered all at once)."""
        nearest = np.argpartition(-(self.centroids @ query), probes - 1)[:probes] if probes < self.lists else None
        lists = range(self.lists) if nearest is None else nearest.tolist()
        parts = [self.order[self.offsets[i] : self.offsets[i + 1]] for i in lists]
        if not parts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        scores = [matrix[rows] @ query for rows in parts]
        return np.concatenate(parts).astype(np.int64), np.concatenate(scores).astype(np.float32, copy=False)

    # --- snapshot ------------------------------------------------------------------------
    def export(self) -> dict[str, np.ndarray]:
        return {"centroids": self.centroids, "order": self.order, "offsets": self.offsets}

    @classmethod
    def restore(cls, arrays: Mapping[str, np.ndarray], rows: int, dimension: int) -> CoarsePartitions:
        """Partitions over exported arrays for a matrix of `rows` rows; ValueError when they do not fit it."""
        centroids, order, offsets = arrays["centroids"], arrays["order"], arrays["offsets"]
        if centroids.dtype != np.float32 or centroids.ndim != 2 or centroids.shape[1] != dimension:
            raise ValueError("partition centroids are not a float32 matrix of the index's dimension")
        if order.dtype != np.int32 or order.shape != (rows,):
            raise ValueError(f"partition order of shape {order.shape}, expected ({rows},) int32")
        if offsets.shape != (len(centroids) + 1,) or offsets[0] != 0 or offsets[-1] != rows:
            raise ValueError("partition offsets do not span the rows")
        if np.any(np.diff(offsets) < 0):
            raise ValueError("partition offsets go backwards")
        if rows and (order.min() < 0 or order.max() >= rows):
            raise ValueError("partition order names rows past the matrix")
        if rows and np.bincount(order, minlength=rows).max() != 1:
            raise ValueError("partition order is not a permutation of the rows")
        return cls(centroids, order, offsets.astype(np.int64, copy=False))


def _nearest(vectors: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Each vector's nearest centroid (largest dot product), in batches."""
    nearest = np.empty(len(vectors), dtype=np.int32)
    for start in range(0, len(vectors), _ASSIGN_BATCH):
        block = np.asarray(vectors[start : start + _ASSIGN_BATCH], dtype=np.float32)
        nearest[start : start + len(block)] = np.argmax(block @ centroids.T, axis=1)
    return nearest
