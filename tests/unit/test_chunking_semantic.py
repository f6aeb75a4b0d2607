"""semantic: split where the topic changes (a deterministic fake embedding)."""

from __future__ import annotations

import numpy as np

from ingest_service.chunking import ChunkingConfig, SemanticChunker
from ragrpc.models import Block, BlockKind, ExtractedDocument
from ragrpc.tokens import WordTokenCounter
from tests.unit.chunking_helpers import fake_embed

COUNTER = WordTokenCounter()
CATS = [
    "Cats sleep most of the day and cats purr when calm.",
    "A cat grooms its fur, and cats purr while they groom.",
    "Kittens become cats after a year of play and purr often.",
    "Cats hunt mice at night and purr after the hunt.",
    "Older cats sleep more and purr softly in the sun.",
]
ROCKETS = [
    "Rockets burn fuel and rockets need oxygen to reach orbit.",
    "A rocket engine burns fuel with oxygen at high pressure.",
    "Rockets reach orbit when the engine burns long enough.",
    "The rocket stage separates after the fuel burns out in orbit.",
]


class CountingEmbed:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        return fake_embed(texts)


def _document() -> ExtractedDocument:
    return ExtractedDocument("text/plain", [Block(BlockKind.PARAGRAPH, " ".join(CATS + ROCKETS))])


def test_splits_at_the_topic_change_with_one_embedding_call() -> None:
    embed = CountingEmbed()
    config = ChunkingConfig(chunk_size=100, overlap=0, min_chunk_tokens=5, semantic_threshold=0.2)
    chunks = SemanticChunker(COUNTER, config, embed=embed).chunk(_document())
    assert [c.text for c in chunks] == [" ".join(CATS), " ".join(ROCKETS)]
    assert embed.calls == 1
    assert {c.chunker for c in chunks} == {"semantic"}


def test_percentile_mode_splits_at_the_weakest_link() -> None:
    config = ChunkingConfig(chunk_size=100, overlap=0, min_chunk_tokens=5, semantic_percentile=10.0)
    chunks = SemanticChunker(COUNTER, config, embed=fake_embed).chunk(_document())
    assert [c.text for c in chunks] == [" ".join(CATS), " ".join(ROCKETS)]


def test_a_long_topic_is_still_cut_at_the_size() -> None:
    text = " ".join(CATS * 4 + ROCKETS)
    document = ExtractedDocument("text/plain", [Block(BlockKind.PARAGRAPH, text)])
    config = ChunkingConfig(chunk_size=60, overlap=0, min_chunk_tokens=5, semantic_threshold=0.2)
    chunks = SemanticChunker(COUNTER, config, embed=fake_embed).chunk(document)
    assert all(COUNTER.count(c.text) <= 60 for c in chunks)
    assert chunks[-1].text == " ".join(ROCKETS)
    assert all("Rocket" not in c.text and "rocket" not in c.text for c in chunks[:-1])


def test_a_lone_odd_sentence_does_not_become_a_chunk() -> None:
    odd = "Taxes rise."
    text = " ".join(CATS[:3] + [odd] + CATS[3:])
    document = ExtractedDocument("text/plain", [Block(BlockKind.PARAGRAPH, text)])
    config = ChunkingConfig(chunk_size=60, overlap=0, min_chunk_tokens=8, semantic_threshold=0.2)
    chunks = SemanticChunker(COUNTER, config, embed=fake_embed).chunk(document)
    assert all(c.text != odd for c in chunks)
