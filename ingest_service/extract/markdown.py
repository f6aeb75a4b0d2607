"""Markdown: a line-based reader for the block structure that matters to retrieval.

ATX and setext headings (section paths), fenced and indented code (CODE, language from
the fence info), pipe tables (TABLE), list items (LIST_ITEM with nesting level),
paragraphs and block quotes, HTML blocks (read with the HTML extractor), YAML-ish front
matter (metadata). Inline links and images keep their text; bold markers are dropped.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

from ingest_service.extract.base import MEDIA_MARKDOWN, ExtractionLimits, SectionTracker, markdown_table
from ingest_service.extract.html import html_fragment_blocks
from ingest_service.extract.text import decode_text
from ragrpc.models import Block, BlockKind, DocumentMetadata, ExtractedDocument

_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^`\s]*)")
_THEMATIC = re.compile(r"^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$")
_LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d{1,9}[.)])(?:[ \t]+(.*))?$")
_TABLE_DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")
_HTML_BLOCK = re.compile(r"^ {0,3}</?([A-Za-z][A-Za-z0-9-]*)(?:[\s/>]|$)")
_LINK_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*\S+")
_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]+)\](?:\([^)]*\)|\[[^\]]*\])")
_BOLD = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_ITALIC = re.compile(r"(?<![\w*\\])\*(?=[^\s*])([^*\n]*?[^\s*\\])\*(?![\w*])")
_INLINE_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9-]*(?:\s[^<>]*)?/?>")
_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")
_FRONT_MATTER_KEY = re.compile(r"^([A-Za-z_][\w-]*)\s*:\s*(.*)$")


def inline_text(text: str) -> str:
    """Markdown inline markup to reading text: images/links keep their text."""
    text = _IMAGE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    text = _BOLD.sub(r"\2", text)
    text = _ITALIC.sub(r"\1", text)
    text = _INLINE_TAG.sub("", text)
    return html.unescape(_ESCAPE.sub(r"\1", text))


def _indent(line: str) -> int:
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip(" "))


def _table_cells(line: str) -> list[str]:
    row = line.strip()
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    return [inline_text(c.strip().replace("\\|", "|")) for c in _UNESCAPED_PIPE.split(row)]


def parse_front_matter(lines: list[str]) -> tuple[dict[str, str], int]:
    """'---' key: value ... '---' at the very top; returns (fields, lines consumed)."""
    if not lines or lines[0].strip() != "---":
        return {}, 0
    for end in range(1, min(len(lines), 300)):
        if lines[end].strip() in ("---", "..."):
            fields = {}
            for raw in lines[1:end]:
                match = _FRONT_MATTER_KEY.match(raw)
                if match and match.group(2).strip():
                    fields[match.group(1).lower()] = match.group(2).strip().strip("\"'")
            return fields, end + 1
    return {}, 0


@dataclass
class _Reader:
    lines: list[str]
    limits: ExtractionLimits
    pos: int = 0
    blocks: list[Block] = field(default_factory=list)
    paragraph: list[str] = field(default_factory=list)
    sections: SectionTracker = field(default_factory=SectionTracker)
    list_indents: list[int] = field(default_factory=list)

    def emit(self, kind: BlockKind, text: str, **kw: object) -> None:
        self.blocks.append(Block(kind, text, section_path=self.sections.path, **kw))  # type: ignore[arg-type]

    def flush_paragraph(self) -> None:
        if self.paragraph:
            self.emit(BlockKind.PARAGRAPH, inline_text("\n".join(self.paragraph)))
            self.paragraph = []

    def heading(self, level: int, title: str) -> None:
        self.flush_paragraph()
        self.list_indents.clear()
        title = inline_text(title).strip()
        if title:
            path = self.sections.enter(level, title)
            self.blocks.append(Block(BlockKind.HEADING, title, section_path=path, level=level))

    def read(self) -> list[Block]:
        while self.pos < len(self.lines):
            line = self.lines[self.pos]
            self.pos += 1
            self.read_line(line)
        self.flush_paragraph()
        return self.blocks

    def read_line(self, line: str) -> None:  # noqa: C901 - one dispatch table, kept flat on purpose
        if not line.strip():
            self.flush_paragraph()
            return
        fence = _FENCE.match(line)
        if fence:
            self.code_fence(fence.group(2), fence.group(3))
        elif line.lstrip().startswith("<!--"):
            self.skip_comment(line)
        elif self.paragraph and _SETEXT.match(line):
            text = "\n".join(self.paragraph)
            self.paragraph = []
            self.heading(1 if line.strip()[0] == "=" else 2, text)
        elif (atx := _ATX.match(line)) is not None:
            self.heading(len(atx.group(1)), atx.group(2) or "")
        elif _THEMATIC.match(line) or _LINK_DEFINITION.match(line):
            self.flush_paragraph()
        elif "|" in line and self._delimiter_row_follows():
            self.table(line)
        elif (item := _LIST_ITEM.match(line)) is not None:
            self.list_item(_indent(line), item.group(2), item.group(3) or "")
        elif self.list_indents and _indent(line) > 0 and not self.paragraph:
            self.continue_list_item(line.strip())
        elif _HTML_BLOCK.match(line) and not self.paragraph:
            self.html_block(line)
        elif _indent(line) >= 4 and not self.paragraph:
            self.indented_code(line)
        elif line.lstrip().startswith(">"):
            self.paragraph.append(line.lstrip().lstrip(">").strip())
        else:
            if not self.paragraph and _indent(line) == 0:
                self.list_indents.clear()
            self.paragraph.append(line.strip())

    def _delimiter_row_follows(self) -> bool:
        following = self.lines[self.pos] if self.pos < len(self.lines) else ""
        return "|" in following and bool(_TABLE_DELIMITER.match(following))

    def code_fence(self, marker: str, info: str) -> None:
        self.flush_paragraph()
        body: list[str] = []
        while self.pos < len(self.lines):
            line = self.lines[self.pos]
            self.pos += 1
            if line.strip().startswith(marker[0] * len(marker)) and not line.strip().strip(marker[0]):
                break
            body.append(line)
        self.emit(BlockKind.CODE, "\n".join(body), language=info.lower())

    def indented_code(self, first: str) -> None:
        body = [first]
        while self.pos < len(self.lines) and (not self.lines[self.pos].strip() or _indent(self.lines[self.pos]) >= 4):
            body.append(self.lines[self.pos])
            self.pos += 1
        self.emit(BlockKind.CODE, "\n".join(line.expandtabs(4)[4:] for line in body).rstrip())

    def skip_comment(self, line: str) -> None:
        self.flush_paragraph()
        while "-->" not in line and self.pos < len(self.lines):
            line = self.lines[self.pos]
            self.pos += 1

    def table(self, header_line: str) -> None:
        self.flush_paragraph()
        rows = [_table_cells(header_line)]
        self.pos += 1  # the delimiter row
        while self.pos < len(self.lines) and "|" in self.lines[self.pos] and self.lines[self.pos].strip():
            rows.append(_table_cells(self.lines[self.pos]))
            self.pos += 1
        text, header = markdown_table(rows)
        if text:
            self.emit(BlockKind.TABLE, text, table_header=header)

    def list_item(self, indent: int, marker: str, text: str) -> None:
        self.flush_paragraph()
        while self.list_indents and self.list_indents[-1] > indent:
            self.list_indents.pop()
        if not self.list_indents or self.list_indents[-1] < indent:
            self.list_indents.append(indent)
        if text.strip():
            bullet = "- " if marker in "-*+" else marker[:-1] + ". "
            self.emit(BlockKind.LIST_ITEM, bullet + inline_text(text.strip()), level=len(self.list_indents) - 1)

    def continue_list_item(self, text: str) -> None:
        last = self.blocks[-1] if self.blocks else None
        if last is not None and last.kind is BlockKind.LIST_ITEM:
            self.blocks[-1] = Block(
                BlockKind.LIST_ITEM,
                last.text + " " + inline_text(text),
                section_path=last.section_path,
                level=last.level,
            )
        else:
            self.paragraph.append(text)

    def html_block(self, first: str) -> None:
        body = [first]
        while self.pos < len(self.lines) and self.lines[self.pos].strip():
            body.append(self.lines[self.pos])
            self.pos += 1
        self.blocks.extend(html_fragment_blocks("\n".join(body), self.limits, self.sections.path))


def _metadata(fields: dict[str, str], blocks: list[Block]) -> DocumentMetadata:
    title = fields.pop("title", "")
    if not title:
        title = next((b.text for b in blocks if b.kind is BlockKind.HEADING and b.level == 1), "")
    return DocumentMetadata(
        title=title,
        author=fields.pop("author", "") or fields.pop("authors", ""),
        created=fields.pop("date", "") or fields.pop("created", ""),
        modified=fields.pop("updated", "") or fields.pop("lastmod", "") or fields.pop("modified", ""),
        language=fields.pop("lang", "") or fields.pop("language", ""),
        extra={k: v[:500] for k, v in fields.items()},
    )


class MarkdownExtractor:
    """text/markdown."""

    media_types: tuple[str, ...] = (MEDIA_MARKDOWN, "text/x-markdown")

    def __init__(self, limits: ExtractionLimits | None = None) -> None:
        self.limits = limits or ExtractionLimits()

    def extract(self, data: bytes, *, password: str = "") -> ExtractedDocument:
        lines = decode_text(data).split("\n")
        fields, consumed = parse_front_matter(lines)
        blocks = _Reader(lines[consumed:], self.limits).read()
        return ExtractedDocument(media_type=MEDIA_MARKDOWN, blocks=blocks, metadata=_metadata(fields, blocks))
