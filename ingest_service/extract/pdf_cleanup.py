"""PDF text cleanup: running headers/footers (margin rows repeating on many pages, page
counters) removed, and wrapped lines joined with hyphenated words mended."""

from __future__ import annotations

import math
import re
from collections import Counter

from ingest_service.clean import is_boilerplate_line
from ingest_service.extract.pdf_layout import Page, Word

_MARGIN_KEY_EDGES = re.compile(r"^[\d\W_]+|[\d\W_]+$")
_DIGITS = re.compile(r"\d+")
_COMPOUND_PREFIXES = frozenset("non self co anti multi post pre well cross semi ex".split())
_MARGIN_ZONE = 0.12  # fraction of the page height at top and bottom where running headers live
_MARGIN_ROWS = 3


def _margin_rows(page: Page) -> set[int]:
    """Indices of the first/last rows that sit in the top/bottom margin zone."""
    found: set[int] = set()
    for i, row in enumerate(page.rows[:_MARGIN_ROWS]):
        if row[0].top < _MARGIN_ZONE * page.height:
            found.add(i)
    last = len(page.rows) - 1
    for i in range(last, max(last - _MARGIN_ROWS, -1), -1):
        if max(w.bottom for w in page.rows[i]) > (1 - _MARGIN_ZONE) * page.height:
            found.add(i)
    return found


def _margin_key(row: list[Word]) -> str:
    text = _MARGIN_KEY_EDGES.sub("", " ".join(w.text for w in row).lower())
    return _DIGITS.sub("#", text).replace(" ", "")


def remove_repeated_margins(pages: list[Page]) -> None:
    """Drop header/footer rows repeating on many pages, and page counters in the margins."""
    candidates = [_margin_rows(page) for page in pages]
    counts: Counter[str] = Counter()
    for page, rows in zip(pages, candidates, strict=True):
        counts.update({_margin_key(page.rows[i]) for i in rows} - {""})
    threshold = max(2, math.ceil(0.4 * len(pages)))
    for page, rows in zip(pages, candidates, strict=True):
        page.rows = [
            row
            for i, row in enumerate(page.rows)
            if i not in rows
            or not (counts[_margin_key(row)] >= threshold or is_boilerplate_line(" ".join(w.text for w in row)))
        ]


def join_lines(lines: list[str]) -> str:
    """Join wrapped lines with spaces; a hyphen at a line end before a lowercase letter is
    a hyphenated word and is removed."""
    parts: list[str] = []
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if parts and parts[-1].endswith("\u00ad"):
            parts[-1] = parts[-1][:-1] + line
        elif parts and len(parts[-1]) > 1 and parts[-1][-1] == "-" and parts[-1][-2].isalpha() and line[0].islower():
            stem = parts[-1][:-1].rsplit(" ", 1)[-1]
            keep_hyphen = stem.isupper() or stem.lower() in _COMPOUND_PREFIXES
            parts[-1] = (parts[-1] if keep_hyphen else parts[-1][:-1]) + line
        else:
            parts.append(line)
    return " ".join(parts)
