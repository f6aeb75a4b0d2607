"""Cutting text into units and packing units into chunks, shared by the strategies.

Units are `Piece`s (char ranges of DocumentView.text with token counts). A block is cut
top-down by the levels of its kind (prose: paragraphs -> sentences -> lines; code:
blank-line blocks -> lines; table: rows) only as far as needed to fit, and by token windows
as the last resort. `pack` then fills chunks greedily, with optional overlap.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ingest_service.chunking.base import DocumentView, Draft, Piece, draft_of
from ingest_service.chunking.token_windows import Range, trim_range
from ragrpc.models import BlockKind

Splitter = Callable[[str, int, int], list[Range]]

_BREAK = re.compile(
    r"(?P<end>[.!?\u2026]+['\"\u201d\u2019)\]]*)(?=\s|$)"
    r"|(?P<hard>\n[ \t]*\n|\n(?=[ \t]*(?:[-*+\u2022]|\d{1,3}[.)])[ \t]))"
)
_DOTTED_ABBREVIATION = re.compile(r"(?:[a-z]\.)+[a-z]")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs cf fig figs no nos vol vols pp ed eds al approx dept inc ltd co "
    "corp jan feb mar apr jun jul aug sep sept oct nov dec eq eqs sec ch art gen gov rev hon viz "
    "resp ca op cit ibid mt ft bros univ".split()
)
_BLANK_LINE = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)*")
_NEWLINE = re.compile(r"\n")


def _ranges_between(text: str, start: int, end: int, cuts: Sequence[int], keep_indent: bool = False) -> list[Range]:
    """The trimmed ranges between cuts; with keep_indent a range that starts a line keeps
    the line's indentation (code)."""
    out: list[Range] = []
    previous = start
    for cut in [*cuts, end]:
        a, b = trim_range(text, previous, cut)
        if keep_indent:
            a = _line_indent_start(text, a, max(previous, start))
        if a < b:
            out.append((a, b))
        previous = cut
    return out


def _line_indent_start(text: str, offset: int, floor: int) -> int:
    k = offset
    while k > floor and text[k - 1] in " \t":
        k -= 1
    return k if k == 0 or text[k - 1] == "\n" else offset


def _ends_sentence(text: str, match: re.Match[str], end: int) -> bool:
    following = match.end()
    while following < end and text[following].isspace():
        following += 1
    if following >= end:
        return True
    if text[following].islower():
        return False  # "e.g. the", "approx. five", "etc. and"
    if match.group("end") != ".":
        return True
    word_start = match.start()
    while word_start > 0 and not text[word_start - 1].isspace():
        word_start -= 1
    word = text[word_start : match.start()].lstrip("([{\"'\u201c\u2018").lower()
    if word in _ABBREVIATIONS or _DOTTED_ABBREVIATION.fullmatch(word):
        return False  # "Dr. Smith", "U.S. Army"
    if len(word) == 1 and word.isalpha():
        return False  # an initial: "J. Smith"
    if word.isdigit() and len(word) <= 2:
        return not _at_line_start(text, word_start)  # a list number: "1. First"
    return True


def _at_line_start(text: str, offset: int) -> bool:
    while offset > 0 and text[offset - 1] in " \t":
        offset -= 1
    return offset == 0 or text[offset - 1] == "\n"


def sentence_ranges(text: str, start: int, end: int) -> list[Range]:
    """Sentences of text[start:end] (trimmed). Ends at . ! ? (and closing quotes or
    brackets) followed by space and not lowercase, except after abbreviations, initials and
    list numbers; also at blank lines and at lines starting with a list marker."""
    cuts = [m.end() for m in _BREAK.finditer(text, start, end) if m.group("hard") or _ends_sentence(text, m, end)]
    return _ranges_between(text, start, end, cuts)


def split_sentences(text: str) -> list[str]:
    """The sentences of a text, each as it appears there."""
    return [text[a:b] for a, b in sentence_ranges(text, 0, len(text))]


