"""MarkdownExtractor, TextExtractor, CsvExtractor and decode_text."""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest

from ingest_service.extract.markdown import MarkdownExtractor, inline_text
from ingest_service.extract.text import CsvExtractor, TextExtractor, decode_text
from ragrpc.models import BlockKind

DOCS = Path(__file__).resolve().parents[2].parent / "shared" / "eval" / "docs"
MARKDOWN = DOCS / "markdown"
needs_docs = pytest.mark.skipif(not MARKDOWN.is_dir(), reason="shared eval docs not present")

SAMPLE = """---
title: "Duck handbook"
author: Ann Example
date: 2024-05-01
tags: [birds, water]
---

Intro paragraph with a [link](https://example.org) and **bold** text.

Setext Top
==========

## Feeding

- bread is bad
  continued line
    - nested item
1. first
2. second

```python
def quack():
    return "quack"
```

| Food | Calories \\| kcal |
|:-----|-----:|
| Leaves | 50 |
| Berries | 80 |

Sub heading
-----------

    indented = "code"

Last words.
"""


@pytest.fixture(scope="module")
def markdown() -> MarkdownExtractor:
    return MarkdownExtractor()


def test_markdown_structure(markdown: MarkdownExtractor) -> None:
    doc = markdown.extract(SAMPLE.encode())
    meta = doc.metadata
    assert (meta.title, meta.author, meta.created) == ("Duck handbook", "Ann Example", "2024-05-01")
    assert meta.extra["tags"] == "[birds, water]"
    kinds = [(b.kind, b.text.split("\n")[0]) for b in doc.blocks]
    assert kinds[0] == (BlockKind.PARAGRAPH, "Intro paragraph with a link and bold text.")
    heading = {b.text: b for b in doc.blocks if b.kind is BlockKind.HEADING}
    assert heading["Setext Top"].level == 1 and heading["Feeding"].section_path == ("Setext Top", "Feeding")
    assert heading["Sub heading"].level == 2
    items = [(b.text, b.level) for b in doc.blocks if b.kind is BlockKind.LIST_ITEM]
    assert items == [
        ("- bread is bad continued line", 0),
        ("- nested item", 1),
        ("1. first", 0),
        ("2. second", 0),
    ]
    code = [b for b in doc.blocks if b.kind is BlockKind.CODE]
    assert code[0].language == "python" and code[0].text == 'def quack():\n    return "quack"'
    assert code[1].text == 'indented = "code"'
    table = next(b for b in doc.blocks if b.kind is BlockKind.TABLE)
    assert table.text == ("| Food | Calories \\| kcal |\n| --- | --- |\n| Leaves | 50 |\n| Berries | 80 |")
    assert table.section_path == ("Setext Top", "Feeding")
    assert doc.blocks[-1].text == "Last words." and doc.blocks[-1].section_path == (
        "Setext Top",
        "Sub heading",
    )


@needs_docs
def test_real_markdown_files(markdown: MarkdownExtractor) -> None:
    mixed = markdown.extract((MARKDOWN / "docling__mixed.md").read_bytes())
    table = next(b for b in mixed.blocks if b.kind is BlockKind.TABLE)  # an HTML <table> inside Markdown
    assert table.table_header.startswith("| Character | Name in German |")
    assert "| Huey | Tick | Riri | Qui |" in table.text
    assert mixed.metadata.title == "Title"
    readme = markdown.extract((MARKDOWN / "pdfplumber__README.md").read_bytes())
    assert readme.metadata.title == "pdfplumber"
    assert any(b.kind is BlockKind.CODE and b.language == "python" for b in readme.blocks)
    assert any(b.kind is BlockKind.TABLE for b in readme.blocks)
    nested = markdown.extract((MARKDOWN / "docling__nested.md").read_bytes())
    assert ("- abc12345", 3) in [(b.text, b.level) for b in nested.blocks]
    assert "Table nesting apparently" not in nested.text  # an HTML comment


def test_inline_markup() -> None:
    assert inline_text("[![badge](x.svg)](https://x) see [docs](u) and *it* and **b** &amp; 2 * 3") == (
        "badge see docs and it and b & 2 * 3"
    )


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "cp1252", "latin-1"])
def test_decode_text_encodings(encoding: str) -> None:
    text = "Grüße aus Köln – “déjà vu”, naïve café. " * 5 if encoding != "latin-1" else "Grüße aus Köln, café. " * 5
    data = text.encode(encoding)
    if encoding == "utf-16-le":
        data = codecs.BOM_UTF16_LE + data
    if encoding == "utf-16-be":
        data = codecs.BOM_UTF16_BE + data
    assert decode_text(data) == text


def test_decode_text_never_fails() -> None:
    assert decode_text(b"valid \xff\xfe\xfd then \xc3( broken") != ""
    assert decode_text(b"") == ""
    assert decode_text(bytes(range(256)))  # any bytes decode
    assert decode_text("no BOM here".encode("utf-16-le")) == "no BOM here"
    assert decode_text(b"windows\r\nline\rendings") == "windows\nline\nendings"


def test_text_paragraphs() -> None:
    data = "First para\nstill first.\n\n  \nSecond para.\n\n\n\nThird.".encode("utf-16")
    doc = TextExtractor().extract(data)
    assert [b.text for b in doc.blocks] == ["First para\nstill first.", "Second para.", "Third."]
    assert all(b.kind is BlockKind.PARAGRAPH and b.page is None for b in doc.blocks)


def test_csv_becomes_a_table() -> None:
    doc = CsvExtractor().extract(b'name;qty\nleaves;5\n"a|b";7\n')
    (table,) = doc.blocks
    assert table.kind is BlockKind.TABLE
    assert table.text == "| name | qty |\n| --- | --- |\n| leaves | 5 |\n| a\\|b | 7 |"
