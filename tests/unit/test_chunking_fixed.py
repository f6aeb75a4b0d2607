"""fixed_tokens: windows of chunk_size tokens over the whole text, with overlap."""

from __future__ import annotations

from ingest_service.chunking import ChunkingConfig, FixedTokenChunker
from ragrpc.models import Block, BlockKind, ExtractedDocument
from ragrpc.tokens import WordTokenCounter
from tests.unit.chunking_helpers import markdown_document, missing_words
from tests.unit.test_chunking_base import ThreeLetterPieces

COUNTER = WordTokenCounter()


def _document(words: int) -> ExtractedDocument:
    text = " ".join(f"alpha{k}" for k in range(words))
    return ExtractedDocument("text/plain", [Block(BlockKind.PARAGRAPH, text, 1)])


def test_windows_have_chunk_size_tokens_and_slide_by_size_minus_overlap() -> None:
    config = ChunkingConfig(chunk_size=100, overlap=20, min_chunk_tokens=0)
    chunks = FixedTokenChunker(COUNTER, config).chunk(_document(500))
    assert [COUNTER.count(c.text) for c in chunks] == [100, 100, 100, 100, 100, 100]
    assert chunks[1].text.startswith("alpha80 ")
    assert chunks[-1].text.endswith("alpha499")
    assert {c.chunker for c in chunks} == {"fixed_tokens"}


def test_a_tiny_last_window_joins_the_one_before() -> None:
    config = ChunkingConfig(chunk_size=100, overlap=0, min_chunk_tokens=10)
    chunks = FixedTokenChunker(COUNTER, config).chunk(_document(305))
    assert [COUNTER.count(c.text) for c in chunks] == [100, 100, 105]


def test_windows_span_blocks_and_keep_the_original_text() -> None:
    document = markdown_document("docling__wiki.md")
    chunks = FixedTokenChunker(COUNTER, ChunkingConfig(chunk_size=120, overlap=18)).chunk(document)
    joined = "\n\n".join(b.text for b in document.blocks)
    assert len(chunks) > 3
    assert all(c.text in joined for c in chunks)
    assert any("\n\n" in c.text for c in chunks)
    assert not missing_words(document, chunks)


def test_subword_tokens_are_never_split_mid_word_when_whitespace_is_near() -> None:
    text = " ".join(f"tokenization{k:04d}" for k in range(300))
    document = ExtractedDocument("text/plain", [Block(BlockKind.PARAGRAPH, text)])
    counter = ThreeLetterPieces()
    chunks = FixedTokenChunker(counter, ChunkingConfig(chunk_size=64, overlap=8, min_chunk_tokens=0)).chunk(document)
    for c in chunks:
        assert counter.count(c.text) <= 64
        assert all(len(word) == len("tokenization0000") for word in c.text.split())
