"""The store invariants that hold whenever no ingestion is running, checked directly in the
stores (the in-memory fakes or Milvus through reader adapters): what the crash, outage and
hostile-input tests assert after each step."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

TENANT = "default"


@dataclass
class InvariantReport:
    documents: int = 0
    chunks: int = 0
    states: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        states = ", ".join(f"{k}={v}" for k, v in sorted(self.states.items()))
        return f"{self.documents} registry rows ({states}), {self.chunks} chunk rows, {len(self.problems)} problems"


def check_invariants(chunks: Any, registry: Any, tenant: str = TENANT) -> InvariantReport:
    """Checks, directly in the stores, what must hold whenever no ingestion is running (after the
    writer's recovery pass):

      * no document is PENDING or PROCESSING, none has a pending/stale generation or a delete mark;
      * every chunk belongs to a registry document that is ACTIVE, under its current generation;
      * every ACTIVE document's chunk_count equals its stored retrievable chunks.
    """
    from ragrpc.models import ChunkKind, DocumentState
    from ragrpc.store import filters as f
    from ragrpc.store import schema as s
    from ragrpc.testing.memory_store import all_records

    report = InvariantReport()
    records = {}
    for record in all_records(registry):
        if record.tenant == tenant:
            records[record.document_id] = record
    report.documents = len(records)
    for record in records.values():
        report.states[record.state.name] += 1
        if record.state in (DocumentState.PENDING, DocumentState.PROCESSING):
            report.problems.append(f"{record.document_id}: still {record.state.name}")
        if record.pending_generation or record.stale_generation or record.deleting:
            report.problems.append(
                f"{record.document_id}: leftover markers pending={record.pending_generation!r} "
                f"stale={record.stale_generation!r} deleting={record.deleting}"
            )
    stored: Counter[tuple[str, str]] = Counter()
    retrievable: Counter[tuple[str, str]] = Counter()
    for batch in chunks.scan_chunks(f.eq(s.TENANT, tenant)):
        for chunk in batch:
            report.chunks += 1
            stored[(chunk.document_id, chunk.generation)] += 1
            if chunk.kind == ChunkKind.RETRIEVABLE:
                retrievable[(chunk.document_id, chunk.generation)] += 1
    for (document_id, generation), count in stored.items():
        record = records.get(document_id)
        if record is None:
            report.problems.append(f"{count} orphan chunk(s) of {document_id!r} (no registry row), gen {generation}")
        elif record.state != DocumentState.ACTIVE:
            report.problems.append(f"{count} chunk(s) of {record.state.name} document {document_id!r}")
        elif record.generation != generation:
            report.problems.append(
                f"{count} chunk(s) of {document_id!r} under non-current generation "
                f"{generation} (current {record.generation})"
            )
    for record in records.values():
        if record.state == DocumentState.ACTIVE:
            have = retrievable[(record.document_id, record.generation)]
            if have != record.chunk_count:
                report.problems.append(
                    f"{record.document_id}: chunk_count {record.chunk_count} but {have} retrievable chunks stored"
                )
    return report
