"""table: tables intact when they fit, else split by rows with the header repeated."""

from __future__ import annotations

import re
from collections import Counter

from ingest_service.chunking import ChunkingConfig, TableChunker
from ingest_service.chunking.base import DocumentView
from ingest_service.chunking.table import table_caption
from ragrpc.models import Block, BlockKind, ExtractedDocument
from ragrpc.tokens import WordTokenCounter
from tests.unit.chunking_helpers import markdown_document, missing_words

COUNTER = WordTokenCounter()
HEADER = "| Id | Product | Price | Stock |\n|---:|---------|------:|-------|"
REPEATED = "| Id | Product | Price | Stock |\n|---:|---|---:|---|"  # the separator compacted


def _table(rows: int, declared_header: bool = True) -> Block:
    body = "\n".join(f"| {k} | product-{k} | {k * 1.5:.2f} | {k % 7} |" for k in range(rows))
    return Block(BlockKind.TABLE, f"{HEADER}\n{body}", 3, ("Prices",), table_header=HEADER if declared_header else "")


def test_a_300_row_table_is_split_with_the_header_in_every_part() -> None:
    document = ExtractedDocument("text/markdown", [_table(300)])
    chunks = TableChunker(COUNTER, ChunkingConfig()).chunk(document)
    assert len(chunks) > 5
    assert chunks[0].text.startswith(HEADER + "\n")
    rows: list[str] = []
    for c in chunks[1:]:
        assert c.text.startswith(REPEATED + "\n")
    for c in chunks:
        assert COUNTER.count(c.text) <= 254
        assert (c.page_start, c.page_end, c.section_path) == (3, 3, ("Prices",))
        rows += c.text.split("\n")[2:]
    assert rows == _table(300).text.split("\n")[2:]  # every row once, in order


def test_the_header_is_found_without_table_header() -> None:
    chunks = TableChunker(COUNTER, ChunkingConfig()).chunk(ExtractedDocument("text/markdown", [_table(300, False)]))
    assert chunks[0].text.startswith(HEADER + "\n")
    assert all(c.text.startswith(REPEATED + "\n") for c in chunks[1:])


def test_a_table_that_fits_is_one_chunk_and_text_is_separate() -> None:
    document = ExtractedDocument(
        "text/markdown",
        [
            Block(BlockKind.PARAGRAPH, "Prices are listed below. " * 30),
            _table(12),
            Block(BlockKind.PARAGRAPH, "Prices change every month. " * 30),
        ],
    )
    chunks = TableChunker(COUNTER, ChunkingConfig(chunk_size=100)).chunk(document)
    tables = [c for c in chunks if c.text.startswith(HEADER)]
    assert [c.text for c in tables] == [_table(12).text]
    assert all("|" not in c.text for c in chunks if c not in tables)


def test_a_row_too_long_is_cut_by_tokens_under_the_header() -> None:
    long_cell = " ".join(f"note{k}" for k in range(400))
    block = Block(BlockKind.TABLE, f"{HEADER}\n| 1 | a | 2 | 3 |\n| 2 | b | {long_cell} | 4 |\n| 3 | c | 5 | 6 |", 1)
    document = ExtractedDocument("text/markdown", [block])
    chunks = TableChunker(COUNTER, ChunkingConfig(chunk_size=100, overlap=0, min_chunk_tokens=0)).chunk(document)
    assert len(chunks) >= 4
    assert all(c.text.startswith("| Id | Product | Price | Stock |\n|---:|") for c in chunks)
    assert all(COUNTER.count(c.text) <= 100 for c in chunks)
    assert not missing_words(document, chunks)


