"""DOCX (python-docx): the body in order, paragraphs and tables interleaved.

Headings come from Heading N / Title styles and outline levels; numbered and bulleted
paragraphs (numPr on the paragraph or its style) become LIST_ITEM blocks rendered with
"- " or "1. "; tables become Markdown TABLE blocks with merged cells repeated; text boxes
are read after the paragraph that anchors them. Page headers and footers are never read
(they are not in the body). Before python-docx opens the file the zip is checked against
the decompression-bomb limits.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import docx
from lxml import etree

from ingest_service.extract.base import MEDIA_DOCX, ExtractionLimits, SectionTracker, markdown_table
from ingest_service.extract.docx_archive import check_zip_limits, is_strict_ooxml
from ragrpc.errors import DocumentParseError
from ragrpc.models import Block, BlockKind, DocumentMetadata, ExtractedDocument

__all__ = ["DocxExtractor", "check_zip_limits", "list_marker"]

logger = logging.getLogger(__name__)

_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_M = "http://schemas.openxmlformats.org/officeDocument/2006/math"
_MC = "http://schemas.openxmlformats.org/markup-compatibility/2006"
_HEADING_NAME = re.compile(r"^(?:heading|überschrift|titre|titolo|encabezado|kop)\s*(\d)$", re.IGNORECASE)


def _w(tag: str) -> str:
    return f"{{{_W}}}{tag}"


def _wval(element: Any, path: str) -> str | None:
    """w:val of the first element at path (w: prefixed, '/' separated) under element."""
    found = element.find("/".join(_w(part) for part in path.split("/"))) if element is not None else None
    return found.get(_w("val")) if found is not None else None


@dataclass
class _StyleInfo:
    name: str = ""
    outline_level: int | None = None
    num_id: str | None = None
    ilvl: int = 0
    based_on: str | None = None


def _read_styles(document: Any) -> dict[str, _StyleInfo]:
    styles: dict[str, _StyleInfo] = {}
    for style in document.styles.element.findall(_w("style")):
        style_id = style.get(_w("styleId"))
        if not style_id:
            continue
        outline = _wval(style, "pPr/outlineLvl")
        styles[style_id] = _StyleInfo(
            name=(_wval(style, "name") or "").strip(),
            outline_level=int(outline) if outline and outline.isdigit() else None,
            num_id=_wval(style, "pPr/numPr/numId"),
            ilvl=int(_wval(style, "pPr/numPr/ilvl") or 0),
            based_on=_wval(style, "basedOn"),
        )
    return styles


def _read_numbering(document: Any) -> dict[tuple[str, int], tuple[str, int]]:
    """(numId, ilvl) -> (numFmt, start)."""
    try:
        root = document.part.numbering_part.element
    except (KeyError, NotImplementedError, AttributeError):
        return {}
    abstract: dict[str, dict[int, tuple[str, int]]] = {}
    for node in root.findall(_w("abstractNum")):
        levels = {}
        for lvl in node.findall(_w("lvl")):
            start = _wval(lvl, "start") or "1"
            levels[int(lvl.get(_w("ilvl"), "0"))] = (
                _wval(lvl, "numFmt") or "decimal",
                int(start) if start.isdigit() else 1,
            )
        abstract[node.get(_w("abstractNumId"), "")] = levels
    result: dict[tuple[str, int], tuple[str, int]] = {}
    for num in root.findall(_w("num")):
        levels = abstract.get(_wval(num, "abstractNumId") or "", {})
        for ilvl, fmt in levels.items():
            result[(num.get(_w("numId"), ""), ilvl)] = fmt
    return result


def _roman(number: int) -> str:
    numerals = (
        (1000, "m"),
        (900, "cm"),
        (500, "d"),
        (400, "cd"),
        (100, "c"),
        (90, "xc"),
        (50, "l"),
        (40, "xl"),
        (10, "x"),
        (9, "ix"),
        (5, "v"),
        (4, "iv"),
        (1, "i"),
    )
    out = []
    for value, letters in numerals:
        count, number = divmod(number, value)
        out.append(letters * count)
    return "".join(out)


def list_marker(num_fmt: str, number: int) -> str:
    """The rendered marker of a list item: "- " for bullets, "3. ", "c. ", "iv. " otherwise."""
    if num_fmt in ("bullet", "none", ""):
        return "- "
    if num_fmt in ("lowerLetter", "upperLetter"):
        letter = chr(ord("a") + (number - 1) % 26)
        return (letter.upper() if num_fmt == "upperLetter" else letter) + ". "
    if num_fmt in ("lowerRoman", "upperRoman"):
        roman = _roman(max(number, 1))
        return (roman.upper() if num_fmt == "upperRoman" else roman) + ". "
    return f"{number}. "


def _text_of(element: Any) -> str:
    """Visible text of a paragraph or cell, skipping text boxes and fallback duplicates."""
    parts: list[str] = []
    stack = [element]
    while stack:
        node = stack.pop()
        tag = node.tag if isinstance(node.tag, str) else ""
        if tag in (_w("txbxContent"), f"{{{_MC}}}Fallback", _w("delText")):
            continue
        if tag in (_w("t"), f"{{{_M}}}t") and node.text:
            parts.append(node.text)
        elif tag == _w("tab"):
            parts.append("\t")
        elif tag in (_w("br"), _w("cr")):
            parts.append("\n")
        elif tag == _w("p") and node is not element:
            parts.append("\n")
        stack.extend(reversed(node))
    return "".join(parts).strip()


def _text_boxes(paragraph: Any) -> list[Any]:
    """txbxContent elements anchored in this paragraph (not their mc:Fallback copies)."""
    found = []
    stack = list(paragraph)
    while stack:
        node = stack.pop()
        tag = node.tag if isinstance(node.tag, str) else ""
        if tag == f"{{{_MC}}}Fallback":
            continue
        if tag == _w("txbxContent"):
            found.append(node)
            continue
        stack.extend(node)
    return found


@dataclass
class _BodyReader:
    styles: dict[str, _StyleInfo]
    numbering: dict[tuple[str, int], tuple[str, int]]
    limits: ExtractionLimits
    blocks: list[Block] = field(default_factory=list)
    sections: SectionTracker = field(default_factory=SectionTracker)
    counters: dict[tuple[str, int], int] = field(default_factory=dict)

    def read(self, body: Any) -> list[Block]:
        stack: list[Any] = list(reversed(body))
        while stack:
            node = stack.pop()
            tag = node.tag if isinstance(node.tag, str) else ""
            if tag == _w("p"):
                self.paragraph(node)
                stack.extend(reversed(_text_boxes(node)))
            elif tag == _w("tbl"):
                stack.extend(reversed(self.table(node)))
            elif tag in (_w("sdt"), _w("sdtContent"), _w("customXml"), _w("txbxContent")):
                stack.extend(reversed(node))
        return self.blocks

    def _style_chain(self, style_id: str | None) -> Iterator[_StyleInfo]:
        seen: set[str] = set()
        while style_id and style_id in self.styles and style_id not in seen:
            seen.add(style_id)
            yield self.styles[style_id]
            style_id = self.styles[style_id].based_on

    def heading_level(self, p: Any, style_id: str | None) -> int | None:
        own = _wval(p, "pPr/outlineLvl")
        if own and own.isdigit() and int(own) < 9:
            return int(own) + 1
        for style in self._style_chain(style_id):
            if style.name.lower() == "title":
                return 0
            match = _HEADING_NAME.match(style.name)
            if match:
                return int(match.group(1))
            if style.outline_level is not None and style.outline_level < 9:
                return style.outline_level + 1
        return None

    def list_info(self, p: Any, style_id: str | None) -> tuple[str, int] | None:
        num_id, ilvl = _wval(p, "pPr/numPr/numId"), _wval(p, "pPr/numPr/ilvl")
        style_name = ""
        for style in self._style_chain(style_id):
            style_name = style_name or style.name
            if num_id is None and style.num_id is not None:
                num_id, ilvl = style.num_id, ilvl or str(style.ilvl)
        if num_id is None and style_name.lower().startswith(("list bullet", "list number")):
            num_id = "style:" + style_name.lower()
        if num_id is None or num_id == "0":
            return None
        return num_id, int(ilvl) if ilvl and ilvl.isdigit() else 0

    def paragraph(self, p: Any) -> None:
        text = _text_of(p)
        if not text:
            return
        style_id = _wval(p, "pPr/pStyle")
        level = self.heading_level(p, style_id)
        if level is not None:
            path = self.sections.enter(level, text.replace("\n", " "))
            self.blocks.append(Block(BlockKind.HEADING, text, section_path=path, level=max(level, 1)))
            return
        info = self.list_info(p, style_id)
        if info is None:
            self.blocks.append(Block(BlockKind.PARAGRAPH, text, section_path=self.sections.path))
            return
        marker = self.next_marker(*info)
        self.blocks.append(Block(BlockKind.LIST_ITEM, marker + text, section_path=self.sections.path, level=info[1]))

    def next_marker(self, num_id: str, ilvl: int) -> str:
        fmt, start = self.numbering.get((num_id, ilvl), ("decimal" if "number" in num_id else "bullet", 1))
        for key in [k for k in self.counters if k[0] == num_id and k[1] > ilvl]:
            del self.counters[key]  # a shallower item restarts deeper levels
        number = self.counters.get((num_id, ilvl), start - 1) + 1
        self.counters[(num_id, ilvl)] = number
        return list_marker(fmt, number)

    def table(self, tbl: Any) -> list[Any]:
        """Emit a TABLE block; a 1-row or 1-column table is layout: its cells are returned to read as body."""
        grid = _table_grid(tbl, self.limits.max_table_cells)
        if len(grid) < 2 or max(len(row) for row in grid) < 2:
            cells = (tc for tr in tbl.findall(_w("tr")) for tc in tr.findall(_w("tc")))
            return [child for tc in cells for child in tc if child.tag in (_w("p"), _w("tbl"), _w("sdt"))]
        text, header = markdown_table(grid)
        if text:
            self.blocks.append(Block(BlockKind.TABLE, text, section_path=self.sections.path, table_header=header))
        return []


def _table_grid(tbl: Any, max_cells: int) -> list[list[str]]:
    """Cell texts on the table grid: horizontal and vertical merges repeat the merged text."""
    grid: list[list[str]] = []
    cells = 0
    for tr in tbl.findall(_w("tr")):
        row = [""] * int(_wval(tr, "trPr/gridBefore") or 0)
        for tc in tr.findall(_w("tc")):
            span = int(_wval(tc, "tcPr/gridSpan") or 1)
            merge = tc.find(f"{_w('tcPr')}/{_w('vMerge')}")
            col = len(row)
            if merge is not None and merge.get(_w("val"), "continue") != "restart" and grid:
                above = grid[-1]
                text = above[col] if col < len(above) else ""
            else:
                text = _text_of(tc).replace("\n", " ")
            row.extend([text] * span)
        grid.append(row)
        cells += len(row)
        if cells > max_cells:
            logger.warning("DOCX table cut at %s rows (max_table_cells)", len(grid))
            break
    return grid


def _core_metadata(document: Any) -> DocumentMetadata:
    props = document.core_properties
    extra = {
        k: v for k, v in (("subject", props.subject), ("keywords", props.keywords), ("category", props.category)) if v
    }
    return DocumentMetadata(
        title=(props.title or "").strip(),
        author=(props.author or "").strip(),
        created=props.created.isoformat() if props.created else "",
        modified=props.modified.isoformat() if props.modified else "",
        language=(props.language or "").split("-")[0].lower(),
        extra=extra,
    )


def _open(data: bytes) -> Any:
    try:
        return docx.Document(io.BytesIO(data))
    except Exception as exc:  # python-docx raises KeyError, ValueError, lxml errors...
        hint = " (it is ISO/IEC 29500 Strict Open XML, which is not supported)" if is_strict_ooxml(data) else ""
        raise DocumentParseError(f"cannot read this .docx file{hint}: {type(exc).__name__}: {exc}") from exc


class DocxExtractor:
    """application/vnd.openxmlformats-officedocument.wordprocessingml.document."""

    media_types: tuple[str, ...] = (MEDIA_DOCX,)

    def __init__(self, limits: ExtractionLimits | None = None) -> None:
        self.limits = limits or ExtractionLimits()

    def extract(self, data: bytes, *, password: str = "") -> ExtractedDocument:
        check_zip_limits(data, self.limits)
        document = _open(data)
        try:
            reader = _BodyReader(_read_styles(document), _read_numbering(document), self.limits)
            blocks = reader.read(document.element.body)
            metadata = _core_metadata(document)
        except (etree.LxmlError, ValueError, KeyError) as exc:
            raise DocumentParseError(f"cannot read the body of this .docx file: {exc}") from exc
        return ExtractedDocument(media_type=MEDIA_DOCX, blocks=blocks, metadata=metadata)
