"""HTML: main content only (no navigation, page chrome, scripts, cookie banners), headings
as section paths, paragraphs, lists, tables as Markdown, <pre> as code.

Every walk over the tree is iterative (explicit stacks), so 100,000-level nesting does
not raise RecursionError; elements deeper than ExtractionLimits.max_html_depth are read
as flat text.
"""

from __future__ import annotations

import json
import logging
import re
from types import MappingProxyType

from bs4 import BeautifulSoup, NavigableString, Tag
from bs4.element import PageElement

from ingest_service.extract.base import MEDIA_HTML, ExtractionLimits, SectionTracker, markdown_table
from ingest_service.extract.html_content import (
    SKIPPED_STRINGS,
    Landmarks,
    NoiseFilter,
    content_root,
    find_landmarks,
)
from ingest_service.extract.html_tables import int_attr, merge_header, table_grid, table_rows
from ingest_service.extract.text import decode_text
from ragrpc.errors import DocumentParseError
from ragrpc.models import Block, BlockKind, DocumentMetadata, ExtractedDocument

logger = logging.getLogger(__name__)

_HEADINGS = MappingProxyType({"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6})
_BLOCK_TAGS = frozenset(
    "p div section article main header blockquote dl dt dd figure figcaption address details "
    "summary td th tr caption hr center fieldset legend hgroup body html ul ol li table pre "
    "form nav aside footer".split()
)
_LANGUAGE_CLASS = re.compile(r"^(?:language|lang|highlight-source|highlight)-([\w+#.-]+)$")
_META_CHARSET = re.compile(rb"<meta[^>]+charset\s*=\s*[\"']?([\w.:-]+)", re.IGNORECASE)
_INLINE_WS = re.compile(r"[ \t\r\f\v\u00a0]+")
_HTML_WS = re.compile(r"\s+")  # HTML collapses all whitespace; only <br> breaks a line


def decode_html(data: bytes) -> str:
    """Decode HTML bytes: BOM / UTF-8 first, then the <meta charset>, then detection."""
    if data[:3] == b"\xef\xbb\xbf" or data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return decode_text(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    match = _META_CHARSET.search(data[:8192])
    if match:
        try:
            return data.decode(match.group(1).decode("ascii"), errors="replace")
        except LookupError:
            logger.info("unknown meta charset %s", match.group(1))
    return decode_text(data)


def _code_language(pre: Tag) -> str:
    code = pre.find("code")
    for tag in (pre, code):
        if not isinstance(tag, Tag):
            continue
        if tag.get("data-lang"):
            return str(tag["data-lang"]).lower()
        for cls in tag.get("class") or []:
            match = _LANGUAGE_CLASS.match(cls)
            if match:
                return match.group(1).lower()
    return ""


class _BlockBuilder:
    """Walks a content root in document order and emits blocks."""

    def __init__(self, root: Tag, limits: ExtractionLimits, section_prefix: tuple[str, ...] = ()) -> None:
        self.limits = limits
        self.noise = NoiseFilter(root)
        self.root = root
        self.sections = SectionTracker()
        self.prefix = section_prefix
        self.blocks: list[Block] = []
        self.buffer: list[str] = []
        self.lists: list[list[int | bool]] = []  # [ordered, next number] per open list
        self.open_items = 0

    def build(self) -> list[Block]:
        stack: list[tuple[PageElement, bool, int]] = [(self.root, True, 0)]
        while stack:
            node, entering, depth = stack.pop()
            if isinstance(node, Tag):
                if entering:
                    self._enter(node, depth, stack)
                else:
                    self._exit(node)
            elif isinstance(node, NavigableString) and not isinstance(node, SKIPPED_STRINGS):
                self.buffer.append(_HTML_WS.sub(" ", str(node)))
        self._flush()
        return self.blocks

    def _enter(self, tag: Tag, depth: int, stack: list[tuple[PageElement, bool, int]]) -> None:
        if self.noise.is_noise(tag):
            return
        name = tag.name
        if depth > self.limits.max_html_depth:
            self.buffer.append(_HTML_WS.sub(" ", tag.get_text(" ")))
            return
        if name in _HEADINGS or name == "pre" or (name == "table" and self._is_data_table(tag)):
            self._flush()
            self._atomic(tag)
            return
        if name == "br":
            self.buffer.append("\n")
            return
        if name in _BLOCK_TAGS:
            self._flush()
            if name in ("ul", "ol"):
                self.lists.append([name == "ol", int_attr(tag, "start")])
            elif name == "li":
                self.open_items += 1
        stack.append((tag, False, depth))
        stack.extend((child, True, depth + 1) for child in reversed(list(tag.children)))

    def _exit(self, tag: Tag) -> None:
        if tag.name not in _BLOCK_TAGS:
            return
        self._flush()
        if tag.name in ("ul", "ol") and self.lists:
            self.lists.pop()
        elif tag.name == "li":
            self.open_items = max(0, self.open_items - 1)
            if self.lists and self.lists[-1][0]:
                self.lists[-1][1] = int(self.lists[-1][1]) + 1

    def _is_data_table(self, table: Tag) -> bool:
        rows = list(table_rows(table))
        if len(rows) < 2:
            return False
        return max(sum(1 for c in tr.children if isinstance(c, Tag) and c.name in ("td", "th")) for tr, _ in rows) >= 2

    def _atomic(self, tag: Tag) -> None:
        path = self.prefix + self.sections.path
        if tag.name in _HEADINGS:
            title = _INLINE_WS.sub(" ", tag.get_text(" ", strip=True)).strip()
            if title:
                level = _HEADINGS[tag.name]
                own = self.prefix + self.sections.enter(level, title)
                self.blocks.append(Block(BlockKind.HEADING, title, section_path=own, level=level))
        elif tag.name == "pre":
            self.blocks.append(Block(BlockKind.CODE, tag.get_text(), section_path=path, language=_code_language(tag)))
        else:
            self._table(tag, path)

    def _table(self, table: Tag, path: tuple[str, ...]) -> None:
        found = table.find("caption")
        caption = found.get_text(" ", strip=True) if isinstance(found, Tag) else ""
        if caption:
            self.blocks.append(Block(BlockKind.PARAGRAPH, caption, section_path=path))
        grid, header_rows = table_grid(table, self.limits.max_table_cells)
        text, header = markdown_table(merge_header(grid, header_rows))
        if text:
            self.blocks.append(
                Block(BlockKind.TABLE, text, section_path=path, table_header=header, table_caption=caption)
            )

    def _flush(self) -> None:
        raw = "".join(self.buffer)
        self.buffer.clear()
        lines = (_INLINE_WS.sub(" ", line).strip() for line in raw.split("\n"))
        text = "\n".join(line for line in lines if line)
        if not text:
            return
        path = self.prefix + self.sections.path
        if self.open_items and self.lists:
            ordered, number = self.lists[-1]
            marker = f"{number}. " if ordered else "- "
            self.blocks.append(Block(BlockKind.LIST_ITEM, marker + text, section_path=path, level=len(self.lists) - 1))
        else:
            self.blocks.append(Block(BlockKind.PARAGRAPH, text, section_path=path))


def _meta_content(marks: Landmarks, *names: str) -> str:
    return next((marks.metas[n] for n in names if marks.metas.get(n)), "")


def _json_ld(marks: Landmarks) -> dict[str, object]:
    for raw in marks.json_ld:
        try:
            data = json.loads(raw)
        except (ValueError, TypeError):
            continue
        if isinstance(data, dict):
            return data
    return {}


def html_metadata(marks: Landmarks) -> DocumentMetadata:
    """<title>, meta description/author/keywords/dates, JSON-LD dates, <html lang>."""
    ld = _json_ld(marks)
    title = marks.title.get_text(" ", strip=True) if marks.title is not None else ""
    author = _meta_content(marks, "author", "article:author", "dc.creator")
    ld_author = ld.get("author")
    if not author and isinstance(ld_author, dict):
        author = str(ld_author.get("name") or "")
    lang = str(marks.html.get("lang") or "") if marks.html is not None else ""
    extra = {
        k: v
        for k, v in (
            ("description", _meta_content(marks, "description", "og:description")),
            ("keywords", _meta_content(marks, "keywords")),
        )
        if v
    }
    created = ("article:published_time", "date", "dc.date", "dcterms.created", "datepublished")
    modified = ("article:modified_time", "last-modified", "dcterms.modified", "datemodified")
    return DocumentMetadata(
        title=title or _meta_content(marks, "og:title") or str(ld.get("headline") or ""),
        author=author,
        created=_meta_content(marks, *created) or str(ld.get("datePublished") or ""),
        modified=_meta_content(marks, *modified) or str(ld.get("dateModified") or ""),
        language=lang.split("-")[0].lower(),
        extra=extra,
    )


def html_fragment_blocks(html: str, limits: ExtractionLimits, section_prefix: tuple[str, ...] = ()) -> list[Block]:
    """Blocks of an HTML snippet (used for HTML embedded in Markdown)."""
    soup = BeautifulSoup(html, "html.parser")
    return _BlockBuilder(soup, limits, section_prefix).build()


class HtmlExtractor:
    """text/html and application/xhtml+xml."""

    media_types: tuple[str, ...] = (MEDIA_HTML, "application/xhtml+xml")

    def __init__(self, limits: ExtractionLimits | None = None) -> None:
        self.limits = limits or ExtractionLimits()

    def extract(self, data: bytes, *, password: str = "") -> ExtractedDocument:
        text = decode_html(data)
        try:
            soup = BeautifulSoup(text, "lxml")
        except Exception as exc:  # lxml/bs4 failures on hostile input
            raise DocumentParseError(f"cannot parse the HTML document: {exc}") from exc
        marks = find_landmarks(soup)
        blocks = _BlockBuilder(content_root(soup, marks), self.limits).build()
        metadata = html_metadata(marks)
        return ExtractedDocument(media_type=MEDIA_HTML, blocks=blocks, metadata=metadata)
