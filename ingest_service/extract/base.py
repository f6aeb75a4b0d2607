"""What every extractor shares: the Extractor protocol, the limits, and small helpers
(Markdown table rendering, heading-path tracking) used by several formats."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ragrpc.models import ExtractedDocument

MEDIA_PDF = "application/pdf"
MEDIA_DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
MEDIA_HTML = "text/html"
MEDIA_MARKDOWN = "text/markdown"
MEDIA_TEXT = "text/plain"
MEDIA_CSV = "text/csv"


@runtime_checkable
class Extractor(Protocol):
    """Turns the bytes of one document format into blocks in reading order."""

    media_types: tuple[str, ...]

    def extract(self, data: bytes, *, password: str = "") -> ExtractedDocument: ...


@dataclass(frozen=True)
class ExtractionLimits:
    """Guards against hostile or huge inputs; exceeding one raises LimitExceededError."""

    max_pages: int = 2000  # PDF pages
    max_seconds: float = 600.0  # wall time for one PDF, checked between pages
    max_docx_uncompressed_bytes: int = 200 * 1024 * 1024  # decompression-bomb guard
    max_docx_compression_ratio: float = 100.0  # uncompressed / compressed, whole archive
    max_zip_entries: int = 10_000
    max_html_depth: int = 2000  # deeper elements are read as flat text, never recursed into
    max_table_cells: int = 200_000  # one table; larger ones are cut and logged


_WS = re.compile(r"\s+")


def table_cell_text(value: object) -> str:
    """One Markdown table cell: single line, collapsed whitespace, pipes escaped."""
    if value is None:
        return ""
    text = _WS.sub(" ", str(value)).strip()
    return text.replace("|", "\\|")


def markdown_table(rows: Sequence[Sequence[object]]) -> tuple[str, str]:
    """Render rows (first row = header) as a Markdown table.

    Returns (table text, header + separator lines); ("", "") when nothing is left after
    dropping empty rows and empty columns.
    """
    cells = [[table_cell_text(c) for c in row] for row in rows]
    cells = [row for row in cells if any(row)]
    if not cells:
        return "", ""
    width = max(len(row) for row in cells)
    cells = [row + [""] * (width - len(row)) for row in cells]
    keep = [i for i in range(width) if any(row[i] for row in cells)]
    cells = [[row[i] for i in keep] for row in cells]
    lines = ["| " + " | ".join(row) + " |" for row in cells]
    separator = "| " + " | ".join("---" for _ in keep) + " |"
    header = lines[0] + "\n" + separator
    return "\n".join([header, *lines[1:]]), header


class SectionTracker:
    """Keeps the heading hierarchy while walking a document top to bottom."""

    def __init__(self) -> None:
        self._stack: list[tuple[int, str]] = []

    def enter(self, level: int, title: str) -> tuple[str, ...]:
        """Record a heading; returns its own section path (ending with its title)."""
        while self._stack and self._stack[-1][0] >= level:
            self._stack.pop()
        self._stack.append((level, title))
        return self.path

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(title for _, title in self._stack)
