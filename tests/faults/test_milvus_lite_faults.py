"""The fault matrix of the scenarios that page or recover, on a real milvus-lite server instead of the
fakes: recovery at start (its paged scan of the registry and its deletes) and the query service's
start-up load and poll (paged scans of the registry, the journal and the chunks), with a page size of
2 rows so that every scan takes several pages and can fail after the first. Every store call fails
once with every failure class; once the fault clears and the user restarts (recovery) or the
follower polls again, the invariants hold in the store and in the view."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from ragrpc.config import Settings
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.store.factory import open_milvus_stores
from ragrpc.testing.faults import ALL_KINDS
from tests.faults import test_ingest_faults as ingest_cases
from tests.faults import test_query_faults as query_cases
from tests.faults.rig import IngestRig, Scenario, run_matrix
from tests.support.milvus_server import MilvusLiteServer, start_milvus_lite

pytestmark = pytest.mark.slow
PAGE = 2
_REGISTRY = f.FilterBuilder(s.REGISTRY_FILTERABLE_FIELDS)


@pytest.fixture(scope="module")
def lite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MilvusLiteServer]:
    server = start_milvus_lite(tmp_path_factory.mktemp("milvus"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def lite_rig(lite: MilvusLiteServer) -> AsyncIterator[IngestRig]:
    settings = dataclasses.replace(
        Settings(), milvus_uri=lite.uri, collection_prefix="faults", store_page_size=PAGE, store_group_linger_ms=0.0
    )
    opened = open_milvus_stores(settings, model_id="hashing-32", dimension=32, writer=True)
    chunks, registry = opened.chunks, opened.registry

    def emptied(keep: bool) -> tuple[Any, Any]:
        """The same collections, emptied (creating them anew per run would cost a second each)."""
        chunks.delete_chunks(f.eq(s.TENANT, "default"))
        keys = [key for page in registry.scan_keys(_REGISTRY.gte(s.STATE, 0)) for key in page]
        for key in keys:
            tenant, _, document_id = key.rpartition("/")
            registry.delete(tenant, document_id)
        registry.purge_deletions(2**40)
        return chunks, registry

    rig = await IngestRig.start(make_stores=emptied)
    try:
        yield rig
    finally:
        await rig.stop()
        opened.connection.reset()


async def test_recovery_at_start_on_milvus_lite(lite_rig: IngestRig) -> None:
    scenario = Scenario(
        "recovery at start (milvus-lite)",
        ingest_cases.interrupted_collection,
        ingest_cases.recovery,
        ingest_cases.restart,
        ingest_cases.expect_recovered,
    )
    result = await run_matrix(lite_rig, scenario, ALL_KINDS)
    print(f"\n{scenario.name}: {result.calls} calls, {result.runs} runs, {result.faults} faults")
    assert result.calls >= 8 and not result.violations, "\n".join(result.violations[:25])


async def test_the_followers_poll_and_journal_replay_on_milvus_lite(lite_rig: IngestRig) -> None:
    violations = await query_cases.run_poll_matrix(lite_rig, query_cases.changed)
    violations += await query_cases.run_poll_matrix(lite_rig, query_cases.deleted_many)
    assert not violations, "\n".join(violations[:25])
