"""The registry: format sniffing, refusal of unsupported formats, the mapping of any parser
failure to an input error, and a run over every shared eval document (each must extract or
raise a RagrpcError, within a time limit)."""

from __future__ import annotations

import io
import json
import time
import zipfile
from pathlib import Path

import pytest

from ingest_service.clean import clean_blocks
from ingest_service.extract import SUPPORTED_MEDIA_TYPES, ExtractorRegistry, build_default_registry, sniff_media_type
from ingest_service.extract.base import MEDIA_DOCX, MEDIA_HTML, MEDIA_MARKDOWN, MEDIA_PDF, MEDIA_TEXT
from ragrpc.errors import (
    DocumentParseError,
    LimitExceededError,
    PasswordError,
    RagrpcError,
    UnsupportedMediaTypeError,
)
from ragrpc.models import ExtractedDocument

DOCS = Path(__file__).resolve().parents[2].parent / "shared" / "eval" / "docs"
needs_docs = pytest.mark.skipif(not DOCS.is_dir(), reason="shared eval docs not present")
PER_FILE_SECONDS = 60
# Files that really hold no text at all (only images / empty tables): an empty result is right.
NO_TEXT_AT_ALL = {"python-docx__having-images.docx", "python-docx__tbl-having-tables.docx"}


def _passwords() -> dict[str, str]:
    if not (DOCS / "inventory.jsonl").is_file():
        return {}
    rows = [json.loads(line) for line in (DOCS / "inventory.jsonl").read_text().splitlines() if line.strip()]
    return {Path(r["file"]).name: r.get("password") or "" for r in rows}


def _all_documents() -> list[Path]:
    folders = ("pdf", "docx", "html", "markdown", "other")
    return sorted(p for folder in folders if (DOCS / folder).is_dir() for p in (DOCS / folder).iterdir())


@pytest.fixture(scope="module")
def registry():
    return build_default_registry()


