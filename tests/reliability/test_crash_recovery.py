"""Crashes, against the real processes (milvus-lite server + services as OS processes, real model):
kill -9 of the ingest service at random moments of a batch ingestion, restart, repeat; after every
restart the store invariants are checked directly in Milvus (open_milvus_stores, reader); finally
the batch runs to completion with every document ACTIVE. Outages of Milvus and of an LLM endpoint:
test_outages.py.
"""

from __future__ import annotations

import random
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest

from ragrpc.testing.invariants import check_store
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc
from tests.reliability.conftest import RealStack, print_table
from tests.reliability.hostile_cases import needs_corpus
from tests.support import hostile_inputs as hi

# 30 small real documents (about 40k characters of text, ~100 chunks) from the shared corpus.
CRASH_BATCH = (
    "html/docling__table_06.html",
    "docx/docling__docx_comments.docx",
    "markdown/docling__wiki.md",
    "markdown/docling__README.md",
    "markdown/pypdf__README.md",
    "docx/docling__lorem_ipsum.docx",
    "docx/docling__equations.docx",
    "docx/docling__textbox.docx",
    "docx/docling__word_tables.docx",
    "docx/docling__docx_lists.docx",
    "docx/docling__docx_rich_cells.docx",
    "other/docling__csv-comma.csv",
    "html/docling__html_code_snippets.html",
    "html/docling__html_rich_table_cells.html",
    "html/docling__example_08.html",
    "html/docling__formatting.html",
    "markdown/docling__duck.md",
    "docx/docling__word_sample.docx",
    "docx/docling__unit_test_headers_numbered.docx",
    "markdown/docling__inline_and_formatting.md",
    "html/docling__html_description_list.html",
    "html/docling__example_03.html",
    "html/docling__kvp_data_example.html",
    "markdown/docling__escaped_characters.md",
    "markdown/docling__mixed.md",
    "docx/docling__unit_test_formatting.docx",
    "markdown/docling__blocks.md",
    "html/docling__example_01.html",
    "docx/docling__unit_test_headers.docx",
    "markdown/docling__nested.md",
)
# Documents whose content changes every round, so kills also hit replacements (stale generations).
MUTATING_SUFFIXES = (".md", ".html")


def _batch(round_number: int, fresh: int = 0) -> ingest_pb2.IngestDocumentsRequest:
    """The 30 corpus documents (the .md and .html ones changed every round, so later rounds
    replace them), preceded by `fresh` new documents (first-time ingestions)."""
    corpus = {c.relative: c for c in hi.corpus_files()}
    documents = []
    for index in range(fresh):
        text = " ".join(
            f"Fresh note {round_number}.{index}: sentence {n} about wading birds and reed beds." for n in range(40)
        )
        documents.append(
            ingest_pb2.InlineDocument(
                spec=ingest_pb2.DocumentSpec(
                    file_name=f"fresh-{round_number}-{index}.txt", document_id=f"fresh-{round_number}-{index}"
                ),
                content=text.encode(),
            )
        )
    for relative in CRASH_BATCH:
        item = corpus[relative]
        content = item.path.read_bytes()
        if relative.endswith(MUTATING_SUFFIXES):
            content += f"\n\nRevision note {round_number}: the heron count was {round_number * 7 + 3}.\n".encode()
        documents.append(
            ingest_pb2.InlineDocument(
                spec=ingest_pb2.DocumentSpec(
                    file_name=item.path.name, document_id=item.document_id, tags=["crash", f"round-{round_number}"]
                ),
                content=content,
            )
        )
    return ingest_pb2.IngestDocumentsRequest(documents=documents)


class _BatchRun:
    """IngestDocuments in a background thread; remembers what it saw until the stream ended."""

    def __init__(self, address: str, request: ingest_pb2.IngestDocumentsRequest) -> None:
        self.address = address
        self.request = request
        self.events: list[ingest_pb2.IngestDocumentsResponse] = []
        self.error: grpc.RpcError | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            try:
                for event in ingest_pb2_grpc.IngestServiceStub(channel).IngestDocuments(self.request, timeout=600):
                    self.events.append(event)
            except grpc.RpcError as exc:
                self.error = exc

    @property
    def summary(self) -> ingest_pb2.IngestSummary | None:
        return self.events[-1].summary if self.events and self.events[-1].HasField("summary") else None

    @property
    def documents_done(self) -> int:
        return sum(
            1 for e in self.events if e.HasField("progress") and e.progress.stage == ingest_pb2.INGEST_STAGE_DONE
        )


