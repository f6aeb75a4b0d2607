"""Exact searches of the same held vectors that run at the same time share one pass over them.

An exact search reads every vector the query service holds for the tenant: at 100k chunks of 384
dimensions that is 154 MB a query, bound by memory, about 15 ms of one core on this project's
machine, and under many callers each search read the whole matrix on its own. The product of the
matrix with several queries at once reads it once: 100k rows with 1 query 15 ms, with 4 queries 24
ms, with 16 queries 31 ms (docs/benchmarks.md, "Figures behind the code's choices").

So one pass runs at a time, and the searches that arrive while it runs wait for the next one, which
answers all of them (the relay of ragrpc.store.relay: the caller that finds no pass running makes
the passes, oldest search first, until its own is answered, then hands the role on). A search that
finds no pass running is answered at once by a pass of its own, the matrix-vector product it always
was. Each caller ranks its own column of the pass (in its own thread).

A search answered together with others gets the cosines of another BLAS kernel (matrix-matrix), which
may differ from a lone search's (matrix-vector) in the last bit of a float32.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ragrpc.store.relay import Queued, Relay

# (queries: m x dimension) -> (live slots, their cosines: rows x m), over one consistent state of the vectors
PassOver = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(eq=False, kw_only=True)
class _Search(Queued):
    owner: object  # the vectors searched (a tenant's scope): searches share a pass only over the same ones
    pass_over: PassOver
    query: np.ndarray
    slots: np.ndarray | None = None
    scores: np.ndarray | None = None  # rows x queries of the pass that answered it
    column: int = 0


class SharedPasses:
    """The waiting exact searches and the relay that serves them, one pass at a time."""

    def __init__(self, max_queries: int = 64) -> None:
        if max_queries < 1:
            raise ValueError("a pass must answer at least one query")
        self._max_queries = max_queries
        self._relay = Relay()
        self._waiting: deque[_Search] = deque()
        self.passes = 0  # passes made
        self.searches = 0  # searches they answered

    def scores(self, owner: object, query: np.ndarray, pass_over: PassOver) -> tuple[np.ndarray, np.ndarray]:
        """(live slots, their cosines with `query`) of `owner`'s vectors, from `pass_over`, possibly in
        one pass with other callers' queries over the same vectors. The caller holds the vectors
        unchanged until this returns (a read lock), as every caller waiting with it does."""
        search = _Search(owner=owner, pass_over=pass_over, query=query)
        with self._relay.lock:
            self._relay.arrived(search)
            self._waiting.append(search)
        self._relay.serve(search, self._serve_next, self._oldest)
        if search.error is not None:
            raise search.error
        assert search.slots is not None and search.scores is not None
        return search.slots, search.scores[:, search.column]

    def waiting(self) -> int:
        """Searches queued and not yet taken by a pass."""
        with self._relay.lock:
            return len(self._waiting)

    def _oldest(self) -> _Search | None:
        return self._waiting[0] if self._waiting else None

    def _serve_next(self) -> None:
        with self._relay.lock:
            if not self._waiting:
                raise RuntimeError("shared passes: a search is neither waiting nor answered")
            owner = self._waiting[0].owner
            batch = [search for search in self._waiting if search.owner is owner][: self._max_queries]
            taken = set(map(id, batch))
            self._waiting = deque(search for search in self._waiting if id(search) not in taken)
        Relay.carry(batch, lambda: self._pass(batch))

    def _pass(self, batch: list[_Search]) -> None:
        queries = np.stack([search.query for search in batch])
        slots, scores = batch[0].pass_over(queries)
        self.passes += 1
        self.searches += len(batch)
        for column, search in enumerate(batch):
            search.slots, search.scores, search.column = slots, scores, column
            search.done = True
