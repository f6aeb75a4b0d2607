"""recursive: the largest units that fit, finer levels only where needed, with overlap."""

from __future__ import annotations

from itertools import pairwise

from ingest_service.chunking import ChunkingConfig, RecursiveChunker
from ingest_service.chunking.units import split_sentences
from ragrpc.models import Block, BlockKind, ExtractedDocument
from ragrpc.tokens import WordTokenCounter
from tests.unit.chunking_helpers import markdown_document, missing_words

COUNTER = WordTokenCounter()
CONFIG = ChunkingConfig(chunk_size=60, overlap=12, max_tokens=80, min_chunk_tokens=8)


def _sentences(tag: str, count: int) -> list[str]:
    return [f"{tag.capitalize()}{s} " + " ".join(f"{tag}{s}w{k}" for k in range(6 + s % 4)) + "." for s in range(count)]


def test_small_paragraphs_stay_whole_and_overlap_is_whole_sentences() -> None:
    paragraphs = [" ".join(_sentences(f"p{n}x", 3)) for n in range(8)]
    document = ExtractedDocument("text/plain", [Block(BlockKind.PARAGRAPH, p) for p in paragraphs])
    chunks = RecursiveChunker(COUNTER, CONFIG).chunk(document)
    assert len(chunks) > 3
    for first, second in pairwise(chunks):
        opening = split_sentences(second.text)[0]
        assert first.text.endswith(opening)  # the overlap is the last whole sentence
    assert not missing_words(document, chunks)


def test_falls_back_to_lines_then_token_windows() -> None:
    lines = "\n".join(" ".join(f"l{n}w{k}" for k in range(20)) for n in range(10))  # no sentences
    run_on = " ".join(f"r{k}" for k in range(400))  # no sentences, no lines
    document = ExtractedDocument("text/plain", [Block(BlockKind.OTHER, lines), Block(BlockKind.OTHER, run_on)])
    chunks = RecursiveChunker(COUNTER, CONFIG).chunk(document)
    assert all(COUNTER.count(c.text) <= CONFIG.max_tokens for c in chunks)
    line_chunks = [c for c in chunks if "l0w0" in c.text or "l5w0" in c.text]
    assert all(c.text.split("\n")[-1].endswith("w19") for c in line_chunks)  # cut at line ends
    assert not missing_words(document, chunks)


def test_real_readme_chunks_fill_up_to_the_size() -> None:
    document = markdown_document("pdfplumber__README.md")
    chunks = RecursiveChunker(COUNTER, ChunkingConfig()).chunk(document)
    sizes = [COUNTER.count(c.text) for c in chunks]
    assert max(sizes) <= 254
    assert sum(sizes) / len(sizes) > 120  # packed, not one block per chunk