def _docx_bytes(extra_entries: dict[str, bytes] | None = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, payload in (extra_entries or {"word/document.xml": b"<w:document/>"}).items():
            archive.writestr(name, payload)
    return out.getvalue()


def test_sniffing_beats_name_and_media_type(registry) -> None:
    assert registry.resolve(b"%PDF-1.4 ...", file_name="x.txt", media_type="text/plain") == MEDIA_PDF
    assert registry.resolve(_docx_bytes(), file_name="upload.bin", media_type="application/octet-stream") == MEDIA_DOCX
    html = b"\xef\xbb\xbf  <!DOCTYPE html><html><body>x</body></html>"
    assert registry.resolve(html, file_name="page.txt") == MEDIA_HTML
    assert registry.resolve("<html><body>hi</body></html>".encode("utf-16"), file_name="") == MEDIA_HTML
    assert registry.resolve(b"# Title\n\ntext", file_name="README.md") == MEDIA_MARKDOWN
    assert registry.resolve(b"# Title\n\ntext", media_type="text/markdown; charset=utf-8") == MEDIA_MARKDOWN
    assert registry.resolve(b"<p align=center>logo</p>\n# Title", file_name="README.md") == MEDIA_MARKDOWN
    assert registry.resolve(b"just words") == MEDIA_TEXT
    assert registry.resolve(b"# Notes\n\nFiles start with `%PDF-1.7`.", file_name="n.md") == MEDIA_MARKDOWN
    assert registry.resolve(b"junk\r\n%PDF-1.4\n...\n%%EOF\n") == MEDIA_PDF


@pytest.mark.parametrize(
    ("entries", "what"),
    [
        ({"ppt/presentation.xml": b"x"}, "PowerPoint"),
        ({"xl/workbook.xml": b"x"}, "Excel"),
        ({"other.txt": b"x"}, "zip archive"),
    ],
)
def test_office_zips_that_are_not_docx_are_refused(registry, entries: dict[str, bytes], what: str) -> None:
    data = _docx_bytes({"[Content_Types].xml": b"<Types/>", **entries})
    with pytest.raises(UnsupportedMediaTypeError, match=what) as caught:
        registry.extract(data, file_name="looks.docx", media_type=MEDIA_DOCX)
    for media_type in SUPPORTED_MEDIA_TYPES:
        assert media_type in caught.value.message


def test_binary_and_unknown_types_are_refused(registry) -> None:
    with pytest.raises(UnsupportedMediaTypeError, match="PNG"):
        registry.extract(b"\x89PNG\r\n\x1a\n" + bytes(100), file_name="a.pdf")
    with pytest.raises(UnsupportedMediaTypeError, match="application/zip"):
        registry.extract(b"some bytes", media_type="application/zip")
    assert sniff_media_type(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1rest")[1].startswith("a legacy Office")


def test_empty_and_damaged_inputs(registry) -> None:
    with pytest.raises(DocumentParseError, match="empty"):
        registry.extract(b"", file_name="a.pdf")
    with pytest.raises(DocumentParseError):
        registry.extract(b"PK\x03\x04 damaged", file_name="a.docx")
    with pytest.raises(DocumentParseError):
        registry.extract(b"not a pdf", media_type="application/pdf")


@needs_docs
def test_every_shared_document_extracts_or_raises_a_ragrpc_error(registry) -> None:
    passwords = _passwords()
    documents = _all_documents()
    assert len(documents) >= 90
    outcomes: dict[str, str] = {}
    for path in documents:
        started = time.monotonic()
        try:
            result = registry.extract(path.read_bytes(), file_name=path.name, password=passwords.get(path.name, ""))
        except RagrpcError as exc:
            outcomes[path.name] = type(exc).__name__
        else:
            assert isinstance(result, ExtractedDocument), path.name
            assert result.media_type in SUPPORTED_MEDIA_TYPES, path.name
            blocks = clean_blocks(result.blocks)
            has_text = any(b.text.strip() for b in blocks)
            assert has_text or result.pages_without_text or path.name in NO_TEXT_AT_ALL, path.name
            outcomes[path.name] = "ok"
        elapsed = time.monotonic() - started
        assert elapsed < PER_FILE_SECONDS, f"{path.name} took {elapsed:.1f} s"
    assert outcomes["pdfplumber__empty.pdf"] == "DocumentParseError"
    assert outcomes["docling__Strict.docx"] == "DocumentParseError"
    assert outcomes["docling__powerpoint_sample.pptx"] == "UnsupportedMediaTypeError"
    assert outcomes["docling__xlsx_01.xlsx"] == "UnsupportedMediaTypeError"
    assert outcomes["docling__csv-comma.csv"] == "ok"
    assert sum(1 for v in outcomes.values() if v == "ok") >= len(documents) - 4


class _FailingExtractor:
    """A text/plain extractor that raises what it is given, as a broken parser would."""

    media_types: tuple[str, ...] = (MEDIA_TEXT,)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def extract(self, data: bytes, *, password: str = "") -> ExtractedDocument:
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bad value"),
        KeyError("word/document.xml"),
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
        zipfile.BadZipFile("File is not a zip file"),
        RecursionError("maximum recursion depth exceeded"),
        AssertionError(),
    ],
    ids=lambda e: type(e).__name__,
)
def test_any_parser_failure_is_an_input_error_naming_the_file(error: Exception) -> None:
    registry = ExtractorRegistry([_FailingExtractor(error)])
    with pytest.raises(DocumentParseError) as caught:
        registry.extract(b"plain words", file_name="notes.txt")
    assert caught.value.reason == "DOCUMENT_UNREADABLE"
    assert "'notes.txt'" in caught.value.message and type(error).__name__ in caught.value.message
    assert caught.value.metadata["file_name"] == "notes.txt"
    assert caught.value.__cause__ is error


def test_parser_messages_are_cut_and_unnamed_files_still_read_well() -> None:
    registry = ExtractorRegistry([_FailingExtractor(ValueError("x" * 5000))])
    with pytest.raises(DocumentParseError, match="cannot read the document as text") as caught:
        registry.extract(b"plain words")
    assert len(caught.value.message) < 500


def test_extractor_errors_keep_their_class_and_gain_the_file_name() -> None:
    original = DocumentParseError("cannot read the PDF: PSEOF: Unexpected EOF", metadata={"page": "3"})
    with pytest.raises(DocumentParseError, match="^'a.txt': cannot read the PDF") as caught:
        ExtractorRegistry([_FailingExtractor(original)]).extract(b"words", file_name="a.txt")
    assert caught.value.__cause__ is original and caught.value.metadata["page"] == "3"
    with pytest.raises(DocumentParseError) as unnamed:
        ExtractorRegistry([_FailingExtractor(original)]).extract(b"words")
    assert unnamed.value is original
    for passing in (PasswordError("wrong password"), LimitExceededError("too many pages")):
        with pytest.raises(type(passing)) as same:
            ExtractorRegistry([_FailingExtractor(passing)]).extract(b"words", file_name="a.txt")
        assert same.value is passing


@pytest.mark.parametrize("fault", [MemoryError(), ModuleNotFoundError("No module named 'lxml'")], ids=repr)
def test_faults_of_the_service_are_not_blamed_on_the_file(fault: BaseException) -> None:
    with pytest.raises(type(fault)):
        ExtractorRegistry([_FailingExtractor(fault)]).extract(b"words", file_name="a.txt")
