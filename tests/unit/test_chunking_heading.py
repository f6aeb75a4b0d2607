"""heading: one chunk per heading section, heading on top, section paths set."""

from __future__ import annotations

from ingest_service.chunking import ChunkingConfig, HeadingChunker
from ragrpc.models import Block, BlockKind, ExtractedDocument
from ragrpc.tokens import WordTokenCounter
from tests.unit.chunking_helpers import markdown_document, missing_words

COUNTER = WordTokenCounter()
CONFIG = ChunkingConfig(chunk_size=60, overlap=0, max_tokens=80, min_chunk_tokens=5)


def _text(tag: str, sentences: int) -> str:
    return " ".join(
        f"{tag.capitalize()}{s} " + " ".join(f"{tag}{s}w{k}" for k in range(6)) + "." for s in range(sentences)
    )


def _heading(title: str, level: int, path: tuple[str, ...], page: int = 1) -> Block:
    return Block(BlockKind.HEADING, "#" * level + " " + title, page, path, level=level)


def test_one_chunk_per_section_with_its_heading_and_path() -> None:
    document = ExtractedDocument(
        "text/markdown",
        [
            Block(BlockKind.PARAGRAPH, _text("preamble", 2), 1),
            _heading("Intro", 1, ("Intro",)),
            Block(BlockKind.PARAGRAPH, _text("ax", 2), 1, ("Intro",)),
            _heading("Setup", 2, ("Intro", "Setup")),
            Block(BlockKind.LIST_ITEM, "- install it", 1, ("Intro", "Setup")),
            Block(BlockKind.LIST_ITEM, "- run it", 1, ("Intro", "Setup")),
            _heading("Usage", 2, ("Intro", "Usage")),
            Block(BlockKind.PARAGRAPH, _text("bx", 2), 1, ("Intro", "Usage")),
        ],
    )
    chunks = HeadingChunker(COUNTER, CONFIG).chunk(document)
    assert [c.section_path for c in chunks] == [(), ("Intro",), ("Intro", "Setup"), ("Intro", "Usage")]
    assert [c.text.split("\n")[0] for c in chunks[1:]] == ["# Intro", "## Setup", "## Usage"]
    assert chunks[2].text == "## Setup\n\n- install it\n\n- run it"


def test_a_long_section_is_split_with_its_heading_repeated() -> None:
    document = ExtractedDocument(
        "text/markdown",
        [
            _heading("Long", 1, ("Long",), page=1),
            Block(BlockKind.PARAGRAPH, _text("ax", 8), 1, ("Long",)),
            Block(BlockKind.PARAGRAPH, _text("bx", 8), 2, ("Long",)),
        ],
    )
    chunks = HeadingChunker(COUNTER, CONFIG).chunk(document)
    assert len(chunks) >= 3
    assert all(c.text.startswith("# Long\n") and c.section_path == ("Long",) for c in chunks)
    assert all(COUNTER.count(c.text) <= 60 for c in chunks)
    assert chunks[-1].page_start == 2  # the repeated heading does not claim its page
    assert not missing_words(document, chunks)


def test_headings_without_text_stack_on_the_next_section() -> None:
    document = ExtractedDocument(
        "text/markdown",
        [
            _heading("v2.0", 2, ("v2.0",)),
            _heading("Fixes", 3, ("v2.0", "Fixes")),
            Block(BlockKind.LIST_ITEM, "* fixed a crash", 1, ("v2.0", "Fixes")),
            _heading("v1.0", 2, ("v1.0",)),
            _heading("Features", 3, ("v1.0", "Features")),
            Block(BlockKind.LIST_ITEM, "* " + _text("fx", 10), 1, ("v1.0", "Features")),
        ],
    )
    chunks = HeadingChunker(COUNTER, CONFIG).chunk(document)
    assert chunks[0].text == "## v2.0\n\n### Fixes\n\n* fixed a crash"
    assert chunks[0].section_path == ("v2.0", "Fixes")
    assert all(c.text.startswith("## v1.0\n\n### Features\n\n") for c in chunks[1:])


def test_real_markdown_every_chunk_starts_with_its_heading() -> None:
    document = markdown_document("pdfplumber__README.md")
    chunks = HeadingChunker(COUNTER, ChunkingConfig()).chunk(document)
    assert all(c.text.startswith("#") for c in chunks)
    for c in chunks:
        headings = [line for line in c.text.split("\n") if line.startswith("#")]
        assert any(c.section_path[-1] in line for line in headings), (c.section_path, headings)
    assert not missing_words(document, chunks)
