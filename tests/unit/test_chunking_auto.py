"""auto: the right strategy per document and per region."""

from __future__ import annotations

from ingest_service.chunking import AutoChunker, ChunkingConfig
from ragrpc.models import Block, BlockKind, ChunkDraft, ExtractedDocument
from ragrpc.tokens import WordTokenCounter
from tests.unit.chunking_helpers import markdown_document, missing_words
from tests.unit.test_chunking_code import MODULE

COUNTER = WordTokenCounter()
CONFIG = ChunkingConfig(chunk_size=120, overlap=18, max_tokens=160, min_chunk_tokens=10, inline_block_tokens=40)
TABLE_HEADER = "| Region | Q1 | Q2 |\n|---|---|---|"


def _narrative(tag: str, sentences: int) -> str:
    return " ".join(
        f"The {tag} story goes on in part {s} with " + " ".join(f"{tag}{s}w{k}" for k in range(7)) + "."
        for s in range(sentences)
    )


def _mixed_document() -> ExtractedDocument:
    table = TABLE_HEADER + "\n" + "\n".join(f"| region-{k} | {k * 3} | {k * 5} |" for k in range(80))
    return ExtractedDocument(
        "text/markdown",
        [
            Block(BlockKind.HEADING, "# Report", 1, ("Report",), level=1),
            Block(BlockKind.PARAGRAPH, _narrative("intro", 12), 1, ("Report",)),
            Block(BlockKind.HEADING, "## Sales", 2, ("Report", "Sales"), level=2),
            Block(BlockKind.TABLE, table, 2, ("Report", "Sales"), table_header=TABLE_HEADER),
            Block(BlockKind.PARAGRAPH, _narrative("after", 3), 3, ("Report", "Sales")),
            Block(BlockKind.HEADING, "## Code", 3, ("Report", "Code"), level=2),
            Block(BlockKind.PARAGRAPH, "The service helpers:", 3, ("Report", "Code")),
            Block(BlockKind.CODE, MODULE, 3, ("Report", "Code"), language="python"),
            Block(BlockKind.PARAGRAPH, "Run `pip install inventory` first:", 4, ("Report", "Code")),
            Block(BlockKind.CODE, "pip install inventory", 4, ("Report", "Code"), language="sh"),
        ],
    )


def _by(chunks: list[ChunkDraft], chunker: str) -> list[ChunkDraft]:
    return [c for c in chunks if c.chunker == chunker]


def test_mixed_document_gets_a_strategy_per_region() -> None:
    document = _mixed_document()
    chunks = AutoChunker(COUNTER, CONFIG).chunk(document)
    assert {c.chunker for c in chunks} == {"auto/heading", "auto/table", "auto/code"}
    tables = _by(chunks, "auto/table")
    assert len(tables) >= 3
    assert tables[0].text.startswith("## Sales\n\n" + TABLE_HEADER)  # its heading goes along
    assert all("story" not in c.text for c in tables)  # the text around is chunked apart
    assert all(c.text.startswith("| Region | Q1 | Q2 |\n|---|---|---|\n") for c in tables[1:])
    code = _by(chunks, "auto/code")
    assert any(c.text.startswith("# Items are kept in memory") for c in code)
    assert all("story" not in c.text for c in code)
    headed = _by(chunks, "auto/heading")
    assert headed[0].text.startswith("# Report\n\nThe intro story")
    after = [c for c in headed if "after0w0" in c.text]
    assert after[0].text.startswith("## Sales\n\nThe after story")  # section heading repeated
    small_code = [c for c in chunks if "pip install inventory" in c.text and "first:" in c.text]
    assert small_code and small_code[0].chunker == "auto/heading"  # a small code block stays inline
    assert all(COUNTER.count(c.text) <= CONFIG.max_tokens for c in chunks)
    assert not missing_words(document, chunks)


def test_long_narrative_without_headings_is_chunked_recursively() -> None:
    document = ExtractedDocument("text/plain", [Block(BlockKind.PARAGRAPH, _narrative(f"p{n}x", 5)) for n in range(10)])
    chunks = AutoChunker(COUNTER, CONFIG).chunk(document)
    assert len(chunks) > 3 and {c.chunker for c in chunks} == {"auto/recursive"}


def test_a_document_within_one_chunk_stays_whole() -> None:
    document = ExtractedDocument(
        "text/markdown",
        [
            Block(BlockKind.HEADING, "# Tiny", 1, ("Tiny",), level=1),
            Block(BlockKind.PARAGRAPH, "Just this.", 1, ("Tiny",)),
        ],
    )
    chunks = AutoChunker(COUNTER, CONFIG).chunk(document)
    assert [(c.text, c.chunker) for c in chunks] == [("# Tiny\n\nJust this.", "auto/whole")]


def test_a_python_source_file_goes_to_the_code_chunker() -> None:
    document = ExtractedDocument("text/x-python", [Block(BlockKind.CODE, MODULE, language="python")])
    chunks = AutoChunker(COUNTER, ChunkingConfig(chunk_size=60, overlap=0, max_tokens=120)).chunk(document)
    assert len(chunks) > 3 and {c.chunker for c in chunks} == {"auto/code"}


def test_real_readme() -> None:
    document = markdown_document("pdfplumber__README.md")
    chunks = AutoChunker(COUNTER, ChunkingConfig()).chunk(document)
    assert {"auto/heading", "auto/table"} <= {c.chunker for c in chunks}
    assert all(COUNTER.count(c.text) <= 254 for c in chunks)
    assert not missing_words(document, chunks)