def paragraph_ranges(text: str, start: int, end: int) -> list[Range]:
    cuts = [m.end() for m in _BLANK_LINE.finditer(text, start, end)]
    return _ranges_between(text, start, end, cuts, keep_indent=True)


def line_ranges(text: str, start: int, end: int) -> list[Range]:
    cuts = [m.end() for m in _NEWLINE.finditer(text, start, end)]
    return _ranges_between(text, start, end, cuts, keep_indent=True)


PROSE_LEVELS: tuple[Splitter, ...] = (paragraph_ranges, sentence_ranges, line_ranges)
CODE_LEVELS: tuple[Splitter, ...] = (paragraph_ranges, line_ranges)
TABLE_LEVELS: tuple[Splitter, ...] = (line_ranges,)
_ATOMIC_LEVELS = frozenset({sentence_ranges, line_ranges})


def levels_for(kind: BlockKind) -> tuple[Splitter, ...]:
    if kind is BlockKind.CODE:
        return CODE_LEVELS
    if kind is BlockKind.TABLE:
        return TABLE_LEVELS
    return PROSE_LEVELS


@dataclass(frozen=True)
class Limits:
    """size: the packing target; hard: what an indivisible unit (sentence, line) may reach."""

    size: int
    hard: int


def split_range(
    view: DocumentView,
    span: Range,
    levels: Sequence[Splitter],
    limits: Limits,
    force: int = 0,
    atomic: bool = False,
) -> list[Piece]:
    """Pieces of `span`, each <= limits.size tokens (atomic ones <= limits.hard), cut by
    the first level that splits it, recursively; the first `force` levels always apply."""
    start, end = span
    tokens = view.count(start, end)
    fits = tokens <= limits.size or (atomic and tokens <= limits.hard)
    if start >= end:
        return []
    if fits and force <= 0:
        return [Piece(start, end, tokens)]
    if not levels:
        if fits:
            return [Piece(start, end, tokens)]
        return [view.piece(a, b) for a, b in view.tokens.windows(start, end, limits.size)]
    level, rest = levels[0], levels[1:]
    ranges = level(view.text, start, end)
    is_atomic = level in _ATOMIC_LEVELS
    if len(ranges) <= 1:
        return split_range(view, span, rest, limits, force - 1, atomic or is_atomic)
    return [p for r in ranges for p in split_range(view, r, rest, limits, force - 1, is_atomic)]


def split_block(view: DocumentView, index: int, limits: Limits, to_sentences: bool = False) -> list[Piece]:
    """Pieces of block `index`; with to_sentences, cut to sentences (code/table: lines)
    even when the block fits."""
    kind = view.blocks[index].kind
    levels = levels_for(kind)
    force = (2 if levels is PROSE_LEVELS else len(levels)) if to_sentences else 0
    return split_range(view, view.block_span(index), levels, limits, force)


def split_blocks(view: DocumentView, blocks: Sequence[int], limits: Limits, to_sentences: bool = False) -> list[Piece]:
    return [p for index in blocks for p in split_block(view, index, limits, to_sentences)]


@dataclass
class Group:
    """Consecutive pieces of one chunk; the first `carried` repeat the previous chunk."""

    pieces: list[Piece] = field(default_factory=list)
    carried: int = 0
    tokens: int = 0

    @property
    def own(self) -> list[Piece]:
        return self.pieces[self.carried :]

    @property
    def own_tokens(self) -> int:
        return self.tokens - sum(p.tokens for p in self.pieces[: self.carried])

    def add(self, piece: Piece) -> None:
        self.pieces.append(piece)
        self.tokens += piece.tokens

    def draft(self, chunker: str) -> Draft:
        return draft_of(self.pieces, chunker, self.carried)


