"""No upright text of a PDF page is lost, and none is put on another page: per page, the words
pdfplumber finds upright are in the extracted blocks of that page (../shared/eval/docs/pdf)."""

from __future__ import annotations

import re
from pathlib import Path

import pdfplumber
import pytest

from ingest_service.extract.pdf import PdfExtractor

PDF = Path(__file__).resolve().parents[2].parent / "shared" / "eval" / "docs" / "pdf"
_WORD = re.compile(r"[A-Za-z]{4,}")

pytestmark = pytest.mark.skipif(not PDF.is_dir(), reason="shared eval docs not present")


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def _letters(text: str) -> str:
    """Lower-case letters only: word splits, hyphenation and spacing do not matter."""
    return re.sub(r"[^a-z]", "", text.lower())


@pytest.mark.parametrize(
    "name",
    [
        # pages 8-13 hold a few upright lines and a vertical margin stamp of many one-letter words
        "pdfplumber__federal-register-2020-17221.pdf",
        "docling__normal_4pages.pdf",
        "pypdf__pdflatex-outline.pdf",
    ],
)
def test_every_page_keeps_its_upright_words(name: str) -> None:
    document = PdfExtractor().extract((PDF / name).read_bytes())
    with pdfplumber.open(PDF / name) as pdf:
        for number, page in enumerate(pdf.pages, start=1):
            expected = _words(" ".join(w["text"] for w in page.extract_words() if w.get("upright", True)))
            found = _letters(" ".join(b.text for b in document.blocks if b.page == number))
            missing = {w for w in expected if w not in found}
            # running headers/footers are dropped on purpose: a few words may go
            assert len(missing) <= max(8, 0.05 * len(expected)), (number, sorted(missing)[:40])
