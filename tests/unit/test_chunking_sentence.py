"""sentence: the sentence splitter and whole-sentence packing."""

from __future__ import annotations

from itertools import pairwise

import pytest

from ingest_service.chunking import ChunkingConfig, SentenceChunker
from ingest_service.chunking.units import split_sentences
from ragrpc.models import Block, BlockKind, ExtractedDocument
from ragrpc.tokens import WordTokenCounter

COUNTER = WordTokenCounter()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "Dr. Smith paid $3.50 for it, i.e. a bargain. Then he left! Was it approx. five? Yes.",
            ["Dr. Smith paid $3.50 for it, i.e. a bargain.", "Then he left!", "Was it approx. five?", "Yes."],
        ),
        (
            "See Fig. 3 and e.g. Table 2. The U.S. Army agreed. Version 2.1 is out.",
            ["See Fig. 3 and e.g. Table 2.", "The U.S. Army agreed.", "Version 2.1 is out."],
        ),
        (
            'He said "Stop." Then J. R. Tolkien wrote. (It ended.) Next.',
            ['He said "Stop."', "Then J. R. Tolkien wrote.", "(It ended.)", "Next."],
        ),
        (
            "Steps:\n1. Open it.\n2. Close it.\n\nA new paragraph",
            ["Steps:", "1. Open it.", "2. Close it.", "A new paragraph"],
        ),
        (
            "It rose 12.5% in 1999. Costs etc. were high. Done",
            ["It rose 12.5% in 1999.", "Costs etc. were high.", "Done"],
        ),
        ("no punctuation at all", ["no punctuation at all"]),
        ("", []),
    ],
)
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


def _sentence(tag: str, length: int) -> str:
    return " ".join([tag.capitalize()] + [f"{tag}{k}" for k in range(length - 2)]) + "."


def test_whole_sentences_are_packed_up_to_the_size() -> None:
    sentences = [_sentence(f"s{n}w", 9 + n % 5) for n in range(40)]
    document = ExtractedDocument("text/plain", [Block(BlockKind.PARAGRAPH, " ".join(sentences))])
    config = ChunkingConfig(chunk_size=50, overlap=0, max_tokens=60, min_chunk_tokens=0)
    chunks = SentenceChunker(COUNTER, config).chunk(document)
    rebuilt = [s for c in chunks for s in split_sentences(c.text)]
    assert rebuilt == sentences  # no sentence cut, none repeated, order kept
    assert all(COUNTER.count(c.text) <= 50 for c in chunks)
    for c, following in pairwise(chunks):  # full: the next sentence would not fit
        assert COUNTER.count(c.text) + COUNTER.count(split_sentences(following.text)[0]) > 50


def test_only_a_sentence_over_max_tokens_is_cut() -> None:
    medium = _sentence("medium", 55)  # over chunk_size, within max_tokens: kept whole
    huge = _sentence("huge", 150)
    document = ExtractedDocument("text/plain", [Block(BlockKind.PARAGRAPH, f"Short one. {medium} {huge} End.")])
    config = ChunkingConfig(chunk_size=50, overlap=0, max_tokens=60, min_chunk_tokens=0)
    chunks = SentenceChunker(COUNTER, config).chunk(document)
    assert any(c.text == medium for c in chunks)
    huge_parts = [c for c in chunks if "huge" in c.text]
    assert len(huge_parts) == 3
    assert all(COUNTER.count(c.text) <= 60 for c in chunks)
