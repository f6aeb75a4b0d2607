"""hierarchical: PARENT chunks per section and small children pointing at them."""

from __future__ import annotations

from ingest_service.chunking import ChunkingConfig, HierarchicalChunker
from ragrpc.models import Block, BlockKind, ChunkDraft, ChunkKind, ExtractedDocument
from ragrpc.tokens import WordTokenCounter
from tests.unit.chunking_helpers import markdown_document, missing_words

COUNTER = WordTokenCounter()
CONFIG = ChunkingConfig(chunk_size=100, overlap=0, max_tokens=120, child_size=40, parent_size=150, min_chunk_tokens=5)


def _text(tag: str, sentences: int) -> str:
    return " ".join(
        f"{tag.capitalize()}{s} " + " ".join(f"{tag}{s}w{k}" for k in range(8)) + "." for s in range(sentences)
    )


def _document() -> ExtractedDocument:
    def heading(title: str, level: int, path: tuple[str, ...]) -> Block:
        return Block(BlockKind.HEADING, "#" * level + " " + title, 1, path, level=level)

    return ExtractedDocument(
        "text/markdown",
        [
            heading("Small", 1, ("Small",)),
            Block(BlockKind.PARAGRAPH, _text("ax", 3), 1, ("Small",)),
            heading("Sub", 2, ("Small", "Sub")),
            Block(BlockKind.PARAGRAPH, _text("bx", 3), 1, ("Small", "Sub")),
            heading("Huge", 1, ("Huge",)),
            Block(BlockKind.PARAGRAPH, _text("cx", 30), 2, ("Huge",)),
        ],
    )


def _children(chunks: list[ChunkDraft], parent: ChunkDraft) -> list[ChunkDraft]:
    return [c for c in chunks if c.parent_index == parent.chunk_index]


def test_children_point_to_their_parent_and_lie_inside_it() -> None:
    chunks = HierarchicalChunker(COUNTER, CONFIG).chunk(_document())
    parents = [c for c in chunks if c.kind is ChunkKind.PARENT]
    children = [c for c in chunks if c.kind is ChunkKind.RETRIEVABLE]
    assert parents and children
    assert {c.parent_index for c in children} == {p.chunk_index for p in parents}
    for parent in parents:
        assert parent.parent_index == -1
        assert COUNTER.count(parent.text) <= CONFIG.parent_size
        mine = _children(chunks, parent)
        assert all(c.text in parent.text for c in mine)
        assert " ".join(c.text for c in mine).split() == parent.text.split()  # children cover it
    assert all(COUNTER.count(c.text) <= CONFIG.child_size for c in children)
    assert {c.chunker for c in chunks} == {"hierarchical"}


def test_a_subsection_joins_its_section_and_a_huge_section_makes_several_parents() -> None:
    chunks = HierarchicalChunker(COUNTER, CONFIG).chunk(_document())
    parents = [c for c in chunks if c.kind is ChunkKind.PARENT]
    assert parents[0].text.startswith("# Small") and "## Sub" in parents[0].text
    assert parents[0].section_path == ("Small",)
    huge = [p for p in parents if "cx" in p.text]
    assert len(huge) >= 3 and all("ax" not in p.text for p in huge)
    assert [c.section_path for c in _children(chunks, parents[0])][-1] == ("Small", "Sub")


def test_real_markdown_parents_and_children_stay_within_their_sizes() -> None:
    document = markdown_document("pypdf__README.md")
    config = ChunkingConfig(parent_size=512)
    chunks = HierarchicalChunker(COUNTER, config).chunk(document)
    assert not missing_words(document, chunks)
    assert all(COUNTER.count(c.text) <= 512 for c in chunks if c.kind is ChunkKind.PARENT)
    assert all(COUNTER.count(c.text) <= config.max_tokens for c in chunks if c.kind is ChunkKind.RETRIEVABLE)
