"""paragraph: whole paragraphs packed; an over-long one is chunked alone, by sentences."""

from __future__ import annotations

from ingest_service.chunking import ChunkingConfig, ParagraphChunker
from ingest_service.chunking.units import split_sentences
from ragrpc.models import Block, BlockKind, ExtractedDocument
from ragrpc.tokens import WordTokenCounter

COUNTER = WordTokenCounter()
CONFIG = ChunkingConfig(chunk_size=60, overlap=0, max_tokens=80, min_chunk_tokens=0)


def _paragraph(tag: str, sentences: int) -> str:
    return " ".join(
        f"{tag.capitalize()}{s} " + " ".join(f"{tag}{s}w{k}" for k in range(8)) + "." for s in range(sentences)
    )


def test_paragraphs_stay_whole_and_are_packed() -> None:
    paragraphs = [_paragraph(f"p{n}x", 1 + n % 3) for n in range(12)]
    document = ExtractedDocument("text/plain", [Block(BlockKind.PARAGRAPH, p) for p in paragraphs])
    chunks = ParagraphChunker(COUNTER, CONFIG).chunk(document)
    assert 1 < len(chunks) < len(paragraphs)
    rebuilt = [p for c in chunks for p in c.text.split("\n\n")]
    assert rebuilt == paragraphs
    assert all(COUNTER.count(c.text) <= 60 for c in chunks)


def test_blank_lines_inside_a_block_separate_paragraphs() -> None:
    text = "\n\n".join(_paragraph(f"q{n}x", 2) for n in range(6))
    chunks = ParagraphChunker(COUNTER, CONFIG).chunk(ExtractedDocument("text/plain", [Block(BlockKind.OTHER, text)]))
    assert len(chunks) == 2  # 20 tokens a paragraph, 60 a chunk
    assert all(c.text.count("\n\n") == 2 for c in chunks)


def test_a_long_paragraph_is_split_by_sentences_on_its_own() -> None:
    before, long, after = _paragraph("ax", 1), _paragraph("bx", 15), _paragraph("cx", 1)
    document = ExtractedDocument("text/plain", [Block(BlockKind.PARAGRAPH, t) for t in (before, long, after)])
    chunks = ParagraphChunker(COUNTER, CONFIG).chunk(document)
    assert chunks[0].text == before and chunks[-1].text == after
    middle = chunks[1:-1]
    assert len(middle) >= 3
    assert [s for c in middle for s in split_sentences(c.text)] == split_sentences(long)