def test_real_markdown_tables() -> None:
    document = markdown_document("pdfplumber__README.md")
    config = ChunkingConfig(chunk_size=120)
    chunks = TableChunker(COUNTER, config).chunk(document)
    view = DocumentView(document, COUNTER)
    for index, block in enumerate(view.blocks):
        if block.kind is not BlockKind.TABLE:
            continue
        caption = table_caption(view, index)
        header_row = block.table_header.split("\n")[0]
        lead = f"{caption}\n" if caption else ""
        parts = [c for c in chunks if c.text.startswith(lead + header_row + "\n|")]
        if COUNTER.count(block.text) <= config.max_tokens:
            assert any(c.text == lead + block.text for c in parts)
        else:
            assert len(parts) >= 2
    assert not missing_words(document, chunks)


def test_a_wide_table_repeats_its_long_header_with_one_dash_separators() -> None:
    """A 24-column table whose header is over half a chunk (as NICS background-check tables
    are): every row still comes with the header row, the separator compacted to "|-|"."""
    columns = [f"Kind{k} Title" for k in range(24)]
    header = "| " + " | ".join(columns) + " |\n| " + " | ".join("---" for _ in columns) + " |"
    rows = [f"| {' | '.join(f'r{r}c{c}' for c in range(24))} |" for r in range(40)]
    footnote = "| " + " ".join(f"note{k}" for k in range(150)) + " |"
    block = Block(BlockKind.TABLE, "\n".join([header, *rows, footnote]), 1, table_header=header)
    config = ChunkingConfig(chunk_size=200, overlap=0)
    chunks = TableChunker(COUNTER, config).chunk(ExtractedDocument("application/pdf", [block]))
    header_row = header.split("\n")[0]
    minimal = header_row + "\n|" + "-|" * 24
    assert COUNTER.count(header_row + "\n|" + "---|" * 24) > config.chunk_size // 2  # too long to repeat as is
    assert chunks[0].text.startswith(header + "\n")
    assert all(c.text.startswith(minimal + "\n") for c in chunks[1:])
    assert all(COUNTER.count(c.text) <= config.max_tokens for c in chunks)
    for row in rows:  # every row intact, under its header, in exactly one chunk
        holding = [c for c in chunks if row in c.text.split("\n")]
        assert len(holding) == 1 and holding[0].text.startswith(header_row + "\n")


def _statement(columns: int, header_words: int, rows: int = 40) -> tuple[str, list[str], str]:
    """A financial statement as a PDF extractor renders it: a long header, short numeric rows
    with empty cells, and a long footnote row."""
    names = [" ".join(f"h{c}w{k}" for k in range(header_words)) for c in range(columns)]
    header = "| " + " | ".join(names) + " |\n| " + " | ".join("---" for _ in names) + " |"
    body = [
        "| "
        + " | ".join(f"Line {r}" if c == 0 else "" if c % 2 else f"{r * 1000 + c:,}" for c in range(columns))
        + " |"
        for r in range(rows)
    ]
    footnote = "| (1) " + " ".join(f"note{k}" for k in range(80)) + " |" + " |" * (columns - 1)
    return header, [*body, footnote], "\n".join([header, *body, footnote])


def test_a_header_longer_than_the_chunk_size_does_not_crash_the_row_windows() -> None:
    """The 10-Q crash: the repeated header (205 tokens) left chunk_size - 205 < 0 tokens for
    rows, and cutting the long footnote row into windows of that size ran off the token list."""
    header, rows, text = _statement(columns=7, header_words=26)
    block = Block(BlockKind.TABLE, text, 1, table_header=header)
    document = ExtractedDocument("application/pdf", [block, Block(BlockKind.PARAGRAPH, "Notes follow. " * 40, 2)])
    config = ChunkingConfig()
    assert COUNTER.count(compact_header_of(header, minimal=True)) > config.chunk_size
    chunks = TableChunker(COUNTER, config).chunk(document)
    header_row = header.split("\n")[0]
    table_chunks = [c for c in chunks if "|" in c.text]
    assert all(c.text.startswith(header_row + "\n|") for c in table_chunks)
    assert all(COUNTER.count(c.text) <= config.max_tokens for c in chunks)
    assert not missing_words(document, chunks)
    for row in rows[:-1]:
        assert any(row in c.text.split("\n") for c in table_chunks)


