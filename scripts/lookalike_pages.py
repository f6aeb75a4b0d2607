"""Pages of a PDF as pdfplumber reads them, cut into passages for the look-alike questions
(scripts/lookalike_questions.py): table rows, and pairs of consecutive lines of one column."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WORD_GAP_EM = 0.15  # a gap wider than this (in font sizes) between characters separates words
GAP_EM = 0.9  # a gap wider than this (in word heights) between words cuts a line into segments


@dataclass(frozen=True)
class PageText:
    """One page: its full text (pdfplumber's extract_text) and its passages."""

    document_id: str
    page: int  # 1-based
    text: str
    passages: tuple[str, ...]


def _lines(words: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Words grouped into lines by their top (3 pt tolerance), each line left to right."""
    lines: list[list[dict[str, Any]]] = []
    for word in sorted(words, key=lambda w: (round(float(w["top"])), float(w["x0"]))):
        if lines and abs(float(word["top"]) - float(lines[-1][0]["top"])) <= 3:
            lines[-1].append(word)
        else:
            lines.append([word])
    return [sorted(line, key=lambda w: float(w["x0"])) for line in lines]


def _segments(line: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A line cut at gaps wider than GAP_EM word heights (column gutters, table cells)."""
    segments = [[line[0]]]
    for left, right in zip(line, line[1:], strict=False):
        height = max(float(left["bottom"]) - float(left["top"]), 1.0)
        if float(right["x0"]) - float(left["x1"]) > GAP_EM * height:
            segments.append([right])
        else:
            segments[-1].append(right)
    return segments


def _join(*pieces: list[str]) -> str:
    """Words of consecutive lines, a word hyphenated across the break joined again."""
    words: list[str] = []
    for piece in pieces:
        if words and words[-1].endswith("-") and len(words[-1]) > 1 and piece:
            words[-1] = words[-1][:-1] + piece[0]
            words.extend(piece[1:])
        else:
            words.extend(piece)
    return " ".join(words)


def page_passages(words: list[dict[str, Any]]) -> list[str]:
    """Table rows (a line of three or more segments, most of them short) and pairs of consecutive lines
    of one column (segments starting at the same x within half a word height)."""
    passages: list[str] = []
    previous: list[tuple[float, float, list[str]]] = []  # (x0, height, words) of the last line's segments
    for line in _lines(words):
        segments = _segments(line)
        texts = [[str(w["text"]) for w in segment] for segment in segments]
        if len(segments) >= 3 and sorted(map(len, texts))[len(texts) // 2] <= 3:
            passages.append(" ".join(" ".join(t) for t in texts))
            previous = []
            continue
        current = []
        for segment, text in zip(segments, texts, strict=True):
            x0, height = float(segment[0]["x0"]), max(float(segment[0]["bottom"]) - float(segment[0]["top"]), 1.0)
            above = next((p for p in previous if abs(p[0] - x0) <= height / 2), None)
            passages.append(_join(above[2], text) if above else " ".join(text))
            current.append((x0, height, text))
        previous = current
    return passages


def duplicate_chars(chars: Iterable[dict[str, Any]]) -> set[int]:
    """ids of characters drawn again within a point of an earlier one with the same text, font
    and size (pdfplumber's dedupe_chars, in linear time: cells of one point)."""
    seen: dict[tuple[Any, ...], list[tuple[float, float]]] = {}
    duplicates: set[int] = set()
    for char in chars:
        x, y = float(char["x0"]), float(char["top"])
        style = (char["text"], char.get("fontname"), round(float(char.get("size", 0)), 1))
        cells = ((*style, int(x) + dx, int(y) + dy) for dx in (-1, 0, 1) for dy in (-1, 0, 1))
        if any(abs(px - x) <= 1 and abs(py - y) <= 1 for cell in cells for px, py in seen.get(cell, ())):
            duplicates.add(id(char))
        else:
            seen.setdefault((*style, int(x), int(y)), []).append((x, y))
    return duplicates


def read_pdf(path: Path, document_id: str) -> list[PageText]:
    import pdfplumber  # the ingest service's dependency; imported here so the module loads without it

    pages: list[PageText] = []
    with pdfplumber.open(path) as pdf:
        for number, page in enumerate(pdf.pages, start=1):
            duplicates = duplicate_chars(page.chars)  # text drawn twice (fake bold) is read once

            def once(obj: dict[str, Any], duplicates: set[int] = duplicates) -> bool:
                return id(obj) not in duplicates

            readable = page.filter(once) if duplicates else page
            text = readable.extract_text(x_tolerance_ratio=WORD_GAP_EM) or ""
            passages = tuple(page_passages(readable.extract_words(x_tolerance_ratio=WORD_GAP_EM)))
            pages.append(PageText(document_id, number, text, passages))
            page.close()
    return pages
