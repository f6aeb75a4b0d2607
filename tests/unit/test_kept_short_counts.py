"""KeptShortCounts: a document's header counts are kept across its chunks, chunk texts are not."""

from __future__ import annotations

from ragrpc.tokens import KeptShortCounts, WordTokenCounter


class CountingWords(WordTokenCounter):
    def __init__(self) -> None:
        self.asked: list[str] = []

    def count(self, text: str) -> int:
        self.asked.append(text)
        return super().count(text)


def test_a_short_text_is_counted_once_and_a_long_one_every_time() -> None:
    inner = CountingWords()
    counts = KeptShortCounts(inner, kept_chars=20)
    header, chunk = "Acme 10-K FY2017", "word " * 10
    assert [counts.count(header) for _ in range(3)] == [5, 5, 5]
    assert [counts.count(chunk) for _ in range(2)] == [10, 10]
    assert inner.asked == [header, chunk, chunk]
    assert counts.spans("a b") == inner.spans("a b")