def compact_header_of(header: str, minimal: bool = False) -> str:
    row, separator = header.split("\n")
    return f"{row}\n|" + ("-|" if minimal else "---|") * separator.count("---")


def test_a_table_of_300_columns_is_cut_between_cells_each_piece_under_its_own_columns() -> None:
    names = [f"Col{c} Name" for c in range(300)]
    header = "| " + " | ".join(names) + " |\n|" + "---|" * 300
    rows = ["| " + " | ".join(f"r{r}c{c}" for c in range(300)) + " |" for r in range(5)]
    block = Block(BlockKind.TABLE, "\n".join([header, *rows]), 2, ("Data",), table_header=header)
    document = ExtractedDocument("text/markdown", [block])
    config = ChunkingConfig()
    chunks = TableChunker(COUNTER, config).chunk(document)
    assert chunks[0].text.startswith("| Col0 Name | Col1 Name |")  # the header rows come first
    pieces = [c for c in chunks if "r0c0" in c.text or "\n|-|" in c.text]
    assert len(pieces) > 5
    for c in pieces:
        head, separator, *body = c.text.split("\n")
        columns = [int(n) for n in re.findall(r"Col(\d+) Name", head)]
        assert columns == list(range(columns[0], columns[-1] + 1))
        assert separator == "|" + "-|" * len(columns)
        assert [re.findall(r"r\d+c(\d+)", line) for line in body] == [[str(k) for k in columns]]
    assert all(COUNTER.count(c.text) <= config.max_tokens for c in chunks)
    assert all((c.page_start, c.section_path) == (2, ("Data",)) for c in chunks)
    assert not missing_words(document, chunks) - Counter({"-": 900})  # the separator row is not repeated


def test_a_two_row_header_is_repeated_whole() -> None:
    """A multi-level header (periods over years) is two rows above the separator."""
    header = (
        "| | Three Months Ended | | Nine Months Ended | |\n| Item | 2024 | 2023 | 2024 | 2023 |\n|---|---|---|---|---|"
    )
    rows = [f"| Line {k} | {k}1 | {k}2 | {k}3 | {k}4 |" for k in range(120)]
    block = Block(BlockKind.TABLE, "\n".join([header, *rows]), 1)  # no table_header: found by the separator
    chunks = TableChunker(COUNTER, ChunkingConfig()).chunk(ExtractedDocument("application/pdf", [block]))
    assert len(chunks) > 2
    assert chunks[0].text.startswith(header + "\n")
    assert all(c.text.startswith(header + "\n") for c in chunks[1:])
    assert [line for c in chunks for line in c.text.split("\n")[3:]] == rows


CAPTION = "Consolidated Statements of Operations (in millions, except per share data)"


def test_every_part_of_a_split_table_starts_with_its_caption_and_header() -> None:
    block = _table(300)
    captioned = Block(BlockKind.TABLE, block.text, 3, ("Prices",), table_header=HEADER, table_caption=CAPTION)
    above = Block(BlockKind.PARAGRAPH, CAPTION, 3, ("Prices",))  # as the PDF and HTML extractors give it
    chunks = TableChunker(COUNTER, ChunkingConfig()).chunk(ExtractedDocument("application/pdf", [above, captioned]))
    parts = [c for c in chunks if "|" in c.text]
    assert len(parts) > 5
    assert parts[0].text.startswith(f"{CAPTION}\n{HEADER}\n")
    assert all(c.text.startswith(f"{CAPTION}\n{REPEATED}\n") for c in parts[1:])
    assert all(COUNTER.count(c.text) <= 254 for c in chunks)
    rows = [line for c in parts for line in c.text.split("\n")[3:]]
    assert rows == block.text.split("\n")[2:]  # every row once, in order


