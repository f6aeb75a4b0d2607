"""Every real document of ../shared/eval/docs/{pdf,docx,html,markdown,other} through the gRPC
ingest service (UploadDocument) of `fake_stack`: the real extraction, cleaning, chunking and
pipeline, over the hashing embedder and the in-memory stores.

Each file ends ACTIVE (with its chunks stored), or is refused with INVALID_ARGUMENT /
RESOURCE_EXHAUSTED and a message that names the problem, leaving no chunk behind and the
registry saying FAILED with that message. Encrypted PDFs sent with the password recorded in
inventory.jsonl end ACTIVE (without it: a refusal that asks for the password). Scanned PDFs
(no text layer on any page) are refused with a message that says so and GetDocument lists
their pages without text. The services stay SERVING throughout.

tests/reliability/test_hostile_inputs.py covers the corpus too, but leaves out the 8 slowest
PDFs outside `--run-reliability` and does not check what refusal messages say nor
pages_without_text; this test sends every file.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ragrpc.store import filters as f
from ragrpc.store import schema as s
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc
from tests.conftest import SHARED_EVAL

DOCS = SHARED_EVAL / "docs"
KINDS = ("pdf", "docx", "html", "markdown", "other")
REFUSAL_CODES = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
# A refusal message must say what is wrong in words a person can act on.
ACTIONABLE = re.compile(
    r"password|encrypted|no text|no extractable text|not supported|unsupported|cannot read|cannot be read"
    r"|cannot parse|is empty|scanned|\bOCR\b|limit|damaged|not a valid|decompression bomb",
    re.IGNORECASE,
)
# Files that nothing could turn into text (no text layer, 0 bytes, formats not supported).
MUST_REFUSE = {
    "pdf/pdfplumber__empty.pdf",
    "pdf/docling__ocr_test.pdf",
    "pdf/docling__ocr_test_rotated_90.pdf",
    "pdf/docling__nemotron_multipage.pdf",
    "docx/docling__Strict.docx",
    "other/docling__powerpoint_sample.pptx",
    "other/docling__xlsx_01.xlsx",
}
_NO_TEXT_PAGES = re.compile(r"no text layer on \d+ page\(s\) \(([\d, ]+)\)")
CALL_TIMEOUT_S = 300.0  # 2 shared cores: the 65-page PDF takes a while; a hang is far beyond this
PIECE = 1 << 20

pytestmark = pytest.mark.skipif(not DOCS.is_dir(), reason=f"the shared corpus {DOCS} is missing")


@dataclass
class CorpusFile:
    path: Path
    relative: str  # "pdf/pypdf__encrypted-file.pdf"
    facts: dict[str, Any]  # its inventory.jsonl row ({} when not listed)

    @property
    def document_id(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]", "-", self.relative.replace("/", "-"))[:128]

    @property
    def password(self) -> str:
        return str(self.facts.get("password") or "")

    @property
    def scanned(self) -> bool:
        """A PDF without a text layer on any page (inventory: every page without text)."""
        pages = int(self.facts.get("pages") or 0)
        return pages > 0 and int(self.facts.get("pages_without_text") or 0) == pages


@dataclass
class Outcome:
    file: CorpusFile
    state: str = ""  # ACTIVE or the status code name
    message: str = ""
    chunks: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


def corpus() -> list[CorpusFile]:
    inventory_path = DOCS / "inventory.jsonl"
    rows = [json.loads(line) for line in inventory_path.read_text().splitlines() if line.strip()]
    inventory = {row["file"]: row for row in rows}
    return [
        CorpusFile(path, f"{kind}/{path.name}", inventory.get(f"{kind}/{path.name}", {}))
        for kind in KINDS
        for path in sorted((DOCS / kind).iterdir())
        if path.is_file()
    ]


async def upload(
    stub: ingest_pb2_grpc.IngestServiceStub, spec: ingest_pb2.DocumentSpec, content: bytes
) -> ingest_pb2.UploadDocumentResponse:
    async def messages():  # type: ignore[no-untyped-def]
        yield ingest_pb2.UploadDocumentRequest(header=spec)
        for start in range(0, len(content), PIECE):
            yield ingest_pb2.UploadDocumentRequest(data=content[start : start + PIECE])

    return await stub.UploadDocument(messages(), timeout=CALL_TIMEOUT_S)


def stored_chunks(stack: Any, document_id: str) -> int:
    return int(stack.chunks.count_chunks(f.eq(s.DOCUMENT_ID, document_id)))


async def serving(address: str) -> bool:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


async def ingest_one(stack: Any, stub: ingest_pb2_grpc.IngestServiceStub, item: CorpusFile) -> Outcome:
    outcome = Outcome(item)
    spec = ingest_pb2.DocumentSpec(
        file_name=item.path.name, document_id=item.document_id, password=item.password, tags=["corpus"]
    )
    started = time.monotonic()
    try:
        reply = await upload(stub, spec, item.path.read_bytes())
    except grpc.aio.AioRpcError as exc:
        outcome.seconds = time.monotonic() - started
        outcome.state, outcome.message = exc.code().name, exc.details() or ""
        await check_refusal(stack, stub, outcome, exc.code())
        return outcome
    outcome.seconds = time.monotonic() - started
    outcome.state = ingest_pb2.DocumentState.Name(reply.document.state).removeprefix("DOCUMENT_STATE_")
    outcome.chunks = reply.document.chunk_count
    stored = stored_chunks(stack, item.document_id)
    if reply.document.state != ingest_pb2.DOCUMENT_STATE_ACTIVE or outcome.chunks <= 0:
        outcome.problems.append(f"answered OK with {outcome.state} and {outcome.chunks} chunks")
    if stored < outcome.chunks:  # PARENT chunks (context only) may come on top of the counted ones
        outcome.problems.append(f"chunk_count {outcome.chunks} but {stored} chunks stored")
    if item.relative in MUST_REFUSE:
        outcome.problems.append("expected a refusal")
    return outcome


async def check_refusal(
    stack: Any, stub: ingest_pb2_grpc.IngestServiceStub, outcome: Outcome, code: grpc.StatusCode
) -> None:
    item = outcome.file
    if code not in REFUSAL_CODES:
        outcome.problems.append(f"{code.name} is not a refusal: {outcome.message[:200]}")
    if not ACTIONABLE.search(outcome.message):
        outcome.problems.append(f"the message does not name the problem: {outcome.message!r}")
    if item.facts.get("encrypted"):
        outcome.problems.append(f"encrypted PDF not opened with its recorded password {item.password!r}")
    leftover = stored_chunks(stack, item.document_id)
    if leftover:
        outcome.problems.append(f"{leftover} chunk(s) left after the refusal")
    try:
        document = (
            await stub.GetDocument(ingest_pb2.GetDocumentRequest(document_id=item.document_id), timeout=30)
        ).document
    except grpc.aio.AioRpcError as exc:  # refused before it was registered (e.g. empty upload)
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            outcome.problems.append(f"GetDocument after the refusal: {exc.code().name}")
        return
    if document.state != ingest_pb2.DOCUMENT_STATE_FAILED or document.error_message != outcome.message:
        outcome.problems.append(f"GetDocument says {document.state} / {document.error_message[:100]!r}")
    named = _NO_TEXT_PAGES.search(outcome.message)  # "no text layer on 2 page(s) (1, 3)"
    if item.scanned and not named:
        outcome.problems.append(f"a scanned PDF refused without saying so: {outcome.message!r}")
    if named:
        expected = [int(p) for p in named.group(1).split(",")]
        if item.scanned and expected != list(range(1, int(item.facts["pages"]) + 1)):
            outcome.problems.append(f"the message names pages {expected}, the PDF has {item.facts['pages']}")
        if list(document.pages_without_text) != expected:
            outcome.problems.append(
                f"GetDocument pages_without_text {list(document.pages_without_text)}, expected {expected}"
            )


def print_table(outcomes: list[Outcome], seconds: float) -> None:
    print(f"\n{'file':58} {'bytes':>8} {'outcome':18} {'chunks':>6} {'s':>6}  message")
    for o in outcomes:
        size = o.file.path.stat().st_size
        print(f"{o.file.relative[:58]:58} {size:>8} {o.state:18} {o.chunks:>6} {o.seconds:>6.1f}  {o.message[:90]}")
    active = sum(o.state == "ACTIVE" for o in outcomes)
    print(f"{len(outcomes)} files in {seconds:.0f}s: {active} ACTIVE, {len(outcomes) - active} refused")


@pytest.mark.slow  # minutes on 2 cores: 98 files, the 65-page and 24-page PDFs included
@pytest.mark.timeout(1800)
async def test_every_shared_document_through_upload(fake_stack) -> None:  # type: ignore[no-untyped-def]
    files = corpus()
    assert len(files) >= 98, f"only {len(files)} files in {DOCS}"
    started = time.monotonic()
    async with grpc.aio.insecure_channel(fake_stack.ingest_address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        outcomes = [await ingest_one(fake_stack, stub, item) for item in files]
        assert await serving(fake_stack.ingest_address) and await serving(fake_stack.query_address)
    print_table(outcomes, time.monotonic() - started)
    encrypted = [o for o in outcomes if o.file.facts.get("encrypted")]
    assert len(encrypted) >= 8 and all(o.state == "ACTIVE" for o in encrypted)
    assert {o.file.relative for o in outcomes if o.state != "ACTIVE"} >= MUST_REFUSE
    problems = [f"{o.file.relative}: {p}" for o in outcomes for p in o.problems]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("password", "expected"), [("", "password"), ("not-the-password", "wrong password")])
async def test_an_encrypted_pdf_without_its_password_is_refused_clearly(  # type: ignore[no-untyped-def]
    fake_stack, password: str, expected: str
) -> None:
    path = DOCS / "pdf" / "pdfplumber__password-example.pdf"
    spec = ingest_pb2.DocumentSpec(file_name=path.name, document_id="locked", password=password)
    async with grpc.aio.insecure_channel(fake_stack.ingest_address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await upload(stub, spec, path.read_bytes())
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert expected in (caught.value.details() or "")
        document = (await stub.GetDocument(ingest_pb2.GetDocumentRequest(document_id="locked"), timeout=30)).document
        assert document.state == ingest_pb2.DOCUMENT_STATE_FAILED
        # the right password afterwards: the same document becomes ACTIVE
        reply = await upload(
            stub, ingest_pb2.DocumentSpec(file_name=path.name, document_id="locked", password="test"), path.read_bytes()
        )
        assert reply.document.state == ingest_pb2.DOCUMENT_STATE_ACTIVE and reply.document.chunk_count > 0
    assert stored_chunks(fake_stack, "locked") >= reply.document.chunk_count
    assert await serving(fake_stack.ingest_address)
