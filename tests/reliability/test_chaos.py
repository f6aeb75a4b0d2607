"""The chaos run of `make test-reliability`: for a few minutes, concurrent uploads, replacements,
updates, deletes and queries through the real services while store calls fail at random (the fault
harness, every failure class), against

  * a real milvus-lite server that is also killed (SIGKILL) and restarted between rounds, while the
    workers keep calling;
  * a real Milvus 2.3.5 server (skipped, saying why, when the `milvus` package is missing).

After every round (and so after every restart) the faults clear, the services settle and the
invariants are checked in the store and in the query service's view. The figures are printed
(operations by outcome, faults injected, restarts, checks, violations) and asserted: 0 violations.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ragrpc.config import Settings
from ragrpc.store.factory import open_milvus_stores, read_own_registry_writes
from tests.support.chaos import ChaosRun
from tests.support.milvus235 import Milvus235, running_or_skipped
from tests.support.milvus_server import MilvusLiteServer, start_milvus_lite

pytestmark = [pytest.mark.reliability, pytest.mark.slow]
MINUTES = float(os.environ.get("RAGRPC_CHAOS_MINUTES", "3"))


def stores(settings: Settings, *, writer: bool) -> tuple[object, object]:
    opened = open_milvus_stores(settings, model_id="hashing-64", dimension=64, writer=writer, wait_s=120.0)
    if writer:  # as the ingest service's main does after its recovery: Session reads of its own registry
        read_own_registry_writes(opened)
    return opened.chunks, opened.registry


@pytest.fixture
def milvus_lite(tmp_path: Path) -> Iterator[MilvusLiteServer]:
    server = start_milvus_lite(tmp_path)
    try:
        yield server
    finally:
        server.stop(kill=True)


@pytest.mark.timeout(int(MINUTES * 60 * 3 + 600))
async def test_chaos_on_milvus_lite_with_faults_and_server_kills(milvus_lite: MilvusLiteServer) -> None:
    settings = dataclasses.replace(Settings(), milvus_uri=milvus_lite.uri, collection_prefix="chaos")
    writer = await asyncio.to_thread(stores, settings, writer=True)
    reader = await asyncio.to_thread(stores, settings, writer=False)
    chaos = await ChaosRun(*writer, seed=4301, fault_rate=0.03, query_stores=reader, settings=settings).start()

    async def kill_and_restart(number: int) -> None:
        milvus_lite.stop(kill=True)
        await chaos.round(3.0)  # the workers go on while the server is down (UNAVAILABLE, retried)
        await asyncio.to_thread(milvus_lite.start)

    try:
        figures = await chaos.run(MINUTES * 60, rounds=6, between=kill_and_restart)
    finally:
        await chaos.stop()
    print(
        f"\nchaos on milvus-lite, {MINUTES:g} min, 3 % of store calls failing, server killed 6 times\n{figures.table()}"
    )
    assert figures.restarts == 6 and figures.faults > 50 and figures.outcomes[("upload", "OK")] > 50
    assert figures.violations == [], "\n".join(figures.violations[:30])


@pytest.fixture(scope="module")
def milvus235(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Milvus235]:
    with running_or_skipped(tmp_path_factory.mktemp("milvus235"), "test_chaos") as server:
        yield server


@pytest.mark.timeout(int(MINUTES * 60 * 3 + 900))
async def test_chaos_on_a_milvus_235_server_with_faults(milvus235: Milvus235) -> None:
    settings = dataclasses.replace(Settings(), milvus_uri=milvus235.uri, collection_prefix="chaos")
    writer = await asyncio.to_thread(stores, settings, writer=True)
    reader = await asyncio.to_thread(stores, settings, writer=False)
    chaos = await ChaosRun(*writer, seed=4302, fault_rate=0.03, query_stores=reader, settings=settings).start()
    try:
        figures = await chaos.run(MINUTES * 60 * 2 / 3, rounds=4)
    finally:
        await chaos.stop()
    print(f"\nchaos on Milvus 2.3.5, {MINUTES * 2 / 3:g} min, 3 % of store calls failing\n{figures.table()}")
    assert figures.violations == [], "\n".join(figures.violations[:30])
    assert figures.faults > 10 and figures.outcomes[("upload", "OK")] > 20
