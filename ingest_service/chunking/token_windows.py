"""A text tokenized once (`TokenizedText`): any of its character ranges counted by bisecting the
token spans, and cut into token windows at token boundaries, preferably at whitespace, with
overlap; what every chunker's sizes rest on."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from ragrpc.tokens import Span

Range = tuple[int, int]  # [start, end) character offsets in DocumentView.text


def trim_range(text: str, start: int, end: int) -> Range:
    """The range without leading/trailing whitespace (empty ranges collapse to start)."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


class TokenizedText:
    """A text tokenized once; counts and cuts any of its char ranges on token spans."""

    def __init__(self, text: str, spans: Sequence[Span]) -> None:
        self.text = text
        self._starts = [s for s, _ in spans]
        self._ends = [e for _, e in spans]

    @property
    def total_tokens(self) -> int:
        return len(self._starts)

    def count(self, start: int, end: int) -> int:
        """Tokens that start inside [start, end)."""
        return bisect.bisect_left(self._starts, end) - bisect.bisect_left(self._starts, start)

    def _gap_before(self, k: int) -> bool:
        """True when token k starts a word (whitespace, or nothing, before it)."""
        return k == 0 or self._starts[k] > self._ends[k - 1]

    def _cut_at_whitespace(self, first: int, stop: int, lookback: int) -> int:
        for k in range(stop, max(first + 1, stop - lookback) - 1, -1):
            if self._gap_before(k):
                return k
        return stop

    def _word_start(self, k: int, limit: int) -> int | None:
        """The first token in [k, limit) that starts a word, if any."""
        for j in range(k, limit):
            if self._gap_before(j):
                return j
        return None

    def windows(
        self, start: int, end: int, size: int, overlap: int = 0, *, absorb: int = 0, limit: int = 0
    ) -> list[Range]:
        """Cuts [start, end) into windows of at most `size` tokens (trimmed char ranges of
        the original text), consecutive windows sharing about `overlap` tokens. Cuts fall
        on token boundaries, preferably at whitespace. A last remainder of <= `absorb`
        tokens joins the window before it when that stays within `limit` tokens."""
        first = bisect.bisect_left(self._starts, start)
        stop = bisect.bisect_left(self._starts, end)
        if stop - first <= size:
            return [trim_range(self.text, start, end)]
        out: list[Range] = []
        i, char_start = first, start
        while True:
            j = min(i + size, stop)
            if j < stop and stop - j <= absorb and stop - i <= limit:
                j = stop
            elif j < stop:
                j = self._cut_at_whitespace(i, j, max(1, size // 4))
            char_end = end if j >= stop else self._starts[j]
            out.append(trim_range(self.text, char_start, char_end))
            if j >= stop:
                return [r for r in out if r[0] < r[1]]
            nxt = max(j - overlap, i + 1)
            word = self._word_start(nxt, j) if overlap else j
            i = nxt if word is None else word
            char_start = self._starts[i]

    def tail_start(self, start: int, end: int, tokens: int) -> int:
        """Offset of the first word start among the last `tokens` tokens of [start, end);
        `end` when none of them starts a word (no tail rather than half a word)."""
        stop = bisect.bisect_left(self._starts, end)
        first = max(bisect.bisect_left(self._starts, start), stop - tokens)
        if first >= stop:
            return end
        word = self._word_start(first, stop)
        return end if word is None else self._starts[word]
