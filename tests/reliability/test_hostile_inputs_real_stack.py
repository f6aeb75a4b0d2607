"""Bad input against the real stack (milvus-lite and both services as processes, the real
model): a sample of ../shared/eval/docs and of the generated hostile inputs gets the same outcomes
as on the fake stack, nothing of a refused document is retrievable or stored in Milvus, the services
stay SERVING, and the ingest service's memory after the bombs is reported."""

from __future__ import annotations

import time

import grpc
import pytest

from ragrpc.testing.invariants import check_store
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc
from tests.reliability.conftest import (
    RealStack,
    chunks_of,
    chunks_once_followed,
    health,
    print_table,
    refusal_problem,
    rss_kib,
    upload,
)
from tests.reliability.hostile_cases import CALL_DEADLINE_S, MUST_REFUSE, generate, hostile_items, needs_corpus
from tests.support import hostile_inputs as hi

_REAL_SAMPLE = (
    "pdf/pypdf__crazyones-encrypted-256.pdf",
    "pdf/pypdf__libreoffice-writer-password.pdf",
    "pdf/pdfplumber__password-example.pdf",
    "pdf/pdfplumber__empty.pdf",
    "pdf/docling__ocr_test.pdf",
    "pdf/pdfplumber__malformed-from-issue-932.pdf",
    "docx/docling__Strict.docx",
    "docx/docling__word_sample.docx",
    "other/docling__xlsx_01.xlsx",
    "other/docling__csv-comma.csv",
    "html/docling__table_06.html",
    "markdown/docling__escaped_characters.md",
)
_REAL_HOSTILE = (
    "random-4096.pdf",
    "truncated-30pct.pdf",
    "corrupted-1-mode1.pdf",
    "docx-lying-size.docx",
    "docx-method-99.docx",
    "nul-only.txt",
    "invalid-utf8-bytes.txt",
    "pdf-declared-html",
    "empty.docx",
    "png-declared-text",
    "html-depth-100000.html",
    "docx-bomb-400MiB.docx",
    "docx-lying-bomb-300MiB.docx",
    "control-chars.txt",
    "wrong-password-pdfplumber__password-example",
)


@needs_corpus
@pytest.mark.slow
def test_real_stack_sample(shared_real_stack: RealStack) -> None:
    """A sample of the corpus and of the hostile inputs against the real processes: the same
    outcomes, nothing of a refused document retrievable or stored in Milvus, services SERVING,
    and the ingest service's RSS after the bombs."""
    stack = shared_real_stack
    corpus = {c.relative: c for c in hi.corpus_files()}
    by_name = {h.name: h for h in generate("regular")}
    items = [
        (
            c.relative,
            c.document_id,
            "active" if c.encrypted else ("refuse" if c.relative in MUST_REFUSE else "either"),
            c.path.read_bytes(),
            ingest_pb2.DocumentSpec(file_name=c.path.name, document_id=c.document_id, password=c.password),
        )
        for c in (corpus[r] for r in _REAL_SAMPLE if r in corpus)
    ]
    items += hostile_items([by_name[n] for n in _REAL_HOSTILE if n in by_name])
    assert stack.ingest is not None and stack.query is not None
    rss_before = rss_kib(stack.ingest.pid)
    rows, problems = [], []
    started = time.monotonic()
    for label, document_id, expect, content, spec in items:
        begun = time.monotonic()
        try:
            reply = upload(stack.ingest.address, spec, content, timeout_s=CALL_DEADLINE_S)
            outcome, chunks = "ACTIVE", reply.document.chunk_count
            if expect == "refuse":
                problems.append(f"{label}: expected a refusal, got ACTIVE")
            found = len(chunks_once_followed(stack.query.address, document_id, min(chunks, 100)))
            if found != min(chunks, 100):
                problems.append(f"{label}: {chunks} chunks stored but {found} retrievable by document_ids filter")
        except grpc.RpcError as exc:
            outcome, chunks = exc.code().name, 0  # type: ignore[attr-defined]
            problem = refusal_problem(exc)
            if problem:
                problems.append(f"{label}: {problem}")
            elif expect == "active":
                problems.append(f"{label}: expected ACTIVE, got {problem or exc.details()}")  # type: ignore[attr-defined]
            if chunks_of(stack.query.address, document_id):
                problems.append(f"{label}: chunks of the refused document are retrievable")
            with grpc.insecure_channel(stack.ingest.address) as channel:
                try:
                    document = (
                        ingest_pb2_grpc.IngestServiceStub(channel)
                        .GetDocument(ingest_pb2.GetDocumentRequest(document_id=document_id), timeout=30)
                        .document
                    )
                    if document.state != ingest_pb2.DOCUMENT_STATE_FAILED or not document.error_message:
                        problems.append(f"{label}: registry state {document.state} after the refusal")
                except grpc.RpcError as missing:
                    if missing.code() != grpc.StatusCode.NOT_FOUND:  # type: ignore[attr-defined]
                        problems.append(f"{label}: GetDocument {missing.code().name}")  # type: ignore[attr-defined]
        rows.append((label, len(content), outcome, chunks, f"{time.monotonic() - begun:.2f}"))
    rss_after = rss_kib(stack.ingest.pid)
    print_table("real stack: corpus sample + hostile inputs", rows, ("input", "bytes", "outcome", "chunks", "seconds"))
    print(
        f"{len(items)} inputs in {time.monotonic() - started:.1f}s; ingest RSS {rss_before / 1024:.0f} MiB before, "
        f"{rss_after / 1024:.0f} MiB after"
    )
    stores = stack.reader_stores()
    report = check_store(stores.chunks, stores.registry)
    print(f"Milvus after the sample: {report.summary()}")
    assert health(stack.ingest.address) == "SERVING" and health(stack.query.address) == "SERVING"
    assert not problems, "\n".join(problems)
    assert not report.problems, report.problems
