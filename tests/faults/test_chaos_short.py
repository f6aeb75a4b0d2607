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
    "upsert_keeps_partitions", [True, False], ids=["updates by upsert", "updates by copy (Milvus 2.3)"]
)
async def test_a_short_seeded_chaos_run_keeps_every_invariant(upsert_keeps_partitions: bool) -> None:
    chunks = InMemoryChunkStore(page_size=3, upsert_keeps_partitions=upsert_keeps_partitions)
    chaos = await ChaosRun(chunks, InMemoryDocumentRegistry(page_size=3), seed=43, fault_rate=0.05).start()
    try:
        figures = await chaos.run(6.0, rounds=3)
    finally:
        await chaos.stop()
    print("\n" + figures.table())
    assert figures.faults > 20 and sum(figures.operations.values()) > 100
    assert figures.outcomes[("upload", "OK")] > 0 and figures.outcomes[("query", "OK")] > 0
    assert figures.violations == [], "\n".join(figures.violations[:20])