def _carry(view: DocumentView, group: Group, budget: int) -> Group:
    """The overlap that starts the next group: whole trailing pieces up to `budget` tokens,
    topped up from the piece before them (whole sentences if possible) when they give
    under half of it."""
    if budget <= 0:
        return Group()
    own = group.own
    k, total = len(own), 0
    while k > 1 and total + own[k - 1].tokens <= budget:  # never the whole previous chunk
        k -= 1
        total += own[k].tokens
    taken = own[k:]
    if total * 2 < budget and k > 0:
        before = own[k - 1]
        cut = _tail_start(view, before, budget - total, (budget + 1) // 2 - total)
        if cut < before.end:
            taken = [view.piece(cut, before.end), *taken]
    return Group(list(taken), len(taken), sum(p.tokens for p in taken))


def _tail_start(view: DocumentView, piece: Piece, tokens: int, enough: int) -> int:
    """Where the last <= `tokens` tokens of the piece start: its last whole sentences when
    they give at least `enough` tokens, else a word start."""
    cut, got = piece.end, 0
    for start, end in reversed(sentence_ranges(view.text, piece.start, piece.end)):
        count = view.count(start, end)
        if got + count > tokens:
            break
        cut, got = start, got + count
    if got >= enough:
        return cut
    return view.tokens.tail_start(piece.start, piece.end, tokens)


def _pop_trailing_headings(view: DocumentView, group: Group, room: int) -> list[Piece]:
    """A chunk should not end with headings: takes them off (when they fit in `room`
    tokens with what follows) to start the next chunk."""
    own = group.own
    keep = len(own)
    while keep > 1 and view.is_heading(own[keep - 1]):
        keep -= 1
    moved = own[keep:]
    tokens = sum(p.tokens for p in moved)
    if not moved or tokens > room:
        return []
    del group.pieces[len(group.pieces) - len(moved) :]
    group.tokens -= tokens
    return moved


def _may_grow(view: DocumentView, group: Group, min_tokens: int) -> bool:
    """A group under min_tokens, or of headings only, should not stand alone."""
    return group.own_tokens < min_tokens or all(view.is_heading(p) for p in group.own)


def pack(
    view: DocumentView, pieces: Sequence[Piece], limits: Limits, overlap: int = 0, min_tokens: int = 0
) -> list[Group]:
    """Greedy packing up to limits.size tokens, each chunk after the first starting with
    about `overlap` tokens of the one before. A group under min_tokens (or of headings
    only) may grow to limits.hard instead of standing alone; a small last group joins the
    one before."""
    groups: list[Group] = []
    current = Group()
    for piece in pieces:
        total = current.tokens + piece.tokens
        if current.own and total > limits.size and not (total <= limits.hard and _may_grow(view, current, min_tokens)):
            headings = _pop_trailing_headings(view, current, limits.hard - piece.tokens)
            groups.append(current)
            if headings:
                current = Group(headings, 0, sum(p.tokens for p in headings))
            else:
                current = _carry(view, current, min(overlap, limits.size - piece.tokens))
        current.add(piece)
    if current.own:
        last = groups[-1] if groups else None
        if last is not None and current.own_tokens < min_tokens and last.tokens + current.own_tokens <= limits.hard:
            for piece in current.own:
                last.add(piece)
        else:
            groups.append(current)
    return groups


def pack_drafts(
    view: DocumentView,
    pieces: Sequence[Piece],
    limits: Limits,
    chunker: str,
    overlap: int = 0,
    min_tokens: int = 0,
) -> list[Draft]:
    return [g.draft(chunker) for g in pack(view, pieces, limits, overlap, min_tokens)]


def heading_level(view: DocumentView, index: int) -> int:
    """1 for a top heading, deeper is larger; 0 for a block that is not a heading."""
    block = view.blocks[index]
    if block.kind is not BlockKind.HEADING:
        return 0
    return block.level or len(block.section_path) or 1


def split_sections(view: DocumentView, blocks: Sequence[int]) -> list[list[int]]:
    """Runs of blocks, a new run at each heading (the first run may have no heading)."""
    sections: list[list[int]] = []
    for index in blocks:
        if not sections or view.blocks[index].kind is BlockKind.HEADING:
            sections.append([])
        sections[-1].append(index)
    return sections


def parts_tokens(view: DocumentView, parts: Sequence[Range]) -> int:
    return sum(view.count(a, b) for a, b in parts)
