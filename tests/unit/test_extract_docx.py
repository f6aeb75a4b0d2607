"""DocxExtractor on the real .docx files in ../shared/eval/docs/docx (python-docx, no mocks)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import docx
import pytest

from ingest_service.extract.base import ExtractionLimits
from ingest_service.extract.docx import DocxExtractor, list_marker
from ragrpc.errors import DocumentParseError, LimitExceededError
from ragrpc.models import BlockKind

DOCS = Path(__file__).resolve().parents[2].parent / "shared" / "eval" / "docs"
DOCX = DOCS / "docx"
pytestmark = pytest.mark.skipif(not DOCX.is_dir(), reason="shared eval docs not present")


@pytest.fixture(scope="module")
def extractor() -> DocxExtractor:
    return DocxExtractor()


def test_headings_become_section_paths(extractor: DocxExtractor) -> None:
    doc = extractor.extract((DOCX / "docling__unit_test_headers.docx").read_bytes())
    headings = [(b.text, b.level) for b in doc.blocks if b.kind is BlockKind.HEADING]
    assert ("Section 1", 1) in headings and ("Section 1.1", 2) in headings and ("Section 1.2.3", 3) in headings
    by_text = {b.text: b for b in doc.blocks}
    assert by_text["Paragraph 1.1"].section_path == ("Test Document", "Section 1")
    assert by_text["Paragraph 1.2.3.1"].section_path[-3:] == ("Section 1", "Section 1.2", "Section 1.2.3")
    assert by_text["Section 1.1"].section_path == ("Test Document", "Section 1", "Section 1.1")
    first_heading = next(i for i, b in enumerate(doc.blocks) if b.kind is BlockKind.HEADING)
    assert all(b.section_path for b in doc.blocks[first_heading:])
    assert doc.metadata.author == "Peter Staar"
    assert doc.metadata.created.startswith("2024-09-26")


def test_tables_are_intact_markdown_with_merged_cells(extractor: DocxExtractor) -> None:
    doc = extractor.extract((DOCX / "docling__word_tables.docx").read_bytes())
    tables = [b for b in doc.blocks if b.kind is BlockKind.TABLE]
    assert len(tables) == 7
    assert tables[0].text == (
        "| Header 0.0 | Header 0.1 | Header 0.2 |\n| --- | --- | --- |\n"
        "| Cell 1.0 | Cell 1.1 | Cell 1.2 |\n| Cell 2.0 | Cell 2.1 | Cell 2.2 |"
    )
    assert tables[0].table_header == "| Header 0.0 | Header 0.1 | Header 0.2 |\n| --- | --- | --- |"
    assert "| Cell 1.0 | Merged Cell 1.1 1.2 | Merged Cell 1.1 1.2 |" in tables[1].text  # gridSpan
    assert "| Cell 2.0 | Merged Cell 1.1 2.1 | Cell 2.2 |" in tables[3].text  # vMerge continue
    # the paragraphs around the tables keep their order
    kinds = [b.kind for b in doc.blocks]
    assert kinds[:3] == [BlockKind.HEADING, BlockKind.PARAGRAPH, BlockKind.TABLE]


def test_nested_layout_table_is_read_once(extractor: DocxExtractor) -> None:
    doc = extractor.extract((DOCX / "docling__tablecell.docx").read_bytes())
    texts = [b.text for b in doc.blocks]
    assert "| Tab1 | Tab2 | Tab3 |\n| --- | --- | --- |\n| A | B | C |\n| D | E | F |" in texts
    assert texts.count("Tab1") == 0  # not repeated as loose paragraphs


def test_lists_are_list_items_with_markers(extractor: DocxExtractor) -> None:
    doc = extractor.extract((DOCX / "docling__docx_lists.docx").read_bytes())
    items = [b for b in doc.blocks if b.kind is BlockKind.LIST_ITEM]
    assert len(items) >= 40
    texts = [b.text for b in items]
    assert "- List item 1" in texts
    assert texts.index("1. List item a") < texts.index("2. List item b") < texts.index("3. List item c")
    assert any(b.level > 0 for b in items)  # nested levels survive
    assert all(b.section_path for b in items)


def test_list_marker_formats() -> None:
    assert list_marker("bullet", 3) == "- "
    assert list_marker("decimal", 3) == "3. "
    assert list_marker("lowerLetter", 2) == "b. "
    assert list_marker("upperRoman", 4) == "IV. "


def test_page_headers_and_footers_are_not_body_text(extractor: DocxExtractor) -> None:
    path = DOCX / "python-docx__hdr-header-footer.docx"
    section = docx.Document(str(path)).sections[0]
    header_text = " ".join(p.text for p in section.header.paragraphs).strip()
    assert header_text
    doc = extractor.extract(path.read_bytes())
    assert doc.text and header_text not in doc.text


def test_text_boxes_are_read(extractor: DocxExtractor) -> None:
    doc = extractor.extract((DOCX / "docling__textbox.docx").read_bytes())
    assert "Infectious Disease Reporting Procedure" in doc.text
    assert doc.text.count("Student falls ill") == 1  # mc:Fallback copies are skipped


def test_strict_ooxml_is_a_parse_error(extractor: DocxExtractor) -> None:
    with pytest.raises(DocumentParseError, match="Strict"):
        extractor.extract((DOCX / "docling__Strict.docx").read_bytes())


def test_not_a_zip_is_a_parse_error(extractor: DocxExtractor) -> None:
    with pytest.raises(DocumentParseError, match="zip"):
        extractor.extract(b"PK\x03\x04 but then nothing that unzips")


def _zip(entries: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, payload in entries.items():
            archive.writestr(name, payload)
    return out.getvalue()


def test_decompression_bomb_is_refused_before_opening() -> None:
    bomb = _zip({"word/document.xml": b"\0" * (25 * 1024 * 1024)})  # ~25 KB on disk, ratio ~1000
    with pytest.raises(LimitExceededError, match="compression ratio"):
        DocxExtractor().extract(bomb)
    small_limit = DocxExtractor(ExtractionLimits(max_docx_uncompressed_bytes=1_000_000))
    with pytest.raises(LimitExceededError, match="inflate"):
        small_limit.extract(_zip({"word/document.xml": b"<x/>" * 500_000}))