def _recovery_counts(log: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for match in re.finditer(r"recovery done: \{([^}]*)\}", log):
        for key, value in re.findall(r"'(\w+)': (\d+)", match.group(1)):
            counts[key] += int(value)
    return counts


def _list_states(address: str) -> Counter[str]:
    states: Counter[str] = Counter()
    token = ""
    with grpc.insecure_channel(address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        while True:
            page = stub.ListDocuments(ingest_pb2.ListDocumentsRequest(page_size=100, page_token=token), timeout=60)
            for document in page.documents:
                states[ingest_pb2.DocumentState.Name(document.state)] += 1
            token = page.next_page_token
            if not token:
                return states


def _kill_and_restart(tmp_path: Path, kills: int, seed: int, max_delay_s: float, page_size: int | None = None) -> None:
    """max_delay_s bounds the first kill (during first-time ingestion); later kills fall within 70%
    of a measured complete batch, so they interrupt a running batch on fast and slow machines alike.
    `page_size` (RAGRPC_STORE_PAGE_SIZE of the ingest service): below the batch's 30 documents and
    ~100 chunks, the recovery pass after every kill, the listing and the replacements page through
    the store."""
    rng = random.Random(seed)
    env = {"RAGRPC_STORE_PAGE_SIZE": str(page_size)} if page_size else {}
    stack = RealStack(tmp_path / "crash", prefix="crash", env=env)
    rows: list[tuple[Any, ...]] = []
    problems: list[str] = []
    rows_checked = interrupted = 0
    try:
        stack.start(query=False)
        assert stack.ingest is not None
        stores = stack.reader_stores()
        upper = max_delay_s
        for round_number in range(kills):
            if round_number == 1:
                # complete the batch once, so the later kills interrupt replacements of ACTIVE documents
                # (and first-time ingestions of the fresh ones); its duration calibrates the kill delays
                complete = _BatchRun(stack.ingest.address, _batch(1000))
                begun = time.monotonic()
                complete.thread.start()
                complete.thread.join(900)
                assert complete.summary is not None and complete.summary.failed == 0, complete.events[-1:]
                upper = max(0.5, 0.7 * (time.monotonic() - begun))
                print(f"\ncomplete batch took {time.monotonic() - begun:.1f}s: later kills within 0.1-{upper:.1f}s")
            delay = rng.uniform(0.1 if round_number else 0.2, upper)
            run = _BatchRun(stack.ingest.address, _batch(round_number, fresh=3))
            run.thread.start()
            time.sleep(delay)
            finished_before_kill = run.summary is not None
            stack.ingest.kill(signal.SIGKILL)
            run.thread.join(60)
            interrupted += not finished_before_kill
            restart_s = stack.ingest.start()
            report = check_store(stores.chunks, stores.registry)
            rows_checked += report.documents + report.chunks
            listed = _list_states(stack.ingest.address)
            bad_listed = {
                k: v for k, v in listed.items() if k in ("DOCUMENT_STATE_PENDING", "DOCUMENT_STATE_PROCESSING")
            }
            rows.append(
                (
                    round_number + 1,
                    f"{delay:.2f}",
                    run.documents_done,
                    "finished" if finished_before_kill else "interrupted",
                    f"{restart_s:.1f}",
                    report.documents,
                    report.chunks,
                    dict(report.states),
                    len(report.problems),
                )
            )
            problems += [f"after kill {round_number + 1}: {p}" for p in report.problems]
            if bad_listed:
                problems.append(f"after kill {round_number + 1}: ListDocuments shows {bad_listed}")
        final = _BatchRun(stack.ingest.address, _batch(kills))
        started = time.monotonic()
        final.thread.start()
        final.thread.join(900)
        elapsed = time.monotonic() - started
        assert final.error is None, f"final batch failed: {final.error}"
        summary = final.summary
        assert summary is not None, "final batch ended without a summary"
        report = check_store(stores.chunks, stores.registry)
        rows_checked += report.documents + report.chunks
        with grpc.insecure_channel(stack.ingest.address) as channel:
            stub = ingest_pb2_grpc.IngestServiceStub(channel)
            finals = {
                d.spec.document_id: stub.GetDocument(
                    ingest_pb2.GetDocumentRequest(document_id=d.spec.document_id), timeout=30
                ).document
                for d in _batch(kills).documents
            }
        not_active = {
            k: ingest_pb2.DocumentState.Name(v.state)
            for k, v in finals.items()
            if v.state != ingest_pb2.DOCUMENT_STATE_ACTIVE
        }
        recovery = _recovery_counts(stack.ingest.log_text())
        print_table(
            f"kill -9 of the ingest service during IngestDocuments ({kills} kills, seed {seed})",
            rows,
            ("kill", "after_s", "docs_done", "batch", "restart_s", "registry", "chunks", "states", "problems"),
        )
        print(
            f"kills survived: {kills} ({interrupted} interrupted a running batch); recovery passes: "
            f"{dict(recovery)}; rows checked in Milvus: {rows_checked}"
        )
        print(
            f"final batch: {summary.succeeded} succeeded, {summary.failed} failed, {summary.unchanged} unchanged, "
            f"{summary.chunks_written} chunks written in {elapsed:.1f}s; store: {report.summary()}"
        )
        assert summary.failed == 0 and summary.succeeded == len(CRASH_BATCH), summary
        assert not not_active, not_active
        assert not report.problems, report.problems
        assert not problems, "\n".join(problems)
    finally:
        stack.stop()


@needs_corpus
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_ingest_during_batch(tmp_path: Path) -> None:
    _kill_and_restart(tmp_path, kills=5, seed=5, max_delay_s=6.0)


@needs_corpus
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_ingest_during_batch_with_a_page_smaller_than_the_batch(tmp_path: Path) -> None:
    """The same with 7 rows a page: every store read of the recovery pass (interrupted attempts,
    stale chunks), of ListDocuments and of replacements crosses page boundaries."""
    _kill_and_restart(tmp_path, kills=4, seed=7, max_delay_s=6.0, page_size=7)


@needs_corpus
@pytest.mark.reliability
@pytest.mark.timeout(3600)
def test_kill_ingest_during_batch_many(tmp_path: Path) -> None:
    _kill_and_restart(tmp_path, kills=20, seed=20, max_delay_s=6.0, page_size=11)
