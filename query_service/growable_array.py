"""A numpy array that grows by doubling: the BM25 index's per-slot lengths and liveness."""

from __future__ import annotations

from typing import Any

import numpy as np


class GrowableArray:
    """A numpy array with amortised O(1) append."""

    def __init__(self, dtype: type, capacity: int = 1024) -> None:
        self.data: np.ndarray = np.zeros(capacity, dtype=dtype)
        self.size = 0

    @classmethod
    def of(cls, values: np.ndarray, min_capacity: int = 1024) -> GrowableArray:
        grown = cls(values.dtype.type, max(min_capacity, len(values)))
        grown.data[: len(values)] = values
        grown.size = len(values)
        return grown

    def append(self, value: Any) -> None:
        if self.size == len(self.data):
            self.data = np.concatenate([self.data, np.zeros_like(self.data)])
        self.data[self.size] = value
        self.size += 1
