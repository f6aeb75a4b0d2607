"""A check, against a real Milvus (milvus-lite or the 2.3.5 server), that the sole writer's reads of
the registry by key see its own writes of those keys when each read names only its keys' last write
(ragrpc.store.key_write_times): rows written before it followed the registry, rewrites, the deleting
mark, deletes, and a write whose call failed after it was applied."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from ragrpc.config import Settings
from ragrpc.models import DocumentRecord, DocumentState, document_key
from ragrpc.store import schema as s
from ragrpc.store.factory import open_milvus_stores, read_own_registry_writes
from ragrpc.store.milvus_registry import record_to_row

TENANT = "t1"


def _record(document_id: str, title: str) -> DocumentRecord:
    return DocumentRecord(
        tenant=TENANT,
        document_id=document_id,
        source=f"{document_id}.txt",
        state=DocumentState.ACTIVE,
        generation="g1",
        title=title,
    )


def check_the_writers_reads_by_key(settings: Settings, model_id: str, dimension: int, rounds: int = 6) -> Counter:
    """Runs the writes and reads; returns how many reads used each consistency (asserting each read;
    "Session": the collection's own level, where the server reports no write timestamps)."""
    stores = open_milvus_stores(settings, model_id=model_id, dimension=dimension, writer=True)
    registry, connection = stores.registry, stores.connection
    documents = registry.names.documents
    for i in range(3):  # written before the writer follows the registry (an earlier writer, the recovery)
        registry.put(_record(f"before-{i}", "before"))
    read_own_registry_writes(stores)
    levels: Counter = Counter()

    def read(document_id: str) -> DocumentRecord | None:
        options = connection.key_write_times.read_options(documents, [document_key(TENANT, document_id)])
        levels[str(options.get("consistency_level", "Session"))] += 1
        return registry.get(TENANT, document_id)

    for i in range(3):
        found = read(f"before-{i}")
        assert found is not None and found.title == "before", found
    for round_number in range(rounds):
        name = f"doc-{round_number}"
        registry.put(_record(name, "v1"))
        assert (found := read(name)) is not None and found.title == "v1", found
        registry.put(_record(name, "v2"))
        assert (found := read(name)) is not None and found.title == "v2", found
        found.deleting = True
        registry.put(found)
        assert (found := read(name)) is not None and found.deleting, found
        registry.delete(TENANT, name)
        assert read(name) is None, name

    # a key not written lately names an older timestamp than the collection's last write: it does not wait for
    # it (where the server reports write timestamps: milvus-lite does not, and its reads never wait)
    registry.put(_record("latest", "now"))
    last_write = connection._last_write_ts(documents)  # noqa: SLF001
    old = connection.key_write_times.read_options(documents, [document_key(TENANT, "before-0")])
    if last_write:
        assert old["consistency_level"] == "Customized", old
        assert 0 < old["guarantee_timestamp"] < last_write, (old, last_write)
    else:
        assert old == {}, old

    # a write applied whose answer was lost: its key is read with Strong consistency, and seen
    row = record_to_row(_record("lost-answer", "applied"))

    def applied_then_failed(client: Any) -> None:
        client.upsert(documents, [row])
        raise RuntimeError("the answer was lost")

    try:
        connection.write(applied_then_failed, collection=documents, keys=[row[s.DOC_KEY]])
    except RuntimeError:
        pass
    assert (found := read("lost-answer")) is not None and found.title == "applied", found
    registry.put(dataclasses.replace(found, title="rewritten"))
    assert (found := read("lost-answer")) is not None and found.title == "rewritten", found
    return levels
