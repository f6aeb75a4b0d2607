"""Coarse partitions of a held vector matrix (an inverted-file index, "IVF"), so that a dense search
over a large tenant reads a share of its vectors instead of all of them.

Exact search over the vectors held in memory (query_service.dense_index) is bound by memory
bandwidth: at 1M chunks x 384 dimensions it reads 1.5 GB a query, 34-56 ms on this project's
2-core machine. The partitions cut that: k-means (spherical, on a sample) gives `lists` centroids,
every vector belongs to the list of its nearest centroid, and a query scores only the lists whose
centroids are nearest to it. The compact matrix of a partitioned tenant is stored list by list
(each list's rows contiguous), so a probed list is one slice of the matrix: reading 10 % of the lists
reads 10 % of the memory. `row_slot` says which slot (query_service.slot_table) each row holds.

Sizes (`PartitionPolicy`): about 2 x sqrt(rows) lists (2,000 at 1M chunks) and 10 % of them probed:
at 1M chunks 6.5-7 ms a query against 32-38 ms for exact search, recall@10 0.996-1.000 against it
(SciFact, CISI and Cranfield queries). That collection's vectors are noisy copies of 2,048 texts,
more clustered than real text, so the share was also checked on real passages: 22,804 of SciFact,
CISI, Cranfield and the shared documents, embedded by the bundled model, with 180 lists. There 10 %
gave recall@10 of 0.934 / 0.996 / 0.993 (15 %: 0.955 / 0.997 / 0.994), and more lists at the same
share gave more (docs/benchmarks.md). A homogeneous collection (SciFact's abstracts) is the hard case.
Below `min_chunks` exact search is cheap and
no partitions are kept.

The partitions cover the compact rows only and are made with them, never changed in place: a
compaction (which makes a new compact matrix) keeps the centroids, assigns the rows that join to
their nearest centroid, and trains new centroids once the rows have grown so far that the lists
would hold more than twice their size.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

_ASSIGN_BATCH = 32768  # rows scored against the centroids at once (32k x 2,000 x 4 B = 256 MB at most)
_SAMPLE_PER_LIST = 40  # k-means trains on at most this many rows a list
_ITERATIONS = 10

RowReader = Callable[[np.ndarray], np.ndarray]  # row numbers -> their vectors (a float32 matrix)


@dataclass(frozen=True)
class PartitionPolicy:
    """When a tenant's compact rows get partitions, how many lists, and what share of them a query
    probes (percent). `min_chunks` 0: never (every search is exact)."""

    min_chunks: int = 200_000
    probe_percent: float = 10.0
    lists_per_sqrt: float = 2.0  # lists = this x sqrt(rows)

    def __post_init__(self) -> None:
        if self.min_chunks < 0:
            raise ValueError(f"the partitions' minimum chunks must be 0 (never) or more, got {self.min_chunks}")
        if not (math.isfinite(self.probe_percent) and 0 < self.probe_percent <= 100):
            raise ValueError(
                f"the share of partitions probed must be over 0 and at most 100 %, got {self.probe_percent}"
            )
        if not (math.isfinite(self.lists_per_sqrt) and self.lists_per_sqrt > 0):
            raise ValueError(f"the lists per square root of the rows must be over 0, got {self.lists_per_sqrt}")

    def wanted(self, rows: int) -> bool:
        return bool(self.min_chunks) and rows >= self.min_chunks

    def lists_for(self, rows: int) -> int:
        return max(1, min(rows, round(self.lists_per_sqrt * math.sqrt(rows))))

    def probes(self, lists: int) -> int:
        return max(1, min(lists, math.ceil(lists * self.probe_percent / 100)))

    def outgrown(self, partitions: CoarsePartitions, rows: int) -> bool:
        """Whether `rows` rows call for new centroids (more than twice the lists these have)."""
        return self.lists_for(rows) > 2 * partitions.lists


EXACT = PartitionPolicy(min_chunks=0)


class CoarsePartitions:
    """The lists of one compact matrix stored list by list: `centroids` (lists x dimension, unit
    rows), `offsets` (list i holds rows offsets[i]:offsets[i+1]) and `row_slot` (the slot each row
    holds; `slot_row` is its inverse)."""

    def __init__(self, centroids: np.ndarray, offsets: np.ndarray, row_slot: np.ndarray) -> None:
        self.centroids, self.offsets, self.row_slot = centroids, offsets, row_slot
        self.slot_row = np.empty_like(row_slot)
        self.slot_row[row_slot] = np.arange(len(row_slot), dtype=row_slot.dtype)

    @property
    def lists(self) -> int:
        return len(self.centroids)

    @property
    def rows(self) -> int:
        return len(self.row_slot)

    @property
    def nbytes(self) -> int:
        return self.centroids.nbytes + self.offsets.nbytes + self.row_slot.nbytes + self.slot_row.nbytes

    # --- building ------------------------------------------------------------------------
    @staticmethod
    def train(read: RowReader, rows: int, lists: int, *, seed: int = 0) -> np.ndarray:
        """New centroids for `rows` rows (`read` gives them by number): k-means on a sample."""
        started = time.monotonic()
        rng = np.random.default_rng(seed)
        lists = max(1, min(lists, rows))
        sample_size = min(rows, lists * _SAMPLE_PER_LIST)
        sample = np.asarray(read(np.sort(rng.choice(rows, sample_size, replace=False))), dtype=np.float32)
        centroids = sample[rng.choice(sample_size, lists, replace=False)].copy()
        for _ in range(_ITERATIONS):
            nearest = nearest_centroid(sample, centroids)
            sums = np.zeros_like(centroids)
            np.add.at(sums, nearest, sample)
            empty = np.bincount(nearest, minlength=lists) == 0
            sums[empty] = sample[rng.choice(sample_size, int(empty.sum()))]  # an empty list restarts at a row
            norms = np.linalg.norm(sums, axis=1, keepdims=True)
            centroids = (sums / np.where(norms > 0, norms, 1)).astype(np.float32)
        logger.info(
            "dense partitions: %d lists trained on %d of %d vectors in %.1fs",
            lists,
            sample_size,
            rows,
            time.monotonic() - started,
        )
        return centroids

    @classmethod
    def laid_out(cls, centroids: np.ndarray, assignment: np.ndarray) -> CoarsePartitions:
        """The layout of slots whose lists are `assignment` (slot -> list): row r holds slot row_slot[r]."""
        row_slot = np.argsort(assignment, kind="stable").astype(np.int32)
        offsets = np.searchsorted(assignment[row_slot], np.arange(len(centroids) + 1)).astype(np.int64)
        return cls(centroids, offsets, row_slot)

    def lists_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The list each of `rows` belongs to."""
        return (np.searchsorted(self.offsets, rows, side="right") - 1).astype(np.int32)

    # --- searching -----------------------------------------------------------------------
    def nearest_lists(self, query: np.ndarray, probes: int) -> list[int]:
        if probes >= self.lists:
            return list(range(self.lists))
        return np.argpartition(-(self.centroids @ query), probes - 1)[:probes].tolist()

    # --- snapshot ------------------------------------------------------------------------
    def export(self) -> dict[str, np.ndarray]:
        return {"centroids": self.centroids, "offsets": self.offsets, "row_slot": self.row_slot}

    @classmethod
    def restore(cls, arrays: Mapping[str, np.ndarray], rows: int, dimension: int) -> CoarsePartitions:
        """Partitions over exported arrays for a matrix of `rows` rows; ValueError when they do not fit it."""
        centroids, offsets, row_slot = arrays["centroids"], arrays["offsets"], arrays["row_slot"]
        if centroids.dtype != np.float32 or centroids.ndim != 2 or centroids.shape[1] != dimension:
            raise ValueError("partition centroids are not a float32 matrix of the index's dimension")
        if row_slot.dtype != np.int32 or row_slot.shape != (rows,):
            raise ValueError(f"partition rows of shape {row_slot.shape}, expected ({rows},) int32")
        if offsets.shape != (len(centroids) + 1,) or offsets[0] != 0 or offsets[-1] != rows:
            raise ValueError("partition offsets do not span the rows")
        if np.any(np.diff(offsets) < 0):
            raise ValueError("partition offsets go backwards")
        if rows and (row_slot.min() < 0 or row_slot.max() >= rows):
            raise ValueError("partition rows name slots past the table")
        if rows and np.bincount(row_slot, minlength=rows).max() != 1:
            raise ValueError("partition rows are not a permutation of the slots")
        return cls(centroids, offsets.astype(np.int64, copy=False), row_slot)


def nearest_centroid(vectors: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Each vector's nearest centroid (largest dot product), in batches."""
    nearest = np.empty(len(vectors), dtype=np.int32)
    for start in range(0, len(vectors), _ASSIGN_BATCH):
        block = np.asarray(vectors[start : start + _ASSIGN_BATCH], dtype=np.float32)
        nearest[start : start + len(block)] = np.argmax(block @ centroids.T, axis=1)
    return nearest


def assign(read: RowReader, rows: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """The nearest centroid of each of `rows` (read in batches)."""
    nearest = np.empty(len(rows), dtype=np.int32)
    for start in range(0, len(rows), _ASSIGN_BATCH):
        part = rows[start : start + _ASSIGN_BATCH]
        nearest[start : start + len(part)] = nearest_centroid(read(part), centroids)
    return nearest
