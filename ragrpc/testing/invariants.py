"""What must hold of a collection once no ingestion runs and every fault has cleared (after the
writer's settling or its recovery at start), checked directly in the stores - the in-memory fakes
or Milvus through the adapters - and of a query service's view of it. The fault matrix, the chaos
run and the crash, outage and hostile-input tests assert these after each step.

Store (`check_store`):
  * no document is PENDING or PROCESSING, none keeps a pending generation or a delete mark; with
    `settled=True` none keeps a replaced (stale) generation either - without it, a replaced version
    whose record still names it is allowed: its rows stay for the grace period after a replacement
    (RAGRPC_REPLACED_VERSION_GRACE_S) and go afterwards;
  * every chunk belongs to a registry document that is ACTIVE, under its current generation (no
    chunk without a registry row, none of an old or rolled-back generation);
  * every ACTIVE document has exactly `chunk_count` retrievable chunks;
  * given `contents` (content hash -> the text uploaded), every chunk of an ACTIVE document holds
    text of the content its record's hash names;
  * with `fields=True`, every chunk carries its record's title and tags (what an update rewrites).

Query view (`check_query_view`): the follower's visible documents are the registry's ACTIVE ones
at their current generations, and each in-process index holds exactly their chunks.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ragrpc.models import ChunkKind, DocumentRecord, DocumentState
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.testing.memory_store import all_records

TENANT = "default"
_WORD = re.compile(r"\w+")


@dataclass
class InvariantReport:
    documents: int = 0
    chunks: int = 0
    states: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        states = ", ".join(f"{k}={v}" for k, v in sorted(self.states.items()))
        return f"{self.documents} registry rows ({states}), {self.chunks} chunk rows, {len(self.problems)} problems"

    def assert_ok(self) -> None:
        assert not self.problems, self.summary() + "\n" + "\n".join(self.problems[:30])


def check_store(
    chunks: Any,
    registry: Any,
    tenant: str = TENANT,
    *,
    contents: Mapping[str, str] | None = None,
    fields: bool = False,
    settled: bool = False,
) -> InvariantReport:
    report = InvariantReport()
    records: dict[str, DocumentRecord] = {}
    for record in all_records(registry):
        if record.tenant == tenant:
            records[record.document_id] = record
    report.documents = len(records)
    for record in records.values():
        report.states[record.state.name] += 1
        if record.state in (DocumentState.PENDING, DocumentState.PROCESSING):
            report.problems.append(f"{record.document_id}: still {record.state.name}")
        if record.pending_generation or (record.stale_generation and settled) or record.deleting:
            report.problems.append(
                f"{record.document_id}: leftover markers pending={record.pending_generation!r} "
                f"stale={record.stale_generation!r} deleting={record.deleting}"
            )
    stored: Counter[tuple[str, str]] = Counter()
    retrievable: Counter[tuple[str, str]] = Counter()
    words_cache: dict[str, set[str]] = {}
    for batch in chunks.scan_chunks(f.eq(s.TENANT, tenant)):
        for chunk in batch:
            report.chunks += 1
            stored[(chunk.document_id, chunk.generation)] += 1
            if chunk.kind == ChunkKind.RETRIEVABLE:
                retrievable[(chunk.document_id, chunk.generation)] += 1
            owner = records.get(chunk.document_id)
            if owner is None or owner.state != DocumentState.ACTIVE or owner.generation != chunk.generation:
                continue
            if contents is not None:
                _check_content(report, owner, chunk.text, contents, words_cache)
            if fields:
                _check_fields(report, owner, chunk)
    for (document_id, generation), count in stored.items():
        found = records.get(document_id)
        if found is None:
            report.problems.append(f"{count} orphan chunk(s) of {document_id!r} (no registry row), gen {generation}")
        elif found.state != DocumentState.ACTIVE:
            report.problems.append(f"{count} chunk(s) of {found.state.name} document {document_id!r}")
        elif found.generation != generation and not (generation == found.stale_generation and not settled):
            report.problems.append(
                f"{count} chunk(s) of {document_id!r} under non-current generation "
                f"{generation} (current {found.generation})"
            )
    for record in records.values():
        if record.state == DocumentState.ACTIVE:
            have = retrievable[(record.document_id, record.generation)]
            if have != record.chunk_count:
                report.problems.append(
                    f"{record.document_id}: chunk_count {record.chunk_count} but {have} retrievable chunks stored"
                )
    return report


def _check_content(
    report: InvariantReport,
    record: DocumentRecord,
    text: str,
    contents: Mapping[str, str],
    cache: dict[str, set[str]],
) -> None:
    content = contents.get(record.content_hash)
    if content is None:
        report.problems.append(
            f"{record.document_id}: content hash {record.content_hash[:12]} names no uploaded content"
        )
        return
    words = cache.setdefault(record.content_hash, set(_WORD.findall(content.casefold())))
    strays = set(_WORD.findall(text.casefold())) - words
    if strays:
        report.problems.append(
            f"{record.document_id}: a chunk holds words of another content than its hash names: {sorted(strays)[:5]}"
        )


def _check_fields(report: InvariantReport, record: DocumentRecord, chunk: Any) -> None:
    if (chunk.title, tuple(chunk.tags)) != (record.title, tuple(record.tags)):
        report.problems.append(
            f"{record.document_id}: chunk {chunk.chunk_id} carries title/tags {chunk.title!r}/{list(chunk.tags)} "
            f"but the record {record.title!r}/{record.tags}"
        )


def active_generations(registry: Any, tenant: str | None = None) -> dict[str, tuple[str, int]]:
    """key -> (generation, chunk_count) of every ACTIVE document (what a query service must show)."""
    return {
        r.key: (r.generation, r.chunk_count)
        for r in all_records(registry, DocumentState.ACTIVE)
        if r.generation and not r.deleting and (tenant is None or r.tenant == tenant)
    }


def check_query_view(follower: Any, registry: Any, indexes: Mapping[str, Any] | None = None) -> InvariantReport:
    """The query service's view against the registry: `follower` a RegistryFollower, `indexes` name ->
    an object with `documents()` giving key -> (generation, chunk count) of what it holds (the
    in-process BM25 and dense indexes, through their ChunkIndexSync)."""
    report = InvariantReport()
    expected = active_generations(registry)
    report.documents = len(expected)
    visible = follower.visible_generations()
    for key in sorted(set(expected) | set(visible)):
        want = expected.get(key, ("", 0))[0]
        have = visible.get(key, "")
        if want != have:
            report.problems.append(f"follower shows {key} at {have or 'nothing'}, the registry at {want or 'nothing'}")
    for name, index in (indexes or {}).items():
        held = index.documents()
        report.chunks += sum(count for _, count in held.values())
        for key in sorted(set(expected) | set(held)):
            want_pair = expected.get(key)
            have_pair = held.get(key)
            if want_pair != have_pair:
                report.problems.append(f"{name} holds {key} as {have_pair}, the registry says {want_pair}")
    return report