def test_a_caption_like_line_above_a_table_is_its_caption_and_a_sentence_is_not() -> None:
    def caption_of(above: str) -> str:
        document = ExtractedDocument(
            "application/pdf", [Block(BlockKind.PARAGRAPH, above, 3, ("Prices",)), _table(300)]
        )
        view = DocumentView(document, COUNTER)
        return table_caption(view, 1)

    assert caption_of("CONSOLIDATED BALANCE SHEETS") == "CONSOLIDATED BALANCE SHEETS"
    assert caption_of("Table 4: Prices by product") == "Table 4: Prices by product"
    assert caption_of("Net revenues by segment (in millions)") == "Net revenues by segment (in millions)"
    assert caption_of("Prices by region:") == "Prices by region:"
    assert caption_of("We sold more products this year than in any year before.") == ""
    assert caption_of("The table below lists every product that we sold in the year with its price and stock:") == ""
    other_page = ExtractedDocument(
        "application/pdf", [Block(BlockKind.PARAGRAPH, "CONSOLIDATED BALANCE SHEETS", 2, ("Prices",)), _table(3)]
    )
    assert table_caption(DocumentView(other_page, COUNTER), 1) == ""


def _pages(rows_per_page: list[int], repeat_header: bool = True) -> list[Block]:
    """A table over pages 3.. as the PDF extractor gives it: the later pages' blocks begin with
    the header (repeated on the page, or put there by the extractor) and continue the table."""
    blocks, first = [], 0
    for page, count in enumerate(rows_per_page):
        body = "\n".join(f"| {k} | product-{k} | {k * 1.5:.2f} | {k % 7} |" for k in range(first, first + count))
        first += count
        blocks.append(
            Block(
                BlockKind.TABLE,
                f"{HEADER}\n{body}",
                3 + page,
                ("Prices",),
                table_header=HEADER,
                continues_table=page > 0,
            )
        )
    return blocks


def _all_rows(blocks: list[Block]) -> list[str]:
    return [line for b in blocks for line in b.text.split("\n")[2:]]


def test_a_table_over_page_breaks_is_one_table_with_the_pages_of_its_rows() -> None:
    blocks = _pages([45, 50, 12])
    chunks = TableChunker(COUNTER, ChunkingConfig()).chunk(ExtractedDocument("application/pdf", blocks))
    assert chunks[0].text.startswith(HEADER + "\n")
    assert all(c.text.startswith(REPEATED + "\n") for c in chunks[1:])
    rows = [line for c in chunks for line in c.text.split("\n")[2:]]
    assert rows == _all_rows(blocks)  # every row once, in order; no repeated header between them
    assert any(c.page_start < c.page_end for c in chunks)  # a part holds the rows on both sides of a break
    for c in chunks:
        numbers = [int(line.split("|")[1]) for line in c.text.split("\n")[2:]]
        pages = {3 if n < 45 else 4 if n < 95 else 5 for n in numbers}
        assert (c.page_start, c.page_end) == (min(pages), max(pages))
    assert all(COUNTER.count(c.text) <= 254 for c in chunks)


def test_a_short_table_over_a_page_break_is_one_chunk_under_the_auto_chunker() -> None:
    from ingest_service.chunking import AutoChunker

    intro = Block(BlockKind.PARAGRAPH, " ".join(f"word{k}" for k in range(190)), 3, ("Prices",))
    blocks = [intro, *_pages([6, 2])]
    chunks = AutoChunker(COUNTER, ChunkingConfig()).chunk(ExtractedDocument("application/pdf", blocks))
    tables = [c for c in chunks if "|" in c.text]
    assert len(tables) == 1
    assert tables[0].text == "\n".join([HEADER, *_all_rows(blocks[1:])])
    assert (tables[0].page_start, tables[0].page_end) == (3, 4)
    whole = AutoChunker(COUNTER, ChunkingConfig()).chunk(ExtractedDocument("application/pdf", _pages([3, 2])))
    assert [c.text for c in whole] == ["\n".join([HEADER, *_all_rows(_pages([3, 2]))])]
