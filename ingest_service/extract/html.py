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
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import MappingProxyType

from bs4 import BeautifulSoup, NavigableString, Tag
from bs4.element import Comment, Declaration, Doctype, PageElement, ProcessingInstruction

from ingest_service.extract.base import MEDIA_HTML, ExtractionLimits, SectionTracker, markdown_table
from ingest_service.extract.text import decode_text
from ragrpc.errors import DocumentParseError
from ragrpc.models import Block, BlockKind, DocumentMetadata, ExtractedDocument

logger = logging.getLogger(__name__)

_ALWAYS_SKIP = frozenset(
    "script style noscript template svg math iframe object embed canvas button select option "
    "textarea input head title meta link dialog map area audio video source track".split()
)
_CHROME_TAGS = frozenset({"nav", "aside", "footer", "form", "header"})
_NOISE_PREFIXES = ("cookie", "consent", "gdpr", "nav", "menu", "footer", "sidebar", "breadcrumb", "advert")
_NOISE_TOKENS = frozenset(
    "banner noprint editsection catlinks printfooter skip toc share social ads popup modal".split()
)
_HEADINGS = MappingProxyType({"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6})
_BLOCK_TAGS = frozenset(
    "p div section article main header blockquote dl dt dd figure figcaption address details "
    "summary td th tr caption hr center fieldset legend hgroup body html ul ol li table pre "
    "form nav aside footer".split()
)
_SKIPPED_STRINGS = (Comment, Declaration, Doctype, ProcessingInstruction)
_TOKEN_SPLIT = re.compile(r"[\s_\-]+")
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


def _noise_by_attributes(tag: Tag) -> bool:
    names = " ".join([str(tag.get("id") or ""), *(tag.get("class") or [])]).lower()
    for token in _TOKEN_SPLIT.split(names):
        if token in _NOISE_TOKENS or token.startswith(_NOISE_PREFIXES):
            return True
    return False


def _hidden(tag: Tag) -> bool:
    if tag.has_attr("hidden") or tag.get("aria-hidden") == "true":
        return True
    style = str(tag.get("style") or "").replace(" ", "").lower()
    return "display:none" in style or "visibility:hidden" in style


def _subtree_facts(root: Tag) -> dict[int, tuple[int, bool]]:
    """Per tag id: (text length of its subtree, whether it holds an h1-h3); one iterative pass."""
    facts: dict[int, tuple[int, bool]] = {}
    stack: list[tuple[Tag, list[int], list[bool]]] = [(root, [0], [False])]
    iters = [iter(root.children)]
    while stack:
        tag, length, heading = stack[-1]
        child = next(iters[-1], None)
        if child is None:
            stack.pop()
            iters.pop()
            facts[id(tag)] = (length[0], heading[0] or tag.name in ("h1", "h2", "h3"))
            if stack:
                stack[-1][1][0] += length[0]
                stack[-1][2][0] = stack[-1][2][0] or facts[id(tag)][1]
        elif isinstance(child, Tag):
            if child.name not in _ALWAYS_SKIP:
                stack.append((child, [0], [False]))
                iters.append(iter(child.children))
        elif isinstance(child, NavigableString) and not isinstance(child, _SKIPPED_STRINGS):
            length[0] += len(child.strip())
    return facts


@dataclass
class _Landmarks:
    """Elements found in one pass over the tree (instead of a find_all per question)."""

    html: Tag | None = None
    title: Tag | None = None
    main: Tag | None = None
    articles: list[Tag] = field(default_factory=list)
    metas: dict[str, str] = field(default_factory=dict)  # name/property/itemprop -> content
    json_ld: list[str] = field(default_factory=list)


def _landmarks(soup: BeautifulSoup) -> _Landmarks:
    found = _Landmarks()
    for tag in soup.descendants:
        if not isinstance(tag, Tag):
            continue
        name = tag.name
        if name == "meta" and tag.get("content"):
            key = str(tag.get("name") or tag.get("property") or tag.get("itemprop") or "").lower()
            found.metas.setdefault(key, str(tag["content"]).strip())
        elif name == "script" and tag.get("type") == "application/ld+json":
            found.json_ld.append(tag.string or "")
        elif name == "article":
            found.articles.append(tag)
        elif found.main is None and (name == "main" or tag.get("role") == "main"):
            found.main = tag
        elif name == "title" and found.title is None:
            found.title = tag
        elif name == "html" and found.html is None:
            found.html = tag
    return found


def _content_root(soup: BeautifulSoup, marks: _Landmarks) -> Tag:
    """<main>, else the largest <article>, else <body>, else the whole document."""
    if marks.main is not None:
        return marks.main
    if marks.articles:
        return max(marks.articles, key=lambda a: len(a.get_text()))
    return soup.body if isinstance(soup.body, Tag) else soup


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


def _table_rows(table: Tag) -> Iterator[tuple[Tag, bool]]:
    """(tr, in thead) for the rows of this table, not of tables nested in its cells."""
    for child in table.children:
        if not isinstance(child, Tag):
            continue
        if child.name == "tr":
            yield child, False
        elif child.name in ("thead", "tbody", "tfoot"):
            for row in child.children:
                if isinstance(row, Tag) and row.name == "tr":
                    yield row, child.name == "thead"


def _grid(table: Tag, max_cells: int) -> tuple[list[list[str]], int]:
    """Rows of cell texts with colspan padded and rowspan repeated; also the header-row count."""
    grid: list[list[str]] = []
    pending: dict[int, tuple[int, str]] = {}  # column -> (rows left, text) from rowspans
    header_rows, cells = 0, 0
    for tr, in_head in _table_rows(table):
        row: list[str] = []
        tds = [c for c in tr.children if isinstance(c, Tag) and c.name in ("td", "th")]
        all_th = bool(tds) and all(c.name == "th" for c in tds)
        if in_head or (len(grid) == header_rows and all_th and (not grid or len(tds) > 1)):
            header_rows += 1
        for td in tds:
            while len(row) in pending:
                _fill_pending(row, pending)
            text = td.get_text(" ", strip=True)
            span = _int_attr(td, "colspan")
            for i in range(span):
                if _int_attr(td, "rowspan") > 1:
                    pending[len(row)] = (_int_attr(td, "rowspan") - 1, text)
                row.append(text if i == 0 else "")
        while len(row) in pending:
            _fill_pending(row, pending)
        grid.append(row)
        cells += len(row)
        if cells > max_cells:
            logger.warning("HTML table cut at %s rows (max_table_cells)", len(grid))
            break
    return grid, header_rows


def _fill_pending(row: list[str], pending: dict[int, tuple[int, str]]) -> None:
    left, text = pending.pop(len(row))
    if left > 1:
        pending[len(row)] = (left - 1, text)
    row.append(text)


def _int_attr(tag: Tag, name: str) -> int:
    try:
        return max(1, min(int(str(tag.get(name) or 1)), 1000))
    except ValueError:
        return 1


def _merge_header(grid: list[list[str]], header_rows: int) -> list[list[str]]:
    """Several header rows (pivot tables) become one: column-wise unique texts joined."""
    if header_rows <= 1:
        return grid
    width = max(len(r) for r in grid[:header_rows])
    merged = []
    for col in range(width):
        parts = [r[col] for r in grid[:header_rows] if col < len(r) and r[col]]
        merged.append(" / ".join(dict.fromkeys(parts)))
    return [merged, *grid[header_rows:]]


class _BlockBuilder:
    """Walks a content root in document order and emits blocks."""

    def __init__(self, root: Tag, limits: ExtractionLimits, section_prefix: tuple[str, ...] = ()) -> None:
        self.limits = limits
        self.facts = _subtree_facts(root)
        self.total_text = self.facts.get(id(root), (0, False))[0]
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
            elif isinstance(node, NavigableString) and not isinstance(node, _SKIPPED_STRINGS):
                self.buffer.append(_HTML_WS.sub(" ", str(node)))
        self._flush()
        return self.blocks

    def _is_noise(self, tag: Tag) -> bool:
        if tag.name in _ALWAYS_SKIP or _hidden(tag):
            return True
        if tag is self.root or tag.name in ("main", "article", "body", "html"):
            return False
        if tag.name not in _CHROME_TAGS and not _noise_by_attributes(tag):
            return False
        length, has_heading = self.facts.get(id(tag), (0, False))
        if tag.name == "header" and has_heading and not _noise_by_attributes(tag):
            return False
        return length <= 0.5 * self.total_text or self.total_text == 0

    def _enter(self, tag: Tag, depth: int, stack: list[tuple[PageElement, bool, int]]) -> None:
        if self._is_noise(tag):
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
                self.lists.append([name == "ol", _int_attr(tag, "start")])
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
        rows = list(_table_rows(table))
        if len(rows) < 2:
            return False
        return (
            max(
                sum(1 for c in tr.children if isinstance(c, Tag) and c.name in ("td", "th")) for tr, _ in rows
            )
            >= 2
        )

    def _atomic(self, tag: Tag) -> None:
        path = self.prefix + self.sections.path
        if tag.name in _HEADINGS:
            title = _INLINE_WS.sub(" ", tag.get_text(" ", strip=True)).strip()
            if title:
                level = _HEADINGS[tag.name]
                own = self.prefix + self.sections.enter(level, title)
                self.blocks.append(Block(BlockKind.HEADING, title, section_path=own, level=level))
        elif tag.name == "pre":
            self.blocks.append(
                Block(BlockKind.CODE, tag.get_text(), section_path=path, language=_code_language(tag))
            )
        else:
            self._table(tag, path)

    def _table(self, table: Tag, path: tuple[str, ...]) -> None:
        caption = table.find("caption")
        if isinstance(caption, Tag) and caption.get_text(strip=True):
            self.blocks.append(
                Block(BlockKind.PARAGRAPH, caption.get_text(" ", strip=True), section_path=path)
            )
        grid, header_rows = _grid(table, self.limits.max_table_cells)
        text, header = markdown_table(_merge_header(grid, header_rows))
        if text:
            self.blocks.append(Block(BlockKind.TABLE, text, section_path=path, table_header=header))

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
            self.blocks.append(
                Block(BlockKind.LIST_ITEM, marker + text, section_path=path, level=len(self.lists) - 1)
            )
        else:
            self.blocks.append(Block(BlockKind.PARAGRAPH, text, section_path=path))


def _meta_content(marks: _Landmarks, *names: str) -> str:
    return next((marks.metas[n] for n in names if marks.metas.get(n)), "")


def _json_ld(marks: _Landmarks) -> dict[str, object]:
    for raw in marks.json_ld:
        try:
            data = json.loads(raw)
        except (ValueError, TypeError):
            continue
        if isinstance(data, dict):
            return data
    return {}


def html_metadata(marks: _Landmarks) -> DocumentMetadata:
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


def html_fragment_blocks(
    html: str, limits: ExtractionLimits, section_prefix: tuple[str, ...] = ()
) -> list[Block]:
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
        marks = _landmarks(soup)
        blocks = _BlockBuilder(_content_root(soup, marks), self.limits).build()
        metadata = html_metadata(marks)
        return ExtractedDocument(media_type=MEDIA_HTML, blocks=blocks, metadata=metadata)
