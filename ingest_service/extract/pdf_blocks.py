"""PDF paragraphs and blocks: lines in reading order grouped into paragraphs and list
items, tables continued across pages, headings found from font size (ranked) or bold."""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass

from ingest_service.extract.base import SectionTracker
from ingest_service.extract.pdf_cleanup import join_lines
from ingest_service.extract.pdf_layout import Line, Page, order_lines
from ragrpc.models import Block, BlockKind

_BULLET = re.compile(r"^(?:[•◦▪▫‣∙●○■□➢►–]|[-*])\s+")
_NUMBERED = re.compile(r"^(?:\d{1,2}|[a-z]|[ivx]{1,4})[.)]\s+\S")


@dataclass
class Paragraph:
    kind: BlockKind
    text: str
    page: int
    size: float = 0.0
    bold: bool = False
    lines: int = 1
    table_header: str = ""
    caption: str = ""  # TABLE: the table's caption (a one-cell first row)
    continues: bool = False  # TABLE: goes on with the table at the end of the page before


def _starts_item(text: str) -> bool:
    return bool(_BULLET.match(text) or _NUMBERED.match(text))


def _breaks_paragraph(current: list[Line], line: Line) -> bool:
    prev = current[-1]
    if (prev.band, prev.column) != (line.band, line.column) or _starts_item(line.text):
        return True
    height = max(prev.bottom - prev.top, 1.0)
    gap = line.top - prev.bottom
    if gap > 0.7 * height or gap < -0.5 * height:
        return True
    if abs(line.size - prev.size) > 0.15 * max(line.size, prev.size):
        return True
    if prev.words and line.words and prev.words[0].bold != line.words[0].bold and all(w.bold for w in prev.words):
        return True
    indented = line.x0 > prev.x0 + 0.5 * height and not _starts_item(current[0].text)
    return indented and len(current) > 1


def _paragraph(lines: list[Line], page: int) -> Paragraph:
    text = join_lines([line.text for line in lines])
    kind = BlockKind.LIST_ITEM if _starts_item(text) else BlockKind.PARAGRAPH
    if _BULLET.match(text):
        text = "- " + _BULLET.sub("", text, count=1)
    sizes = [w.size for line in lines for w in line.words]
    bold = all(w.bold for line in lines for w in line.words)
    return Paragraph(kind, text, page, statistics.median(sizes), bold, len(lines))


def page_paragraphs(page: Page) -> list[Paragraph]:
    out: list[Paragraph] = []
    current: list[Line] = []
    for line in order_lines(page):
        if line.table is not None:
            if current:
                out.append(_paragraph(current, page.number))
                current = []
            text, header, caption = line.table
            if caption:
                out.append(Paragraph(BlockKind.PARAGRAPH, caption, page.number))
            out.append(Paragraph(BlockKind.TABLE, text, page.number, table_header=header, caption=caption))
            continue
        if current and _breaks_paragraph(current, line):
            out.append(_paragraph(current, page.number))
            current = []
        current.append(line)
    if current:
        out.append(_paragraph(current, page.number))
    return out


def _body_size(paragraphs: list[Paragraph]) -> float:
    weights: Counter[float] = Counter()
    for p in paragraphs:
        if p.kind is not BlockKind.TABLE and p.size:
            weights[round(p.size * 2) / 2] += len(p.text)
    return weights.most_common(1)[0][0] if weights else 0.0


def _heading_kind(p: Paragraph, body: float) -> str:
    """'size', 'bold' or '' for a paragraph that looks like a heading."""
    text = p.text
    if p.kind is not BlockKind.PARAGRAPH or not body or p.lines > 3 or not 2 <= len(text) <= 200:
        return ""
    if text.endswith((".", ",", ";")) or sum(c.isalpha() for c in text) < 0.5 * len(text.replace(" ", "")):
        return ""
    if p.size >= 1.15 * body:
        return "size"
    return "bold" if p.bold and p.lines <= 2 and len(text) <= 120 and p.size >= 0.95 * body else ""


def _continue_tables(paragraphs: list[Paragraph]) -> None:
    """A table at the top of a page that has as many columns as the table that ended the page
    before (nothing between them but the page break) goes on with it: it is marked as a
    continuation, gets that table's header (when the page did not repeat it, its first row,
    taken for a header, is a body row) and its caption."""
    for prev, cur in zip(paragraphs, paragraphs[1:], strict=False):
        if prev.kind is not BlockKind.TABLE or cur.kind is not BlockKind.TABLE or cur.page != prev.page + 1:
            continue
        if prev.table_header.count("---") != cur.table_header.count("---"):
            continue
        cur.continues = True
        cur.caption = cur.caption or prev.caption
        if cur.table_header == prev.table_header:
            continue
        first_row = cur.table_header.split("\n")[0]
        body = cur.text.split("\n")[2:]
        cur.text = "\n".join([prev.table_header, first_row, *body])
        cur.table_header = prev.table_header


def build_blocks(paragraphs: list[Paragraph]) -> list[Block]:
    """Blocks with heading levels (by font size rank, bold-only last) and section paths."""
    _continue_tables(paragraphs)
    body = _body_size(paragraphs)
    kinds = [_heading_kind(p, body) for p in paragraphs]
    sizes = sorted({round(p.size * 2) / 2 for p, k in zip(paragraphs, kinds, strict=True) if k == "size"}, reverse=True)
    rank = {size: min(i + 1, 5) for i, size in enumerate(sizes)}
    sections = SectionTracker()
    blocks: list[Block] = []
    for p, kind in zip(paragraphs, kinds, strict=True):
        if kind:
            level = rank[round(p.size * 2) / 2] if kind == "size" else min(len(rank) + 1, 6)
            path = sections.enter(level, p.text)
            blocks.append(Block(BlockKind.HEADING, p.text, page=p.page, section_path=path, level=level))
        else:
            level = 0
            blocks.append(
                Block(
                    p.kind,
                    p.text,
                    page=p.page,
                    section_path=sections.path,
                    level=level,
                    table_header=p.table_header,
                    table_caption=p.caption,
                    continues_table=p.continues,
                )
            )
    return blocks
