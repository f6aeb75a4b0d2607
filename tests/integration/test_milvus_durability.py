"""Acknowledged writes survive a milvus-lite server restart even when many threads of the
writer write at once (milvus-lite corrupts its WAL under concurrent writes; the adapter
serialises them)."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from ragrpc.config import Settings
from ragrpc.models import ChunkRecord, DocumentRecord, DocumentState
from ragrpc.store import schema as s
from ragrpc.store.factory import open_milvus_stores
from ragrpc.store.filters import FilterBuilder
from ragrpc.testing import all_keys
from tests.support.milvus_server import start_milvus_lite

pytestmark = pytest.mark.slow

DIM = 8


def _chunk(worker: int, index: int) -> ChunkRecord:
    vector = [0.0] * DIM
    vector[(worker + index) % DIM] = 1.0
    return ChunkRecord(
        chunk_id=f"w{worker}-{index}",
        document_id=f"doc-{worker}",
        tenant="t",
        collection="c",
        generation="g",
        text=f"worker {worker} chunk {index} " + "word " * (index % 50),
        vector=vector,
        chunk_index=index,
        chunker="fixed_tokens",
    )


@pytest.mark.parametrize("stop_with_kill", [False, True], ids=["sigterm", "sigkill"])
def test_concurrent_writes_survive_restart(tmp_path: Path, stop_with_kill: bool) -> None:
    server = start_milvus_lite(tmp_path)
    settings = dataclasses.replace(Settings(), milvus_uri=server.uri, collection_prefix="durability")
    stores = open_milvus_stores(settings, model_id="test/model", dimension=DIM, writer=True)
    acked: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def writer(worker: int) -> None:
        index = 0
        while not stop.is_set():
            batch = [_chunk(worker, index + k) for k in range(5)]
            try:
                stores.chunks.insert_chunks(batch)
                stores.registry.put(
                    DocumentRecord(
                        tenant="t", document_id=f"doc-{worker}-{index}", state=DocumentState.ACTIVE, generation="g"
                    )
                )
            except Exception:  # noqa: BLE001 - the server is being stopped under us
                return
            with lock:
                acked.extend(c.chunk_id for c in batch)
            index += 5

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(4)
    server.stop(kill=stop_with_kill)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    restarted = start_milvus_lite(tmp_path)
    try:
        fresh = dataclasses.replace(settings, milvus_uri=restarted.uri)
        reopened = open_milvus_stores(fresh, model_id="test/model", dimension=DIM, writer=True)
        stored = reopened.chunks.count_chunks(FilterBuilder().eq(s.TENANT, "t"))
        registry_rows = len(all_keys(reopened.registry, FilterBuilder(s.REGISTRY_FILTERABLE_FIELDS).eq(s.TENANT, "t")))
        print(f"acknowledged chunks {len(acked)}, stored after restart {stored}, registry rows {registry_rows}")
        assert len(acked) > 100
        assert stored >= len(acked)  # every acknowledged chunk is still there
        assert registry_rows >= len(acked) // 5
    finally:
        restarted.stop()
