"""Tables: a TABLE block (a Markdown table) is one chunk when it fits in max_tokens. A larger
one is split, and every part after the first starts with the table's header, so that every
row is retrieved with the names of its columns. The header is the row(s) above the separator
row: Block.table_header when the table starts with it, else the lines before a separator
line among the first four (a multi-level header has two or three header rows).

How much of the header is repeated depends on its width in tokens:
1. Up to half of chunk_size: the header rows and a compacted separator ("|---|:---:|", as
   tokenizers count every dash).
2. Wider, while max_tokens leaves room for a typical (median) row under it: the header rows
   with one-dash separators ("|-|:-:|"). Rows are packed under it to chunk_size less the
   header, but at least to half of chunk_size or to the room max_tokens leaves, if less (the
   header may be longer than chunk_size).
3. Wider still (dozens to hundreds of columns): the header rows are chunks of their own, then
   every row is cut between cells into pieces of as many columns as fit in chunk_size with
   their header, each piece under the header of its own columns (those columns' names, one-
   dash separators). A header over half of max_tokens that leaves too little room for its
   piece (one column with a cell longer than the window) is cut to the first max_tokens / 2
   tokens of its names. A piece whose cells are all empty is left out; a row's first cell
   (its label) is not repeated on its later pieces.
In 1 and 2 the first part keeps the table's own header when a row fits under it. A row too
long for a part (a cell longer than the model window) is cut by tokens, every cut under the
header, so no chunk exceeds max_tokens.

The table's caption (`table_caption`: the extractor's, else a caption-like line right above the
table; at most 32 tokens, a quarter of a small window) is the first line of every part, above
the header, so that a row chunk says which table it is from (a wide table's piece leaves it out
where it would leave the piece less than half a chunk); the caption's own paragraph is chunked
with the text before the table as well. A table that runs over page breaks (TABLE blocks marked
`continues_table`, from the PDF extractor) is one table: its rows are packed across the breaks
under the first block's header, a part's pages are those of its rows, and the repeated headers
of the later pages are left out."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ingest_service.chunking.base import DocumentView, Draft, Piece, PlannedChunker, Range
from ingest_service.chunking.units import (
    TABLE_LEVELS,
    Limits,
    line_ranges,
    pack,
    pack_drafts,
    split_blocks,
    split_range,
)
from ragrpc.models import BlockKind
from ragrpc.tokens import TokenCounter

_SEPARATOR_ROW = re.compile(r"\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*")
_DASHES = re.compile(r"-{4,}")
_ANY_DASHES = re.compile(r"-+")
_SPACES = re.compile(r"[ \t]+")
_CELL_BORDER = re.compile(r"(?<!\\)\|")
_NO_CELL_TEXT = re.compile(r"[\s|]*")
_MAX_HEADER_ROWS = 3
_MAX_CAPTION_CHARS = 200
_MAX_CAPTION_TOKENS = 32
_MAX_LEAD_IN_WORDS = 10  # "Balances by region:" names the table; a longer sentence is text
_CAPTION = re.compile(
    r"^(?:table|tab\.|exhibit|schedule|statements?|figure)\s+[\w.:-]+|\((?:in|amounts in|dollars in)\s+"
    r"(?:millions|thousands|billions|dollars)|\(unaudited\)",
    re.IGNORECASE,
)

Header = tuple[Range, Range]  # the header row(s) and the separator row


def table_header(view: DocumentView, index: int) -> Header | None:
    """The header row(s) and separator row of TABLE block `index` (see the module docstring);
    None when the table has no body row under them."""
    start, end = view.block_span(index)
    lines = line_ranges(view.text, start, end)
    declared = view.blocks[index].table_header.strip()
    declared_rows = declared.count("\n") if declared and view.text.startswith(declared, start) else 0
    for rows in [declared_rows] if declared_rows else range(1, _MAX_HEADER_ROWS + 1):
        separator = view.text[lines[rows][0] : lines[rows][1]] if rows < len(lines) else ""
        if rows + 1 < len(lines) and (declared_rows or _SEPARATOR_ROW.fullmatch(separator)):
            return (lines[0][0], lines[rows - 1][1]), lines[rows]
    return None


def compact_header(view: DocumentView, header: Header, minimal: bool = False) -> str:
    (row_start, row_end), (sep_start, sep_end) = header
    separator = _SPACES.sub("", _DASHES.sub("---", view.text[sep_start:sep_end]))
    if minimal:
        separator = _ANY_DASHES.sub("-", separator)
    return f"{view.text[row_start:row_end]}\n{separator}"


def _cell_borders(text: str, start: int, end: int) -> list[int]:
    """Offsets of the cell borders ("|", not "\\|") of the row text[start:end], with a border
    just outside each end of the row that has none."""
    borders = [m.start() for m in _CELL_BORDER.finditer(text, start, end)]
    if not borders or borders[0] != start:
        borders.insert(0, start - 1)
    if borders[-1] != end - 1 or len(borders) == 1:
        borders.append(end)
    return borders


def cell_spans(text: str, start: int, end: int) -> list[Range]:
    """The cells of a row with their borders ("| 12 |"); neighbours share a border."""
    borders = _cell_borders(text, start, end)
    return [(max(a, start), min(b + 1, end)) for a, b in zip(borders, borders[1:], strict=False)]


def cell_texts(text: str, start: int, end: int) -> list[str]:
    borders = _cell_borders(text, start, end)
    return [text[a + 1 : b].strip() for a, b in zip(borders, borders[1:], strict=False)]


class ColumnHeaders:
    """The header of a wide table by column: the header to put over any run of columns, and
    what each column adds to it in tokens."""

    def __init__(self, view: DocumentView, header: Header, counter: TokenCounter, caption: str = "") -> None:
        self.caption = caption  # put above every piece's header
        self.names = [cell_texts(view.text, a, b) for a, b in line_ranges(view.text, *header[0])]
        self._counter = counter
        self._costs: dict[int, int] = {}
        self.base = counter.count(self.text(0, 0))

    def text(self, first: int, last: int) -> str:
        """The header of columns [first, last): their names on each header row, then "|-|"."""
        rows = ["|" + "".join(f" {row[c] if c < len(row) else ''} |" for c in range(first, last)) for row in self.names]
        return "\n".join([*rows, "|" + "-|" * (last - first)])

    def cost(self, column: int) -> int:
        if column not in self._costs:
            self._costs[column] = self._counter.count(self.text(column, column + 1)) - self.base
        return self._costs[column]


def table_caption(view: DocumentView, index: int) -> str:
    """The caption of TABLE block `index`: the one its extractor found (Block.table_caption),
        else the paragraph right above the table when it reads as a caption: one short line on the
        same page that names a table ("Table 3: ...", "Schedule II"), ends with a colon (ten words at
    most), says its
        units ("(in millions, except per share data)") or is a title in capitals."""
    block = view.blocks[index]
    if block.table_caption.strip():
        return " ".join(block.table_caption.split())
    if index == 0:
        return ""
    above = view.blocks[index - 1]
    text = above.text.strip()
    if above.kind is not BlockKind.PARAGRAPH or "\n" in text or not 0 < len(text) <= _MAX_CAPTION_CHARS:
        return ""
    if above.page != block.page or above.section_path != block.section_path:
        return ""
    letters = [c for c in text if c.isalpha()]
    capitals = len(letters) >= 4 and sum(c.isupper() for c in letters) >= 0.8 * len(letters)
    lead_in = text.endswith(":") and len(text.split()) <= _MAX_LEAD_IN_WORDS
    return text if _CAPTION.search(text) or lead_in or capitals else ""


def cut_caption(caption: str, counter: TokenCounter, limit: int = _MAX_CAPTION_TOKENS) -> str:
    """The caption cut at a word to at most `limit` tokens."""
    if not caption or limit <= 0:
        return ""
    if counter.count(caption) <= limit:
        return caption
    spans = counter.spans(caption)
    cut = caption[: spans[limit][0]]
    return cut.rsplit(" ", 1)[0].rstrip() if " " in cut.strip() else cut.rstrip()


def _with_caption(caption: str, prefix: str) -> str:
    return "\n".join(p for p in (caption, prefix) if p)


class TableChunker(PlannedChunker):
    """TABLE blocks as described above; other blocks are packed as paragraphs."""

    name = "table"

    def plan(self, view: DocumentView, blocks: Sequence[int]) -> list[Draft]:
        drafts: list[Draft] = []
        text_blocks: list[int] = []
        table: list[int] = []
        for index in blocks:
            if view.blocks[index].kind is BlockKind.TABLE:
                if table and view.same_table(table[-1], index):
                    table.append(index)  # the table goes on over a page break
                    continue
                drafts += self._text(view, text_blocks) + (self.plan_table(view, table) if table else [])
                text_blocks, table = [], [index]
            else:
                if table:
                    drafts += self.plan_table(view, table)
                    table = []
                text_blocks.append(index)
        drafts += self.plan_table(view, table) if table else []
        return drafts + self._text(view, text_blocks)

    def _limits(self) -> Limits:
        return Limits(self.config.chunk_size, self.config.max_tokens)

    def _row_limits(self, reserved: int) -> Limits:
        """Limits for rows under a header of `reserved` tokens: chunk_size less the header, but
        at least half of chunk_size, or the room max_tokens leaves when that is less (a wide
        header may be longer than chunk_size); never under 1 token."""
        hard = self.config.max_tokens - reserved
        return Limits(max(self.config.chunk_size - reserved, min(hard, self.config.chunk_size // 2), 1), hard)

    def _text(self, view: DocumentView, blocks: list[int]) -> list[Draft]:
        pieces = split_blocks(view, blocks, self._limits())
        return pack_drafts(view, pieces, self._limits(), self.name, min_tokens=self.config.min_chunk_tokens)

    def plan_table(self, view: DocumentView, blocks: int | Sequence[int]) -> list[Draft]:
        """Drafts of one table: TABLE block `blocks`, or the blocks of a table that goes on over
        page breaks (the first one's header above the rows of all; the later ones' own header
        lines, a repetition, left out)."""
        group = [blocks] if isinstance(blocks, int) else list(blocks)
        start, end = view.block_span(group[0])
        header = table_header(view, group[0])
        budget = min(_MAX_CAPTION_TOKENS, self.config.max_tokens // 4)  # a small window keeps room for rows
        caption = cut_caption(table_caption(view, group[0]), self.counter, budget)
        bodies = [(start, end)] + [view.continued_rows(index) for index in group[1:]]
        bodies = [body for body in bodies if body[0] < body[1]]
        caption_tokens = self.counter.count(caption) + 1 if caption else 0
        if sum(view.count(*body) for body in bodies) + caption_tokens <= self.config.max_tokens:
            return [Draft(bodies, self.name, start, prefix=caption)]
        if header is None:
            limits = self._row_limits(caption_tokens)
            drafts = pack_drafts(view, split_range(view, (start, end), TABLE_LEVELS, limits), limits, self.name)
            for draft in drafts:
                draft.prefix = caption
            return drafts + [d for index in group[1:] for d in self.plan_table(view, index)]
        rows = [row for body in [(header[1][1], end), *bodies[1:]] for row in line_ranges(view.text, *body)]
        repeated = self._repeated_header(view, header, rows, caption)
        if not repeated:
            return self._plan_wide(view, header, rows, caption)
        return self._plan_rows(view, header, rows, repeated, caption)

    def _repeated_header(self, view: DocumentView, header: Header, rows: list[Range], caption: str) -> str:
        """The header (after the caption) to put on top of every part after the first; "" when
        it leaves no room for a typical row (a longer row, a footnote, is cut under the header)."""
        repeated = _with_caption(caption, compact_header(view, header))
        if self.counter.count(repeated) <= self.config.chunk_size // 2:
            return repeated
        minimal = _with_caption(caption, compact_header(view, header, minimal=True))
        counts = sorted(view.count(a, b) for a, b in rows)
        typical = counts[len(counts) // 2] if counts else 0
        return minimal if self.counter.count(minimal) + typical < self.config.max_tokens else ""

    def _plan_rows(
        self, view: DocumentView, header: Header, rows: list[Range], repeated: str, caption: str
    ) -> list[Draft]:
        """Whole rows packed under the repeated header (cases 1 and 2)."""
        start = header[0][0]
        limits = self._row_limits(self.counter.count(repeated))
        pieces = [piece for row in rows for piece in split_range(view, row, (), limits, atomic=True)]
        own_header = view.count(start, header[1][1]) + (self.counter.count(caption) + 1 if caption else 0)
        first = self._first_rows(pieces, own_header)
        # No row fits under the table's own (uncompacted) header: every part gets the repeated one.
        drafts: list[Draft] = []
        if first:
            parts = _parts(view, [Piece(start, header[1][1], 0), *pieces[:first]])
            drafts.append(Draft(parts, self.name, start, prefix=caption))
        for group in pack(view, pieces[first:], limits, min_tokens=self.config.min_chunk_tokens):
            drafts.append(Draft(_parts(view, group.pieces), self.name, start, prefix=repeated))
        return drafts

    def _first_rows(self, rows: list[Piece], header_tokens: int) -> int:
        """How many rows go into the first part, under the table's own header."""
        total, count = 0, 0
        budget = Limits(self.config.chunk_size - header_tokens, self.config.max_tokens - header_tokens)
        for row in rows:
            if count and total + row.tokens > budget.size:
                break
            if row.tokens > budget.hard:
                break
            total, count = total + row.tokens, count + 1
        return count

    def _plan_wide(self, view: DocumentView, header: Header, rows: list[Range], caption: str) -> list[Draft]:
        """Case 3: the header rows, then every row in pieces of columns under their own header."""
        start = header[0][0]
        size = max(1, self.config.chunk_size - (self.counter.count(caption) + 1 if caption else 0))
        drafts = [Draft([w], self.name, start, prefix=caption) for w in view.tokens.windows(*header[0], size)]
        headers = ColumnHeaders(view, header, self.counter, caption)
        for row in rows:
            drafts += self._wide_row(view, row, headers, start)
        return drafts

    def _wide_row(self, view: DocumentView, row: Range, headers: ColumnHeaders, anchor: int) -> list[Draft]:
        """A row cut between cells: each piece as many columns as fit in chunk_size with their header."""
        spans = cell_spans(view.text, *row)
        drafts: list[Draft] = []
        first = 0
        while first < len(spans):
            last, names = first + 1, headers.base + headers.cost(first)
            while last < len(spans):
                wider = names + headers.cost(last)
                if wider + view.count(spans[first][0], spans[last][1]) > self.config.chunk_size:
                    break
                last, names = last + 1, wider
            piece = (spans[first][0], spans[last - 1][1])
            drafts += self._wide_piece(view, piece, headers.text(first, last), anchor, headers.caption)
            first = last
        return drafts

    def _wide_piece(self, view: DocumentView, span: Range, prefix: str, anchor: int, caption: str) -> list[Draft]:
        """Drafts of one piece of a row under `prefix`, its columns' header (cut to half of
        max_tokens when longer and the piece does not fit under it), after the caption when that
        leaves room; a piece too long for one chunk is cut by tokens."""
        if _NO_CELL_TEXT.fullmatch(view.text, *span):
            return []
        half, head = self.config.max_tokens // 2, self.counter.count(prefix)
        if head > half and head + view.count(*span) > self.config.max_tokens:  # the names only, cut by tokens
            prefix = prefix.rsplit("\n", 1)[0]
            spans = self.counter.spans(prefix)
            prefix = prefix[: spans[half][0]].rstrip() if len(spans) > half else prefix
        captioned = _with_caption(caption, prefix)
        room = self.config.max_tokens - self.counter.count(captioned)
        # the caption goes when it leaves the piece no room (a window of a few dozen tokens)
        prefix = captioned if room >= min(view.count(*span), self.config.chunk_size // 2) else prefix
        limits = self._row_limits(self.counter.count(prefix))
        return [
            Draft([(p.start, p.end)], self.name, anchor, prefix=prefix)
            for p in split_range(view, span, (), limits, atomic=True)
        ]


def _parts(view: DocumentView, pieces: Sequence[Piece]) -> list[Range]:
    """The ranges of consecutive pieces, one per block they come from (a table over a page
    break: the rows of each page without the repeated header between)."""
    parts: list[Range] = []
    block = -1
    for piece in pieces:
        here = view.block_at(piece.start)
        if parts and here == block:
            parts[-1] = (parts[-1][0], piece.end)
        else:
            parts.append((piece.start, piece.end))
            block = here
    return parts
