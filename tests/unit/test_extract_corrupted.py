"""Corrupted real documents through the extractor registry: whatever hypothesis does to the
bytes of a shared document (bit flips, overwritten runs, truncation; for DOCX also inside
word/document.xml), the registry answers with an ExtractedDocument or an input error that
names the file, never with another exception (which the pipeline would report as INTERNAL).

LimitExceededError (RESOURCE_EXHAUSTED) is also a clean refusal: a flipped size field can
make a DOCX look like a decompression bomb.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest_service.extract import ExtractorRegistry, build_default_registry
from ingest_service.extract.pdf import PdfExtractor
from ragrpc.errors import DocumentParseError, InvalidInputError, LimitExceededError
from ragrpc.models import ExtractedDocument
from tests.conftest import SHARED_EVAL

DOCS = SHARED_EVAL / "docs"
EXAMPLES = 25
# Small files of each format, so 25 examples of each stay within seconds.
SAMPLES = (
    "pdf/pypdf__crazyones.pdf",
    "pdf/docling__invisible_text_layer.pdf",
    "docx/docling__lorem_ipsum.docx",
    "html/docling__table_06.html",
    "markdown/docling__mixed.md",
    "other/docling__csv-comma.csv",
)
REFUSALS = (InvalidInputError, LimitExceededError)
needs_docs = pytest.mark.skipif(not DOCS.is_dir(), reason=f"shared eval docs not present at {DOCS}")
fuzz_settings = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples on every run; the reliability suite explores further
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def registry() -> ExtractorRegistry:
    return build_default_registry()


@st.composite
def damaged(draw: st.DrawFn, data: bytes) -> bytes:
    """data with a few bytes flipped, maybe a run overwritten, maybe cut short."""
    buffer = bytearray(data)
    flips = draw(st.lists(st.tuples(st.integers(0, len(buffer) - 1), st.integers(1, 255)), max_size=24))
    for position, mask in flips:
        buffer[position] ^= mask
    if draw(st.booleans()):
        start = draw(st.integers(0, len(buffer) - 1))
        run = draw(st.binary(min_size=1, max_size=256))
        buffer[start : start + len(run)] = run
    if draw(st.booleans()):
        del buffer[draw(st.integers(0, len(buffer))) :]
    return bytes(buffer)


def _rezip(original: bytes, member: str, payload: bytes) -> bytes:
    """The same archive with one member's (uncompressed) content replaced."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(original)) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            target.writestr(info.filename, payload if info.filename == member else source.read(info.filename))
    return out.getvalue()


def _check(registry: ExtractorRegistry, data: bytes, file_name: str) -> str:
    """Extract; the outcome's class name. Fails on anything but a document or a refusal."""
    try:
        result = registry.extract(data, file_name=file_name)
    except REFUSALS as exc:
        assert exc.message, f"{type(exc).__name__} without a message"
        if isinstance(exc, DocumentParseError):
            assert repr(file_name) in exc.message, exc.message
        return type(exc).__name__
    assert isinstance(result, ExtractedDocument)
    return "ok"


@needs_docs
@pytest.mark.parametrize("relative", SAMPLES)
def test_damaged_bytes_are_refused_as_input_errors(registry: ExtractorRegistry, relative: str) -> None:
    path = DOCS / relative
    original = path.read_bytes()
    assert _check(registry, original, path.name) == "ok"  # the undamaged file extracts
    outcomes: list[str] = []

    @fuzz_settings
    @given(data=damaged(original))
    def one(data: bytes) -> None:
        outcomes.append(_check(registry, data, path.name))

    one()
    assert len(outcomes) >= EXAMPLES // 2


@needs_docs
@pytest.mark.parametrize("member", ["word/document.xml", "word/styles.xml", "docProps/core.xml"])
def test_damaged_docx_parts_are_refused_as_input_errors(registry: ExtractorRegistry, member: str) -> None:
    """Valid zips whose XML is damaged: reaches python-docx and lxml, not only zipfile."""
    path = DOCS / "docx" / "docling__lorem_ipsum.docx"
    original = path.read_bytes()
    with zipfile.ZipFile(io.BytesIO(original)) as archive:
        if member not in archive.namelist():
            pytest.skip(f"{path.name} has no {member}")
        xml = archive.read(member)
    outcomes: list[str] = []

    @fuzz_settings
    @given(part=damaged(xml))
    def one(part: bytes) -> None:
        outcomes.append(_check(registry, _rezip(original, member, part), path.name))

    one()
    assert len(outcomes) >= EXAMPLES // 2


def test_flipped_pdf_that_breaks_on_close_is_an_input_error(registry: ExtractorRegistry) -> None:
    """pdfplumber's close() walks the page tree again: a broken one must not escape from there."""
    pdf = _minimal_pdf_with_bad_mediabox()
    with pytest.raises(DocumentParseError, match="'bad.pdf'") as caught:
        registry.extract(pdf, file_name="bad.pdf")
    assert caught.value.reason == "DOCUMENT_UNREADABLE"
    assert caught.value.__cause__ is not None


def test_pdf_extractor_keeps_its_own_diagnosis_when_close_fails() -> None:
    with pytest.raises(DocumentParseError, match="cannot read the PDF pages"):
        PdfExtractor().extract(_minimal_pdf_with_bad_mediabox())


def _minimal_pdf_with_bad_mediabox() -> bytes:
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 /x 612 792] >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def test_sample_files_are_small() -> None:
    """The fuzzed samples stay small, so the examples above stay fast on two cores."""
    if not DOCS.is_dir():
        pytest.skip("shared eval docs not present")
    for relative in SAMPLES:
        assert Path(DOCS / relative).stat().st_size < 64 * 1024, relative
