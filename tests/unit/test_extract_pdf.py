"""PdfExtractor on the real PDFs in ../shared/eval/docs/pdf (pdfplumber, no mocks)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pdfplumber
import pytest

from ingest_service.extract.base import ExtractionLimits
from ingest_service.extract.pdf import PdfExtractor, join_lines, pdf_date_to_iso
from ragrpc.errors import DocumentParseError, LimitExceededError, PasswordError
from ragrpc.models import BlockKind, ExtractedDocument

DOCS = Path(__file__).resolve().parents[2].parent / "shared" / "eval" / "docs"
PDF = DOCS / "pdf"
pytestmark = pytest.mark.skipif(not PDF.is_dir(), reason="shared eval docs not present")


def _inventory() -> dict[str, dict]:
    if not (DOCS / "inventory.jsonl").is_file():
        return {}
    rows = (json.loads(line) for line in (DOCS / "inventory.jsonl").read_text().splitlines() if line.strip())
    return {Path(r["file"]).name: r for r in rows if r["file"].startswith("pdf/")}


ENCRYPTED = sorted((name, row["password"]) for name, row in _inventory().items() if row.get("encrypted"))


@pytest.fixture(scope="module")
def extractor() -> PdfExtractor:
    return PdfExtractor()


@pytest.fixture(scope="module")
def supreme_court(extractor: PdfExtractor) -> ExtractedDocument:
    """Encrypted with an empty user password; shared by two tests (it is slow to parse)."""
    return extractor.extract((PDF / "llamadatasets__598us1r3_j4ek.pdf").read_bytes())


@pytest.fixture(scope="module")
def federal_register(extractor: PdfExtractor) -> ExtractedDocument:
    return extractor.extract((PDF / "pdfplumber__federal-register-2020-17221.pdf").read_bytes())


def _page_text(doc: ExtractedDocument, page: int) -> str:
    return "\n".join(b.text for b in doc.blocks if b.page == page)


def test_nics_table_is_one_markdown_table_with_header_and_state_rows(extractor: PdfExtractor) -> None:
    doc = extractor.extract((PDF / "pdfplumber__nics-background-checks-2015-11.pdf").read_bytes())
    tables = [b for b in doc.blocks if b.kind is BlockKind.TABLE]
    assert len(tables) == 1
    table = tables[0]
    lines = table.text.split("\n")
    header, separator = lines[0], lines[1]
    assert "State / Territory" in header and "Permit" in header and "Totals" in header
    assert re.fullmatch(r"\|( --- \|)+", separator)
    assert table.table_header == header + "\n" + separator
    alabama = [line for line in lines if line.startswith("| Alabama |")]
    assert len(alabama) == 1  # the state is one table line, its numbers on it
    assert "18,870" in alabama[0] and "71,137" in alabama[0]
    assert any(line.startswith("| Wyoming |") for line in lines)
    assert all(line.count("|") == header.count("|") for line in lines)
    assert table.page == 1
    # the table's words are not repeated as running text
    assert "Alabama" not in " ".join(b.text for b in doc.blocks if b.kind is not BlockKind.TABLE)


def test_rotated_page_reads_like_the_upright_one(extractor: PdfExtractor) -> None:
    upright = extractor.extract((PDF / "pdfplumber__nics-background-checks-2015-11.pdf").read_bytes())
    rotated = extractor.extract((PDF / "pdfplumber__nics-background-checks-2015-11-rotated.pdf").read_bytes())
    with pdfplumber.open(PDF / "pdfplumber__nics-background-checks-2015-11-rotated.pdf") as pdf:
        assert pdf.pages[0].rotation == 90
    turned = next(b for b in rotated.blocks if b.kind is BlockKind.TABLE).text
    straight = next(b for b in upright.blocks if b.kind is BlockKind.TABLE).text
    assert turned.split("\n")[0] == straight.split("\n")[0]  # same header
    assert re.sub(r"\s", "", turned) == re.sub(r"\s", "", straight)  # same cells (digit gaps aside)


def test_federal_register_reads_three_columns_in_order(federal_register: ExtractedDocument) -> None:
    page2 = _page_text(federal_register, 2)
    col1 = page2.index("Hatta International Airport in Jakarta, Indonesia, resulting in 189 fatalities")
    col2 = page2.index("altitude disagree alert, 5 and may affect the flightcrew’s ability")
    col3 = page2.index("and the Ethiopian Civil Aviation Authority (ECAA)")
    assert col1 < col2 < col3
    # a sentence broken over lines inside column 1 is read whole, not mixed with column 2
    assert "Investigation of the accident has been completed by the Indonesian authorities" in page2
    assert "Jakarta, altitude disagree alert" not in federal_register.text  # row-wise reading


def test_federal_register_running_headers_and_footers_removed(federal_register: ExtractedDocument) -> None:
    with pdfplumber.open(PDF / "pdfplumber__federal-register-2020-17221.pdf") as pdf:
        top_line = pdf.pages[1].extract_text().split("\n")[0]
    assert "Federal Register" in top_line and "47699" in top_line  # the header is really there
    text = federal_register.text
    assert "Proposed Rules 47699" not in text and "47700 Federal Register" not in text
    assert "VerDate" not in text and "Jkt 250001" not in text
    assert federal_register.metadata.page_count == 15
    assert federal_register.metadata.created == "2020-08-06T09:51:25Z"
    assert federal_register.metadata.modified == "2020-08-06T05:51:39-04:00"


def test_every_block_has_the_page_its_words_are_on(extractor: PdfExtractor) -> None:
    path = PDF / "docling__multi_page.pdf"
    with pdfplumber.open(path) as pdf:  # page texts with line-end hyphens joined
        texts = [re.sub(r"-\n", "", p.extract_text()) for p in pdf.pages]
    pages = [set(re.findall(r"[A-Za-z]{8,}", text)) for text in texts]
    counts = Counter(word for words in pages for word in words)
    doc = extractor.extract(path.read_bytes())
    assert all(b.page is not None and 1 <= b.page <= len(pages) for b in doc.blocks)
    checked = 0
    for number, words in enumerate(pages, start=1):
        unique = sorted(w for w in words if counts[w] == 1)[:3]
        for word in unique:
            holders = [b for b in doc.blocks if re.search(rf"\b{re.escape(word)}\b", b.text)]
            assert holders, word
            assert {b.page for b in holders} == {number}, word
            checked += 1
    assert checked >= 6


def test_hyphenated_line_breaks_are_joined(supreme_court: ExtractedDocument) -> None:
    text = supreme_court.text
    for joined in (
        "interpretation of Rule",
        "reformulations",
        "postconviction relief",
        "Arizona Supreme Court",
    ):
        assert joined in text, joined
    for broken in ("in- terpretation", "reformul- ations", "postconvic- tion"):
        assert broken not in text
    assert join_lines(["a well-", "known fact about flight-", "crews and FAA-", "approved parts"]) == (
        "a well-known fact about flightcrews and FAA-approved parts"
    )


@pytest.mark.parametrize(("name", "password"), ENCRYPTED)
def test_encrypted_pdfs_open_with_their_password(
    extractor: PdfExtractor, supreme_court: ExtractedDocument, name: str, password: str
) -> None:
    data = (PDF / name).read_bytes()
    if name == "llamadatasets__598us1r3_j4ek.pdf":
        doc = supreme_court  # the same call (empty password), already made
    else:
        doc = extractor.extract(data, password=password)
    assert doc.text.strip() or doc.pages_without_text
    if password:  # a user password is required
        with pytest.raises(PasswordError, match="DocumentSpec.password"):
            extractor.extract(data)
        with pytest.raises(PasswordError, match="wrong password"):
            extractor.extract(data, password=password + "-wrong")


def test_encrypted_inventory_is_covered() -> None:
    names = {name for name, _ in ENCRYPTED}
    assert {"pdfplumber__password-example.pdf", "pypdf__crazyones-encrypted-256.pdf"} <= names
    assert len(names) >= 8


@pytest.mark.parametrize(
    ("name", "pages"),
    [
        ("docling__ocr_test.pdf", [1]),
        ("docling__ocr_test_rotated_90.pdf", [1]),
        ("docling__nemotron_multipage.pdf", [1, 2, 3, 4]),
    ],
)
def test_scanned_pages_are_reported(extractor: PdfExtractor, name: str, pages: list[int]) -> None:
    doc = extractor.extract((PDF / name).read_bytes())
    assert doc.pages_without_text == pages
    assert doc.metadata.page_count == len(pages)


def test_scan_with_ocr_layer_has_text(extractor: PdfExtractor) -> None:
    doc = extractor.extract((PDF / "pypdf__Seige_of_Vicksburg_Sample_OCR.pdf").read_bytes())
    assert doc.pages_without_text == []
    assert len(doc.text) > 10_000


def test_empty_and_corrupt_pdfs_raise_parse_error(extractor: PdfExtractor) -> None:
    with pytest.raises(DocumentParseError):
        extractor.extract((PDF / "pdfplumber__empty.pdf").read_bytes())
    with pytest.raises(DocumentParseError):
        extractor.extract(b"%PDF-1.7\nthis is not really a pdf\n%%EOF")
    with pytest.raises(DocumentParseError):
        extractor.extract(b"plain words, no pdf at all")


def test_malformed_pdf_still_yields_its_text(extractor: PdfExtractor) -> None:
    doc = extractor.extract((PDF / "pdfplumber__malformed-from-issue-932.pdf").read_bytes())
    assert "2021" in doc.text


def test_page_limit_is_enforced() -> None:
    limited = PdfExtractor(ExtractionLimits(max_pages=2))
    with pytest.raises(LimitExceededError, match="pages"):
        limited.extract((PDF / "docling__multi_page.pdf").read_bytes())


def test_table_in_two_column_paper(extractor: PdfExtractor) -> None:
    doc = extractor.extract((PDF / "docling__2305.03393v1-pg9.pdf").read_bytes())
    tables = [b for b in doc.blocks if b.kind is BlockKind.TABLE]
    assert tables and all(t.table_header and "---" in t.table_header for t in tables)


def test_pdf_dates() -> None:
    assert pdf_date_to_iso("D:20200806055139-04'00'") == "2020-08-06T05:51:39-04:00"
    assert pdf_date_to_iso("D:20200806095125Z") == "2020-08-06T09:51:25Z"
    assert pdf_date_to_iso("D:2019") == "2019-01-01"
    assert pdf_date_to_iso("garbage") == ""


def test_the_warn_reports_table_over_14_pages_is_one_table() -> None:
    """The WARN report is one table over its pages: every page's table after the first goes on
    with it (continues_table), and the auto chunker packs rows across the page breaks."""
    from ingest_service.chunking import AutoChunker, ChunkingConfig
    from ragrpc.tokens import WordTokenCounter

    document = PdfExtractor().extract((PDF / "pdfplumber__WARN-Report-for-7-1-2015-to-03-25-2016.pdf").read_bytes())
    tables = [b for b in document.blocks if b.kind is BlockKind.TABLE]
    assert len(tables) >= 10 and sum(b.continues_table for b in tables) >= len(tables) - 2
    chunks = AutoChunker(WordTokenCounter(), ChunkingConfig()).chunk(document)
    assert any(c.page_end > c.page_start for c in chunks)
    separator = tables[0].table_header.split("\n")[-1]  # later parts carry the header compacted
    assert sum(c.text.split("\n").count(separator) for c in chunks) == 1  # no page's repeated header inside
