"""TiktokenCounter.spans (the chunkers' token offsets): each token spans the characters of its own bytes
decoded alone, one token after the other; the per-token lengths it keeps give the same spans as decoding every
token again, on ASCII, accented, CJK and emoji text (a character split between two tokens counts in neither)."""

from __future__ import annotations

import random

import pytest

from ragrpc.tokens import TiktokenCounter


@pytest.fixture(scope="module")
def counter() -> TiktokenCounter:
    return TiktokenCounter()


def _decoded_one_by_one(counter: TiktokenCounter, text: str) -> list[tuple[int, int]]:
    encoding = counter._encoding  # noqa: SLF001 - the reference decodes each token itself
    spans, offset = [], 0
    for token in encoding.encode(text, disallowed_special=()):
        length = len(encoding.decode_single_token_bytes(token).decode("utf-8", errors="ignore"))
        spans.append((offset, offset + length))
        offset += length
    return spans


def _random_text(rng: random.Random) -> str:
    ranges = [(32, 126), (0xA0, 0x7FF), (0x4E00, 0x9FFF), (0x1F300, 0x1F6FF)]
    chars = []
    for _ in range(rng.randint(1, 300)):
        low, high = rng.choice(ranges)
        chars.append(chr(rng.randint(low, high)))
    return "".join(chars)


def test_spans_match_decoding_every_token_alone(counter: TiktokenCounter) -> None:
    rng = random.Random(7)
    texts = [
        "a",
        "Grey herons stand still in shallow water.\n\nThey nest in colonies.",
        "Zürich — 東京 🦆 naïve café",
        "😀" * 40,
        "中文字符测试 " * 20,
        *(_random_text(rng) for _ in range(150)),
    ]
    for text in texts:
        assert counter.spans(text) == _decoded_one_by_one(counter, text), text[:40]
    assert counter.spans("") == []


def test_ascii_spans_cover_the_text_exactly(counter: TiktokenCounter) -> None:
    text = "The ingest service frames each chunk with its token count: spans cover every character once."
    spans = counter.spans(text)
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(end == next_start for (_, end), (next_start, _) in zip(spans, spans[1:], strict=False))
    assert "".join(text[start:end] for start, end in spans) == text
