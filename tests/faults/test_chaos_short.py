"""The short chaos run of `make test` (seeded, a few seconds, the in-memory stores): concurrent
uploads, replacements, updates, deletes and queries through the real services while 5 % of all store
calls fail at random with every failure class; after each round the faults clear and the
invariants hold. The long run against milvus-lite (killed and restarted) and the Milvus 2.3.5
server is tests/reliability/test_chaos.py (make test-reliability)."""

from __future__ import annotations

import pytest

from ragrpc.testing import InMemoryChunkStore, InMemoryDocumentRegistry
from tests.support.chaos import ChaosRun


@pytest.mark.parametrize(
    "milvus_23", [False, True], ids=["a Milvus 2.5 store", "a Milvus 2.3 store (updates by copy, deletes read late)"]
)
async def test_a_short_seeded_chaos_run_keeps_every_invariant(milvus_23: bool) -> None:
    chunks = InMemoryChunkStore(page_size=3, upsert_keeps_partitions=not milvus_23)
    registry = InMemoryDocumentRegistry(page_size=3, deletes_seen_after_s=0.3 if milvus_23 else 0.0)
    chaos = await ChaosRun(chunks, registry, seed=43, fault_rate=0.05).start()
    try:
        figures = await chaos.run(6.0, rounds=3)
    finally:
        await chaos.stop()
    print("\n" + figures.table())
    assert figures.faults > 20 and sum(figures.operations.values()) > 100
    assert figures.outcomes[("upload", "OK")] > 0 and figures.outcomes[("query", "OK")] > 0
    assert figures.violations == [], "\n".join(figures.violations[:20])
