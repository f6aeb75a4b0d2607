"""Bad input: every real document of ../shared/eval/docs and generated hostile inputs go through
the gRPC ingest service; request fields are fuzzed with hypothesis.

Whatever comes in, every document ends ACTIVE or is refused with INVALID_ARGUMENT /
RESOURCE_EXHAUSTED / FAILED_PRECONDITION and a message (never INTERNAL or UNKNOWN); every call
ends within its deadline; after a refusal nothing of the document is stored; the services stay
SERVING.

    fake_stack (in-process services over the in-memory stores, hashing embedder): fast, every file
    real stack (milvus-lite + both services as processes, real model): a sample, `slow`
    --run-reliability: the heavy PDFs of the corpus too, and many more fuzzing examples
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf import field_mask_pb2, timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragrpc.models import ChunkKind, DocumentState
from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.reliability.conftest import (
    REFUSAL_CODES,
    RealStack,
    check_invariants,
    chunks_of,
    chunks_once_followed,
    health,
    print_table,
    refusal_problem,
    rss_kib,
    upload,
)
from tests.support import hostile_inputs as hi

CALL_DEADLINE_S = 300.0  # generous: 2 shared cores; a hang is far beyond this
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
# Files that can only be refused, whatever the implementation (no text, empty, unsupported).
MUST_REFUSE = {
    "pdf/pdfplumber__empty.pdf": "INVALID_ARGUMENT",
    "docx/docling__Strict.docx": "INVALID_ARGUMENT",
    "other/docling__powerpoint_sample.pptx": "INVALID_ARGUMENT",
    "other/docling__xlsx_01.xlsx": "INVALID_ARGUMENT",
    "pdf/docling__ocr_test.pdf": "INVALID_ARGUMENT",
    "pdf/docling__nemotron_multipage.pdf": "INVALID_ARGUMENT",
}

needs_corpus = pytest.mark.skipif(not hi.CORPUS.is_dir(), reason=f"corpus {hi.CORPUS} is missing")


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
    report = check_invariants(fake_stack.chunks, fake_stack.registry)
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


def _hostile_items(inputs: list[hi.HostileInput]) -> list[tuple[str, str, str, bytes, ingest_pb2.DocumentSpec]]:
    return [
        (
            h.name,
            h.document_id,
            h.expect,
            h.content,
            ingest_pb2.DocumentSpec(
                file_name=h.file_name, media_type=h.media_type, document_id=h.document_id, password=h.password
            ),
        )
        for h in inputs
    ]


@pytest.fixture(scope="module")
def generated() -> list[hi.HostileInput]:
    return _generate("regular")


def _generate(tier: str) -> list[hi.HostileInput]:
    started = time.monotonic()
    inputs = hi.generated_inputs(seed=20240611, tier=tier)
    print(
        f"\ngenerated {len(inputs)} hostile inputs, tier {tier} ({sum(len(h.content) for h in inputs) / 1e6:.1f} MB)"
        f" in {time.monotonic() - started:.1f}s"
    )
    return inputs


async def _generated(fake_stack: Any, inputs: list[hi.HostileInput]) -> None:
    started = time.monotonic()
    outcomes = await _ingest_all(fake_stack, _hostile_items(inputs))
    await _assert_serving(fake_stack.ingest_address)
    await _assert_serving(fake_stack.query_address)
    report = check_invariants(fake_stack.chunks, fake_stack.registry)
    print(f"store after the hostile inputs: {report.summary()}")
    _report("generated hostile inputs through UploadDocument", outcomes, started)
    assert not report.problems, report.problems


@pytest.mark.slow
async def test_generated_hostile_inputs(fake_stack, generated) -> None:  # type: ignore[no-untyped-def]
    await _generated(fake_stack, generated)


@pytest.mark.reliability
@pytest.mark.timeout(1800)
async def test_generated_hostile_inputs_full(fake_stack) -> None:  # type: ignore[no-untyped-def]
    await _generated(fake_stack, _generate("full"))


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
    report = check_invariants(fake_stack.chunks, fake_stack.registry)
    assert not report.problems, report.problems
    await _assert_serving(fake_stack.ingest_address)


# --- hypothesis: fuzzing request fields --------------------------------------------------------------

_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80)
_NASTY = st.sampled_from(
    [
        '"',
        "\\",
        '\\"',
        "' or 1==1 or '",
        '") or true or ("',
        "a\nb",
        "\t",
        "\x00",
        "\x7f",
        "\u202e",
        'tenant == "x"',
        "{p0}",
        "%s",
        "é",
        "🦆",
        "x" * 129,
        "x" * 5000,
        " ",
        "",
    ]
)
_STRINGS = st.one_of(_TEXT, _NASTY, st.from_regex(r"[A-Za-z0-9._:-]{1,40}", fullmatch=True))
_INT32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1, -1, 100, 101, 1000, 1001, 2**31 - 1]))
_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 0.5, 1.0, -0.0, 1e308]))
_ENUM = st.integers(-3, 40)
_ID = st.from_regex(r"[A-Za-z0-9._:-]{1,40}", fullmatch=True)
_NAME = st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True)
_WORDS = st.lists(
    st.sampled_from(["grebe", "coot", "tern", "pond", "reed", "fish", "dive", "nest", "lake"]), min_size=1, max_size=8
).map(" ".join)
_LABEL = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=30)
_CONTENT = st.one_of(
    st.binary(max_size=3000),
    _TEXT.map(lambda t: ("Grebes and coots share the pond. " + t).encode()),
    _WORDS.map(lambda t: (t + ". ").encode() * 40),
    st.sampled_from(
        [hi.minimal_pdf(["fuzzed pdf line about terns"]), hi.small_docx("fuzzed docx about terns"), b"", b"\x00" * 64]
    ),
)


def _timestamp(seconds: int, nanos: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)


_TIMESTAMPS = st.builds(_timestamp, st.integers(-(2**63), 2**63 - 1), _INT32)


def _pick(draw: Callable[..., Any], hostile: set[str], name: str, valid: Any, bad: Any) -> Any:
    return draw(bad if name in hostile else valid)


def _hostile_fields(draw: Callable[..., Any], names: list[str]) -> set[str]:
    """Which fields of one request are hostile: none (a valid request, so the deep paths run),
    one, or all of them."""
    mode = draw(st.sampled_from(["valid", "one", "one", "all"]))
    if mode == "valid":
        return set()
    if mode == "one":
        return {draw(st.sampled_from(names))}
    return set(names)


_SPEC_FIELDS = [
    "document_id",
    "file_name",
    "media_type",
    "collection",
    "source",
    "title",
    "tags",
    "metadata",
    "password",
    "strategy",
    "size",
    "overlap",
]


@st.composite
def document_specs(draw: Callable[..., Any]) -> ingest_pb2.DocumentSpec:
    bad = _hostile_fields(draw, _SPEC_FIELDS)
    size = _pick(draw, bad, "size", st.sampled_from([0, 0, 16, 64, 200, 254]), _INT32)
    spec = ingest_pb2.DocumentSpec(
        document_id=_pick(
            draw, bad, "document_id", st.one_of(_ID, st.sampled_from(["fuzz-doc-1", "fuzz-doc-2"])), _STRINGS
        ),
        file_name=_pick(draw, bad, "file_name", st.sampled_from(["a.txt", "b.md", "c.html", "notes"]), _STRINGS),
        media_type=_pick(
            draw,
            bad,
            "media_type",
            st.sampled_from(["", "text/plain", "text/markdown"]),
            st.one_of(
                _STRINGS,
                st.sampled_from(["application/pdf", "text/html", hi.MEDIA_DOCX, "image/png", "text/x-unknown"]),
            ),
        ),
        collection=_pick(draw, bad, "collection", st.one_of(st.just(""), _NAME), _STRINGS),
        source=_pick(draw, bad, "source", st.one_of(st.just(""), _LABEL), _STRINGS),
        title=_pick(draw, bad, "title", st.one_of(st.just(""), _LABEL), _STRINGS),
        tags=_pick(draw, bad, "tags", st.lists(_LABEL, max_size=4), st.lists(_STRINGS, max_size=40)),
        metadata=_pick(
            draw,
            bad,
            "metadata",
            st.dictionaries(_LABEL, _LABEL, max_size=4),
            st.dictionaries(_STRINGS, st.one_of(_STRINGS, st.just("v" * 5000)), max_size=70),
        ),
        password=_pick(draw, bad, "password", st.just(""), _STRINGS),
        chunking=ingest_pb2.ChunkingOptions(
            strategy=_pick(draw, bad, "strategy", st.integers(0, 10), _ENUM),
            chunk_size_tokens=size,
            chunk_overlap_tokens=_pick(
                draw, bad, "overlap", st.integers(0, max(0, size - 1)) if 0 <= size < 2**31 else st.just(0), _INT32
            ),
        ),
    )
    return spec


_OPTION_FIELDS = [
    "top_k",
    "mode",
    "fusion",
    "candidates",
    "rrf_k",
    "collection",
    "document_ids",
    "sources",
    "media_types",
    "tags",
    "weights",
    "mmr",
    "min_score",
    "times",
]


@st.composite
def retrieval_options(draw: Callable[..., Any], hostile: bool = True) -> retrieve_pb2.RetrievalOptions:
    bad = _hostile_fields(draw, _OPTION_FIELDS) if hostile else set()
    top_k = _pick(draw, bad, "top_k", st.integers(0, 20), _INT32)
    options = retrieve_pb2.RetrievalOptions(
        top_k=top_k,
        mode=_pick(draw, bad, "mode", st.integers(0, 3), _ENUM),
        fusion=_pick(draw, bad, "fusion", st.integers(0, 2), _ENUM),
        candidates=_pick(draw, bad, "candidates", st.sampled_from([0, 50, 200]), _INT32),
        rrf_k=_pick(draw, bad, "rrf_k", st.sampled_from([0, 1, 60]), _INT32),
        include_parent=draw(st.booleans()),
        collection=_pick(draw, bad, "collection", st.sampled_from(["", "default", "other"]), _STRINGS),
        filter=retrieve_pb2.MetadataFilter(
            document_ids=_pick(
                draw,
                bad,
                "document_ids",
                st.lists(st.sampled_from(["fuzz-doc-0", "fuzz-doc-1", "fuzz-doc-2", "nope"]), max_size=3),
                st.lists(_STRINGS, max_size=6),
            ),
            sources=_pick(
                draw,
                bad,
                "sources",
                st.lists(st.sampled_from(['src "0" \\', "seed1.txt"]), max_size=2),
                st.lists(_STRINGS, max_size=4),
            ),
            media_types=_pick(
                draw,
                bad,
                "media_types",
                st.lists(st.sampled_from(["text/plain", "text/html"]), max_size=2),
                st.lists(_STRINGS, max_size=3),
            ),
            tags=_pick(
                draw,
                bad,
                "tags",
                st.lists(st.sampled_from(["seed", "t1", "t2"]), max_size=2),
                st.lists(_STRINGS, max_size=6),
            ),
        ),
    )
    if "weights" in bad:
        for name in ("dense_weight", "sparse_weight"):
            if draw(st.booleans()):
                setattr(options, name, draw(_FLOATS))
    elif draw(st.booleans()):
        options.dense_weight, options.sparse_weight = draw(st.sampled_from([(0.7, 0.3), (1.0, 0.0), (0.0, 1.0)]))
    if draw(st.booleans()):
        options.mmr_lambda = draw(_FLOATS if "mmr" in bad else st.floats(0.0, 1.0))
    if draw(st.booleans()):
        options.min_score = draw(_FLOATS if "min_score" in bad else st.floats(-1.0, 1.0))
    if draw(st.booleans()):
        options.rerank = draw(st.booleans())
    for name in ("document_time_after", "document_time_before"):
        if draw(st.booleans()):
            stamp = draw(
                _TIMESTAMPS
                if "times" in bad
                else st.builds(_timestamp, st.integers(0, 4_000_000_000), st.integers(0, 999_999_999))
            )
            getattr(options.filter, name).CopyFrom(stamp)
    return options


_QUERIES = st.one_of(_WORDS, _WORDS, _WORDS, _STRINGS, st.sampled_from(["x" * 4097, "   ", "\x00", "é" * 4096]))


class _Fuzzer:
    """Calls the services with sync stubs from a worker thread (the servers run on the test's
    event loop, which stays free while the test awaits the thread)."""

    def __init__(self, stack: Any) -> None:
        self.stack = stack
        self.ingest_channel = grpc.insecure_channel(stack.ingest_address)
        self.query_channel = grpc.insecure_channel(stack.query_address)
        self.ingest = ingest_pb2_grpc.IngestServiceStub(self.ingest_channel)
        self.query = retrieve_pb2_grpc.RetrieveServiceStub(self.query_channel)
        self.outcomes: Counter[str] = Counter()
        self.problems: list[str] = []
        self.calls = 0
        self.slowest = 0.0

    def close(self) -> None:
        self.ingest_channel.close()
        self.query_channel.close()

    def call(
        self, name: str, fn: Callable[[], Any], allowed: frozenset[grpc.StatusCode], describe: Callable[[], str]
    ) -> Any:
        self.calls += 1
        started = time.monotonic()
        try:
            result = fn()
            self.outcomes[f"{name}:OK"] += 1
            return result
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            self.outcomes[f"{name}:{code.name}"] += 1
            problem = refusal_problem(exc, allowed)
            if problem:
                self.problems.append(f"{name}: {problem}\n    request: {describe()[:600]}")
            return None
        finally:
            self.slowest = max(self.slowest, time.monotonic() - started)

    def check_store(self, context: str) -> None:
        report = check_invariants(self.stack.chunks, self.stack.registry)
        if report.problems:
            self.problems.append(f"store invariants after {context}: {report.problems[:5]}")

    def report(self, title: str) -> None:
        print(f"\n=== {title}: {self.calls} calls, slowest {self.slowest:.2f}s ===")
        for key, count in sorted(self.outcomes.items()):
            print(f"  {key:40s} {count}")
        assert not self.problems, "\n".join(self.problems[:20])


_DEADLINE = 60.0
_UPLOAD_CODES = REFUSAL_CODES
_RETRIEVE_CODES = REFUSAL_CODES
_DOCUMENT_CODES = REFUSAL_CODES | {grpc.StatusCode.NOT_FOUND}


def _fuzz_ingest(fuzzer: _Fuzzer, examples: int) -> None:
    @settings(
        max_examples=examples, deadline=None, database=None, derandomize=False, suppress_health_check=list(HealthCheck)
    )
    @given(spec=document_specs(), content=_CONTENT)
    def upload_one(spec: ingest_pb2.DocumentSpec, content: bytes) -> None:
        def request() -> Any:
            def messages():  # type: ignore[no-untyped-def]
                yield ingest_pb2.UploadDocumentRequest(header=spec)
                yield ingest_pb2.UploadDocumentRequest(data=content)

            return fuzzer.ingest.UploadDocument(messages(), timeout=_DEADLINE)

        reply = fuzzer.call("UploadDocument", request, _UPLOAD_CODES, lambda: f"{spec} content={content[:80]!r}")
        if reply is not None and reply.document.state != ingest_pb2.DOCUMENT_STATE_ACTIVE:
            fuzzer.problems.append(f"UploadDocument OK but state {reply.document.state}")
        fuzzer.check_store(f"UploadDocument {spec.document_id!r}")

    @settings(
        max_examples=max(10, examples // 4), deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(specs=st.lists(document_specs(), max_size=4), contents=st.lists(_CONTENT, min_size=4, max_size=4))
    def batch(specs: list[ingest_pb2.DocumentSpec], contents: list[bytes]) -> None:
        pairs = zip(specs, contents, strict=False)
        request = ingest_pb2.IngestDocumentsRequest(
            documents=[ingest_pb2.InlineDocument(spec=spec, content=content) for spec, content in pairs]
        )
        events = fuzzer.call(
            "IngestDocuments",
            lambda: list(fuzzer.ingest.IngestDocuments(request, timeout=_DEADLINE)),
            _UPLOAD_CODES,
            lambda: str(request)[:600],
        )
        if events is not None:
            if not events or not events[-1].HasField("summary"):
                fuzzer.problems.append(f"IngestDocuments stream without a final summary: {events[-1:]}")
            for event in events:
                progress = event.progress
                if (
                    event.HasField("progress")
                    and progress.state == ingest_pb2.DOCUMENT_STATE_FAILED
                    and (progress.error_code not in {c.name for c in REFUSAL_CODES} or not progress.error_message)
                ):
                    fuzzer.problems.append(
                        f"IngestDocuments: document failed with {progress.error_code}: {progress.error_message[:200]}"
                    )
        fuzzer.check_store("IngestDocuments")

    upload_one()
    batch()


def _fuzz_documents(fuzzer: _Fuzzer, examples: int) -> None:
    tokens = st.one_of(
        _STRINGS,
        st.binary(max_size=40).map(lambda b: base64.urlsafe_b64encode(b).decode()),
        st.sampled_from(["ZGVmYXVsdC9mdXp6LWRvYy0x", "=", "====", "%%%"]),
    )

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data(), delete=st.booleans())
    def resources(data: st.DataObject, delete: bool) -> None:
        bad = _hostile_fields(
            data.draw,
            [
                "page_size",
                "page_token",
                "state",
                "source",
                "collection",
                "document_id",
                "paths",
                "tags",
                "metadata",
                "job_id",
            ],
        )
        page_size = _pick(data.draw, bad, "page_size", st.integers(0, 5), _INT32)
        page_token = _pick(data.draw, bad, "page_token", st.sampled_from(["", "ZGVmYXVsdC9mdXp6LWRvYy0x"]), tokens)
        state = _pick(data.draw, bad, "state", st.integers(0, 4), _ENUM)
        source = _pick(data.draw, bad, "source", st.sampled_from(["", "seed1.txt"]), _STRINGS)
        collection = _pick(data.draw, bad, "collection", st.sampled_from(["", "default"]), _STRINGS)
        document_id = _pick(
            data.draw, bad, "document_id", st.sampled_from(["fuzz-doc-0", "fuzz-doc-1", "fuzz-doc-2"]), _STRINGS
        )
        paths = _pick(
            data.draw,
            bad,
            "paths",
            st.lists(st.sampled_from(["title", "tags", "metadata"]), min_size=1, max_size=3, unique=True),
            st.lists(st.one_of(st.sampled_from(["title", "tags", "content", "state"]), _STRINGS), max_size=4),
        )
        tags = _pick(data.draw, bad, "tags", st.lists(_LABEL, max_size=3), st.lists(_STRINGS, max_size=40))
        metadata = _pick(
            data.draw,
            bad,
            "metadata",
            st.dictionaries(_LABEL, _LABEL, max_size=3),
            st.dictionaries(_STRINGS, _STRINGS, max_size=70),
        )
        job_id = _pick(data.draw, bad, "job_id", st.just("0" * 32), _STRINGS)
        listing = ingest_pb2.ListDocumentsRequest(
            page_size=page_size, page_token=page_token, state=state, source=source, collection=collection
        )
        fuzzer.call(
            "ListDocuments",
            lambda: fuzzer.ingest.ListDocuments(listing, timeout=_DEADLINE),
            REFUSAL_CODES,
            lambda: str(listing),
        )
        fuzzer.call(
            "GetDocument",
            lambda: fuzzer.ingest.GetDocument(
                ingest_pb2.GetDocumentRequest(document_id=document_id), timeout=_DEADLINE
            ),
            _DOCUMENT_CODES,
            lambda: document_id,
        )
        update = ingest_pb2.UpdateDocumentRequest(
            document=ingest_pb2.Document(document_id=document_id, title=source, tags=tags, metadata=metadata),
            update_mask=field_mask_pb2.FieldMask(paths=paths),
        )
        fuzzer.call(
            "UpdateDocument",
            lambda: fuzzer.ingest.UpdateDocument(update, timeout=_DEADLINE),
            _DOCUMENT_CODES,
            lambda: str(update),
        )
        fuzzer.call(
            "GetIngestJob",
            lambda: fuzzer.ingest.GetIngestJob(ingest_pb2.GetIngestJobRequest(job_id=job_id), timeout=_DEADLINE),
            _DOCUMENT_CODES,
            lambda: job_id,
        )
        if delete:
            fuzzer.call(
                "DeleteDocument",
                lambda: fuzzer.ingest.DeleteDocument(
                    ingest_pb2.DeleteDocumentRequest(document_id=document_id), timeout=_DEADLINE
                ),
                _DOCUMENT_CODES,
                lambda: document_id,
            )
        fuzzer.check_store("document resource calls")

    resources()


def _fuzz_queries(fuzzer: _Fuzzer, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(query=_QUERIES, options=retrieval_options())
    def retrieve_one(query: str, options: retrieve_pb2.RetrievalOptions) -> None:
        request = retrieve_pb2.RetrieveRequest(query=query, options=options)
        responses = fuzzer.call(
            "Retrieve",
            lambda: list(fuzzer.query.Retrieve(request, timeout=_DEADLINE)),
            _RETRIEVE_CODES,
            lambda: str(request),
        )
        if responses is not None and (not responses or not responses[-1].HasField("summary")):
            fuzzer.problems.append(f"Retrieve OK without a final summary: {request}")

    @settings(
        max_examples=max(10, examples // 3), deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(data=st.data())
    def ask_one(data: st.DataObject) -> None:
        part = data.draw(st.sampled_from(["none", "none", "query", "options", "ask"]))
        query = data.draw(_QUERIES if part == "query" else _WORDS)
        options = data.draw(retrieval_options(hostile=part == "options"))
        bad = (
            _hostile_fields(data.draw, ["template", "budget", "answer_tokens", "history", "temperature"])
            if part == "ask"
            else set()
        )
        request = retrieve_pb2.AskRequest(
            query=query,
            options=options,
            template=_pick(
                data.draw,
                bad,
                "template",
                st.sampled_from(["", "default", "analytical", "conversational", "creative"]),
                _STRINGS,
            ),
            token_budget=_pick(data.draw, bad, "budget", st.sampled_from([0, 300, 4000]), _INT32),
            max_answer_tokens=_pick(data.draw, bad, "answer_tokens", st.sampled_from([0, 1, 64, 512]), _INT32),
            history=[
                retrieve_pb2.ConversationTurn(role=role, content=content)
                for role, content in _pick(
                    data.draw,
                    bad,
                    "history",
                    st.lists(st.tuples(st.integers(1, 2), _WORDS), max_size=3),
                    st.lists(st.tuples(_ENUM, _STRINGS), max_size=3),
                )
            ],
        )
        if data.draw(st.booleans()):
            request.temperature = _pick(data.draw, bad, "temperature", st.floats(0.0, 2.0), _FLOATS)
        events = fuzzer.call(
            "Ask", lambda: list(fuzzer.query.Ask(request, timeout=_DEADLINE)), _RETRIEVE_CODES, lambda: str(request)
        )
        if events is not None and (not events or not events[-1].HasField("final")):
            fuzzer.problems.append(f"Ask OK without a final event: {request}")

    retrieve_one()
    ask_one()


def _long_echo_checks(fuzzer: _Fuzzer) -> None:
    """Requests whose error messages could echo a huge value back: the status travels in trailing
    metadata (8 KiB on clients by default), so an unbounded echo turns a clean refusal into a
    client-side RESOURCE_EXHAUSTED without details (found by the long fuzzing run)."""
    huge = ["x" * 5000, "🦆" * 3000, "é" * 6000]
    for value in huge:
        update = ingest_pb2.UpdateDocumentRequest(
            document=ingest_pb2.Document(document_id="fuzz-doc-1"),
            update_mask=field_mask_pb2.FieldMask(paths=["state", value]),
        )
        fuzzer.call(
            "UpdateDocument",
            lambda u=update: fuzzer.ingest.UpdateDocument(u, timeout=_DEADLINE),
            _DOCUMENT_CODES,
            lambda: "update_mask with a huge path",
        )

        def upload_with(media_type: str) -> Any:
            def messages():  # type: ignore[no-untyped-def]
                yield ingest_pb2.UploadDocumentRequest(
                    header=ingest_pb2.DocumentSpec(file_name="a.bin", media_type=media_type)
                )
                yield ingest_pb2.UploadDocumentRequest(data=b"some words")

            return fuzzer.ingest.UploadDocument(messages(), timeout=_DEADLINE)

        fuzzer.call(
            "UploadDocument", lambda v=value: upload_with("application/" + v), _UPLOAD_CODES, lambda: "huge media type"
        )
        request = retrieve_pb2.RetrieveRequest(
            query="grebes",
            options=retrieve_pb2.RetrievalOptions(
                filter=retrieve_pb2.MetadataFilter(tags=[value], sources=[value], document_ids=[value])
            ),
        )
        fuzzer.call(
            "Retrieve",
            lambda r=request: list(fuzzer.query.Retrieve(r, timeout=_DEADLINE)),
            _RETRIEVE_CODES,
            lambda: "huge filter values",
        )


async def _seed_documents(stack: Any) -> None:
    async with grpc.aio.insecure_channel(stack.ingest_address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        for index, text in enumerate(
            [
                "Grebes dive for fish in deep lakes.",
                "Coots eat weeds near the reeds.",
                "Terns fly long distances over the sea.",
            ]
        ):
            spec = ingest_pb2.DocumentSpec(
                file_name=f"seed{index}.txt",
                document_id=f"fuzz-doc-{index}",
                tags=["seed", f"t{index}"],
                source=f'src "{index}" \\',
            )
            await _upload_async(stub, spec, text.encode() * 5, 60)


async def _fuzz(fake_stack: Any, ingest_examples: int, document_examples: int, query_examples: int) -> None:
    await _seed_documents(fake_stack)
    fuzzer = _Fuzzer(fake_stack)
    started = time.monotonic()
    try:
        await asyncio.to_thread(_long_echo_checks, fuzzer)
        await asyncio.to_thread(_fuzz_ingest, fuzzer, ingest_examples)
        await asyncio.to_thread(_fuzz_documents, fuzzer, document_examples)
        await asyncio.to_thread(_fuzz_queries, fuzzer, query_examples)
    finally:
        fuzzer.close()
    print(f"\nfuzzing took {time.monotonic() - started:.1f}s")
    await _assert_serving(fake_stack.ingest_address)
    await _assert_serving(fake_stack.query_address)
    fuzzer.report("hypothesis fuzzing of request fields (outcomes by RPC and code)")


async def test_fuzz_request_fields(fake_stack) -> None:  # type: ignore[no-untyped-def]
    await _fuzz(fake_stack, ingest_examples=60, document_examples=40, query_examples=80)


@pytest.mark.reliability
@pytest.mark.timeout(1800)
async def test_fuzz_request_fields_long(fake_stack) -> None:  # type: ignore[no-untyped-def]
    await _fuzz(fake_stack, ingest_examples=1500, document_examples=800, query_examples=2000)


# --- the real stack: a sample -----------------------------------------------------------------------

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
def test_real_stack_sample(shared_real_stack: RealStack, generated: list[hi.HostileInput]) -> None:
    """A sample of the corpus and of the hostile inputs against the real processes: the same
    outcomes, nothing of a refused document retrievable or stored in Milvus, services SERVING,
    and the ingest service's RSS after the bombs."""
    stack = shared_real_stack
    corpus = {c.relative: c for c in hi.corpus_files()}
    by_name = {h.name: h for h in generated}
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
    items += _hostile_items([by_name[n] for n in _REAL_HOSTILE if n in by_name])
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
    report = check_invariants(stores.chunks, stores.registry)
    print(f"Milvus after the sample: {report.summary()}")
    assert health(stack.ingest.address) == "SERVING" and health(stack.query.address) == "SERVING"
    assert not problems, "\n".join(problems)
    assert not report.problems, report.problems
