"""Registry, configuration checks and the shared helpers (token windows, document view)."""

from __future__ import annotations

import pytest

from ingest_service.chunking import CHUNKING_STRATEGIES, ChunkingConfig, build_chunker
from ingest_service.chunking.base import DocumentView
from ingest_service.chunking.token_windows import TokenizedText
from ragrpc.errors import InvalidInputError
from ragrpc.models import Block, BlockKind, ExtractedDocument
from ragrpc.tokens import WordTokenCounter
from tests.unit.chunking_helpers import fake_embed

COUNTER = WordTokenCounter()


class ThreeLetterPieces:
    """A subword tokenizer stand-in: every word is cut into pieces of three characters."""

    def spans(self, text: str) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for start, end in WordTokenCounter().spans(text):
            out += [(k, min(k + 3, end)) for k in range(start, end, 3)]
        return out

    def count(self, text: str) -> int:
        return len(self.spans(text))


def test_registry_names_every_strategy() -> None:
    assert CHUNKING_STRATEGIES == (
        "auto",
        "fixed_tokens",
        "sentence",
        "paragraph",
        "recursive",
        "semantic",
        "hierarchical",
        "heading",
        "code",
        "table",
    )
    for name in CHUNKING_STRATEGIES:
        assert build_chunker(name, COUNTER, ChunkingConfig(), embed=fake_embed).name == name
    assert build_chunker("", COUNTER).name == "auto"


def test_unknown_strategy_lists_the_valid_ones() -> None:
    with pytest.raises(InvalidInputError) as caught:
        build_chunker("wordcount", COUNTER)
    assert "fixed_tokens" in caught.value.message and "hierarchical" in caught.value.message
    assert caught.value.field_violations[0][0] == "chunking.strategy"


def test_semantic_needs_an_embedding_function() -> None:
    with pytest.raises(InvalidInputError, match="embedding function"):
        build_chunker("semantic", COUNTER, ChunkingConfig())


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (ChunkingConfig(chunk_size=300), "chunking.chunk_size"),
        (ChunkingConfig(chunk_size=0), "chunking.chunk_size"),
        (ChunkingConfig(chunk_size=100, overlap=100), "chunking.overlap"),
        (ChunkingConfig(overlap=-1), "chunking.overlap"),
        (ChunkingConfig(child_size=0), "chunking.child_size"),
        (ChunkingConfig(parent_size=50), "chunking.parent_size"),
        (ChunkingConfig(semantic_percentile=100.0), "chunking.semantic_percentile"),
    ],
)
def test_invalid_config_is_rejected_with_a_clear_message(config: ChunkingConfig, field: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        build_chunker("recursive", COUNTER, config)
    assert caught.value.field_violations[0][0] == field
    assert "invalid chunking config" in caught.value.message


def test_default_overlap_is_15_percent_of_the_size() -> None:
    assert ChunkingConfig().overlap_tokens == 30
    assert ChunkingConfig(chunk_size=100).overlap_tokens == 15
    assert ChunkingConfig(overlap=0).overlap_tokens == 0


def test_windows_cut_on_token_boundaries_at_whitespace_and_keep_the_text() -> None:
    text = " ".join(f"word{k:03d}long" for k in range(200))
    counter = ThreeLetterPieces()
    tokenized = TokenizedText(text, counter.spans(text))
    windows = tokenized.windows(0, len(text), 50, 10)
    assert len(windows) > 5
    for start, end in windows:
        assert counter.count(text[start:end]) <= 50
        assert start == 0 or text[start - 1] == " "  # starts at a word
        assert end == len(text) or text[end] == " "  # ends at a word
    starts = [w[0] for w in windows]
    ends = [w[1] for w in windows]
    assert all(s < e for s, e in zip(starts[1:], ends[:-1], strict=True))  # they overlap
    assert starts == sorted(starts) and ends[-1] == len(text)


def test_windows_absorb_a_tiny_remainder() -> None:
    text = " ".join(f"w{k}" for k in range(105))
    tokenized = TokenizedText(text, COUNTER.spans(text))
    assert len(tokenized.windows(0, len(text), 50, 0)) == 3
    assert len(tokenized.windows(0, len(text), 50, 0, absorb=5, limit=60)) == 2


def test_document_view_ignores_blank_blocks_and_maps_offsets_to_blocks() -> None:
    document = ExtractedDocument(
        "text/plain",
        [
            Block(BlockKind.PARAGRAPH, "one two", 1),
            Block(BlockKind.OTHER, "  "),
            Block(BlockKind.PARAGRAPH, "three", 2),
        ],
    )
    view = DocumentView(document, COUNTER)
    assert view.text == "one two\n\nthree" and view.total_tokens == 3
    assert [view.block_at(0), view.block_at(8), view.block_at(9)] == [0, 0, 1]
    assert view.block_span(1) == (9, 14)
    assert view.render([(0, 3), (9, 14)]) == "one\n\nthree"
    assert view.render([(0, 7), (9, 14)]) == "one two\n\nthree"


def test_chunkers_built_directly_check_their_config_too() -> None:
    from ingest_service.chunking import RecursiveChunker

    with pytest.raises(InvalidInputError, match="overlap"):
        RecursiveChunker(COUNTER, ChunkingConfig(chunk_size=50, overlap=60))
