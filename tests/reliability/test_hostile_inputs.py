"""Bad input: every real document of ../shared/eval/docs and generated hostile inputs go through
the gRPC ingest service of the fake stack (in-process services over the in-memory stores, hashing
embedder).

Whatever comes in, every document ends ACTIVE or is refused with INVALID_ARGUMENT /
RESOURCE_EXHAUSTED / FAILED_PRECONDITION and a message (never INTERNAL or UNKNOWN); every call
ends within its deadline; after a refusal nothing of the document is stored; the services stay
SERVING. --run-reliability adds the heavy PDFs of the corpus and the full tier of generated inputs.
The same against the real processes: test_hostile_inputs_real_stack.py; request fields fuzzed with
hypothesis: test_request_fuzzing.py.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ragrpc.models import ChunkKind, DocumentState
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.testing.invariants import check_store
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc
from tests.reliability.conftest import REFUSAL_CODES, print_table, refusal_problem
from tests.reliability.hostile_cases import CALL_DEADLINE_S, MUST_REFUSE, generate, hostile_items, needs_corpus
from tests.support import hostile_inputs as hi

# Corpus PDFs that take over ~4 s each to extract on this machine (pdfplumber is GIL-bound):
# only the --run-reliability run sends them, so the regular suite stays short.
HEAVY_PDFS = frozenset(
    {
        "pdf/pdfplumber__chelsea_pdta.pdf",
        "pdf/pdfplumber__WARN-Report-for-7-1-2015-to-03-25-2016.pdf",
        "pdf/pypdf__issue-301.pdf",
        "pdf/llamadatasets__598us1r3_j4ek.pdf",
        "pdf/pdfplumber__federal-register-2020-17221.pdf",
        "pdf/docling__redp5110_sampled.pdf",
        "pdf/llamadatasets__income-statement-morgan-stanley.pdf",
        "pdf/pypdf__GeoBase_NHNC1_Data_Model_UML_EN.pdf",
    }
)


# --- running documents through the fake stack ------------------------------------------------


class Outcome:
    def __init__(self, label: str, document_id: str, expect: str, size: int) -> None:
        self.label, self.document_id, self.expect, self.size = label, document_id, expect, size
        self.state = ""  # ACTIVE / refused code name / problem
        self.message = ""
        self.chunks = 0
        self.seconds = 0.0
        self.problems: list[str] = []

    def row(self) -> tuple[Any, ...]:
        return (self.label, self.size, self.state, self.chunks, f"{self.seconds:.2f}", self.message[:60])


async def _upload_async(
    stub: ingest_pb2_grpc.IngestServiceStub, spec: ingest_pb2.DocumentSpec, content: bytes, timeout_s: float
) -> ingest_pb2.UploadDocumentResponse:
    async def messages():  # type: ignore[no-untyped-def]
        yield ingest_pb2.UploadDocumentRequest(header=spec)
        for start in range(0, len(content), 1 << 20):
            yield ingest_pb2.UploadDocumentRequest(data=content[start : start + (1 << 20)])

    return await stub.UploadDocument(messages(), timeout=timeout_s)


def _stored_chunks(stack: Any, document_id: str, generation: str | None = None, retrievable_only: bool = False) -> int:
    conditions = [f.eq(s.DOCUMENT_ID, document_id)]
    if generation is not None:
        conditions.append(f.eq(s.GENERATION, generation))
    if retrievable_only:
        conditions.append(f.eq(s.KIND, int(ChunkKind.RETRIEVABLE)))
    return stack.chunks.count_chunks(f.and_(*conditions))


async def _ingest_all(
    stack: Any, items: list[tuple[str, str, str, bytes, ingest_pb2.DocumentSpec]], concurrency: int = 2
) -> list[Outcome]:
    """items: (label, document_id, expect, content, spec). Uploads each (a deadline per call) and
    judges the outcome against the in-memory store."""
    gate = asyncio.Semaphore(concurrency)
    outcomes: list[Outcome] = []
    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(stack.ingest_address, options=options) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)

        async def one(label: str, document_id: str, expect: str, content: bytes, spec: ingest_pb2.DocumentSpec) -> None:
            outcome = Outcome(label, document_id, expect, len(content))
            outcomes.append(outcome)
            async with gate:
                started = time.monotonic()
                try:
                    reply = await _upload_async(stub, spec, content, CALL_DEADLINE_S)
                except grpc.aio.AioRpcError as exc:
                    outcome.seconds = time.monotonic() - started
                    outcome.message = exc.details() or ""
                    problem = refusal_problem(exc)
                    outcome.state = exc.code().name
                    if problem:
                        outcome.problems.append(f"not a clean refusal: {problem}")
                    elif expect == "active":
                        outcome.problems.append(f"expected ACTIVE, got {exc.code().name}: {outcome.message[:200]}")
                    await _check_refused_left_nothing(stack, stub, outcome)
                    return
                outcome.seconds = time.monotonic() - started
                document = reply.document
                outcome.state = ingest_pb2.DocumentState.Name(document.state).replace("DOCUMENT_STATE_", "")
                outcome.chunks = document.chunk_count
                if expect == "refuse":
                    outcome.problems.append(
                        f"expected a refusal, got {outcome.state} with {document.chunk_count} chunks"
                    )
                if document.state != ingest_pb2.DOCUMENT_STATE_ACTIVE:
                    outcome.problems.append(f"upload answered OK with state {outcome.state}")
                record = stack.registry.get("default", document.document_id)
                stored = _stored_chunks(stack, document.document_id, record.generation if record else "", True)
                if record is None or stored != document.chunk_count or document.chunk_count <= 0:
                    outcome.problems.append(
                        f"chunk_count {document.chunk_count} but {stored} retrievable chunks "
                        f"stored (record {'present' if record else 'missing'})"
                    )

        await asyncio.gather(*(one(*item) for item in items))
    return outcomes


async def _check_refused_left_nothing(stack: Any, stub: ingest_pb2_grpc.IngestServiceStub, outcome: Outcome) -> None:
    record = stack.registry.get("default", outcome.document_id)
    leftover = _stored_chunks(stack, outcome.document_id)
    if record is not None and record.state == DocumentState.ACTIVE:
        # a refused replacement: the previous version stays, and only it
        current = _stored_chunks(stack, outcome.document_id, record.generation)
        if leftover != current:
            outcome.problems.append(f"{leftover - current} chunk(s) of the refused attempt left")
        return
    if leftover:
        outcome.problems.append(f"{leftover} chunk(s) left after the refusal")
    if record is not None and record.state != DocumentState.FAILED:
        outcome.problems.append(f"registry says {record.state.name} after the refusal")
    if record is not None and not record.error:
        outcome.problems.append("FAILED without an error message in the registry")
    if record is not None:
        try:
            document = (
                await stub.GetDocument(ingest_pb2.GetDocumentRequest(document_id=outcome.document_id), timeout=30)
            ).document
            if document.state != ingest_pb2.DOCUMENT_STATE_FAILED or not document.error_message:
                outcome.problems.append("GetDocument does not say FAILED with an error message")
        except grpc.aio.AioRpcError as exc:
            outcome.problems.append(f"GetDocument of the failed document: {exc.code().name}")


async def _assert_serving(address: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING, f"{address} is {reply.status}"


def _report(title: str, outcomes: list[Outcome], started: float) -> None:
    print_table(
        title,
        [o.row() for o in sorted(outcomes, key=lambda o: o.label)],
        ("input", "bytes", "outcome", "chunks", "seconds", "message"),
    )
    counts = Counter(o.state for o in outcomes)
    print(
        f"{len(outcomes)} inputs in {time.monotonic() - started:.1f}s: "
        + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
    )
    problems = [f"{o.label}: {p}" for o in outcomes for p in o.problems]
    assert not problems, "\n".join(problems)


def _corpus_items(full: bool) -> list[tuple[str, str, str, bytes, ingest_pb2.DocumentSpec]]:
    items = []
    for corpus_file in hi.corpus_files():
        if not full and corpus_file.relative in HEAVY_PDFS:
            continue
        expect = "either"
        if corpus_file.encrypted:
            expect = "active"  # the recorded password opens it
        if corpus_file.relative in MUST_REFUSE:
            expect = "refuse"
        spec = ingest_pb2.DocumentSpec(
            file_name=corpus_file.path.name,
            document_id=corpus_file.document_id,
            password=corpus_file.password,
            tags=["corpus", corpus_file.relative[:3]],
        )
        items.append((corpus_file.relative, corpus_file.document_id, expect, corpus_file.path.read_bytes(), spec))
    return items


async def _corpus(fake_stack: Any, full: bool) -> None:
    started = time.monotonic()
    items = _corpus_items(full)
    assert len(items) >= (98 if full else 90), f"only {len(items)} corpus files found"
    outcomes = await _ingest_all(fake_stack, items)
    await _assert_serving(fake_stack.ingest_address)
    await _assert_serving(fake_stack.query_address)
    encrypted = [o for o in outcomes if o.expect == "active"]
    print(
        f"\nencrypted PDFs opened with their recorded password: {sum(o.state == 'ACTIVE' for o in encrypted)}"
        f"/{len(encrypted)}"
    )
    report = check_store(fake_stack.chunks, fake_stack.registry)
    print(f"store after the corpus: {report.summary()}")
    _report(f"corpus through gRPC ({'all' if full else 'all but the heavy PDFs'})", outcomes, started)
    for label, code in MUST_REFUSE.items():
        match = [o for o in outcomes if o.label == label]
        assert not match or match[0].state == code, f"{label}: {match[0].state}"
    assert not report.problems, report.problems


@needs_corpus
@pytest.mark.slow
async def test_corpus_through_grpc(fake_stack) -> None:  # type: ignore[no-untyped-def]
    """Every corpus file but the 8 slowest PDFs (90 of the 98 files)."""
    await _corpus(fake_stack, full=False)


@needs_corpus
@pytest.mark.reliability
@pytest.mark.timeout(1800)
async def test_corpus_through_grpc_all_files(fake_stack) -> None:  # type: ignore[no-untyped-def]
    """Every corpus file, heavy PDFs included."""
    await _corpus(fake_stack, full=True)


# --- generated hostile inputs ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def generated() -> list[hi.HostileInput]:
    return generate("regular")


async def _generated(fake_stack: Any, inputs: list[hi.HostileInput]) -> None:
    started = time.monotonic()
    outcomes = await _ingest_all(fake_stack, hostile_items(inputs))
    await _assert_serving(fake_stack.ingest_address)
    await _assert_serving(fake_stack.query_address)
    report = check_store(fake_stack.chunks, fake_stack.registry)
    print(f"store after the hostile inputs: {report.summary()}")
    _report("generated hostile inputs through UploadDocument", outcomes, started)
    assert not report.problems, report.problems


@pytest.mark.slow
async def test_generated_hostile_inputs(fake_stack, generated) -> None:  # type: ignore[no-untyped-def]
    await _generated(fake_stack, generated)


@pytest.mark.reliability
@pytest.mark.timeout(1800)
async def test_generated_hostile_inputs_full(fake_stack) -> None:  # type: ignore[no-untyped-def]
    await _generated(fake_stack, generate("full"))


async def test_hostile_batch_through_ingest_documents(fake_stack) -> None:  # type: ignore[no-untyped-def]
    """The small hostile inputs as one IngestDocuments batch: one final progress per document,
    ACTIVE or FAILED with a refusal code; the summary adds up; GetIngestJob agrees."""
    inputs = hi.generated_inputs(seed=7, tier="small")
    request = ingest_pb2.IngestDocumentsRequest(
        documents=[
            ingest_pb2.InlineDocument(
                spec=ingest_pb2.DocumentSpec(
                    file_name=h.file_name, media_type=h.media_type, document_id=h.document_id, password=h.password
                ),
                content=h.content,
            )
            for h in inputs
        ]
    )
    started = time.monotonic()
    async with grpc.aio.insecure_channel(fake_stack.ingest_address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        events = [e async for e in stub.IngestDocuments(request, timeout=CALL_DEADLINE_S)]
        job = (await stub.GetIngestJob(ingest_pb2.GetIngestJobRequest(job_id=events[-1].job_id), timeout=30)).job
    elapsed = time.monotonic() - started
    assert events[-1].HasField("summary") and sum(e.HasField("summary") for e in events) == 1
    final: dict[int, ingest_pb2.DocumentProgress] = {}
    for event in events:
        if event.HasField("progress"):
            final[event.progress.index] = event.progress
    assert sorted(final) == list(range(len(inputs)))
    problems, codes = [], Counter()
    for index, h in enumerate(inputs):
        progress = final[index]
        assert progress.stage == ingest_pb2.INGEST_STAGE_DONE, (h.name, progress)
        if progress.state == ingest_pb2.DOCUMENT_STATE_ACTIVE:
            codes["ACTIVE"] += 1
            if h.expect == "refuse":
                problems.append(f"{h.name}: expected a refusal, got ACTIVE")
            continue
        codes[progress.error_code] += 1
        if (
            progress.state != ingest_pb2.DOCUMENT_STATE_FAILED
            or progress.error_code not in {c.name for c in REFUSAL_CODES}
            or not progress.error_message
        ):
            problems.append(
                f"{h.name}: {ingest_pb2.DocumentState.Name(progress.state)} "
                f"{progress.error_code}: {progress.error_message[:200]}"
            )
        if _stored_chunks(fake_stack, h.document_id):
            problems.append(f"{h.name}: chunks left after FAILED")
    summary = events[-1].summary
    print(
        f"\nbatch of {len(inputs)} hostile documents in {elapsed:.1f}s: {dict(codes)}; summary "
        f"succeeded={summary.succeeded} failed={summary.failed} chunks_written={summary.chunks_written}"
    )
    assert summary.succeeded + summary.failed == len(inputs)
    assert summary.failed == sum(v for k, v in codes.items() if k != "ACTIVE")
    assert job.done and len(job.documents) == len(inputs)
    assert not problems, "\n".join(problems)
    report = check_store(fake_stack.chunks, fake_stack.registry)
    assert not report.problems, report.problems
    await _assert_serving(fake_stack.ingest_address)
