"""Source code chunking. Python is cut with `ast`: one top-level function or class per
chunk (with its decorators and the comments right above it), module-level statements
between definitions grouped; a class over max_tokens is split between its methods with the
class line repeated on top of every part. Other languages (and Python that does not parse)
are cut at blank lines and packed. Anything still too long is cut by lines, then tokens."""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ingest_service.chunking.base import DocumentView, Draft, Piece, PlannedChunker, Range
from ingest_service.chunking.units import CODE_LEVELS, Limits, pack, pack_drafts, split_blocks, split_range
from ragrpc.models import BlockKind

logger = logging.getLogger(__name__)

PYTHON_LANGUAGES = frozenset({"python", "py", "python3", "py3", "ipython"})
PYTHON_MEDIA_TYPES = frozenset({"text/x-python", "text/x-script.python", "application/x-python"})
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_LEADING_BLANK_LINES = re.compile(r"(?:[ \t]*\r?\n)*")


@dataclass(frozen=True)
class CodeUnit:
    """Lines first..last (1-based, inclusive) of a source; node when it is one definition."""

    first: int
    last: int
    node: ast.stmt | None


def _definition_start(node: ast.stmt, lines: list[str], previous_end: int) -> int:
    decorators = getattr(node, "decorator_list", [])
    line = min([node.lineno, *(d.lineno for d in decorators)])
    while line - 1 > previous_end and lines[line - 2].lstrip().startswith("#"):
        line -= 1  # comments right above belong to the definition
    return line


def code_units(body: Sequence[ast.stmt], lines: list[str], first: int, last: int) -> list[CodeUnit]:
    """Units covering lines first..last: each definition alone, other statements grouped."""
    starts: list[tuple[int, ast.stmt | None]] = []
    previous_end, previous_was_definition = first - 1, True
    for node in body:
        is_definition = isinstance(node, _DEFINITIONS)
        if is_definition:
            starts.append((_definition_start(node, lines, previous_end), node))
        elif previous_was_definition:
            starts.append((node.lineno, None))
        previous_was_definition = is_definition
        previous_end = node.end_lineno or node.lineno
    if not starts:
        return [CodeUnit(first, last, None)]
    starts[0] = (first, starts[0][1])
    bounds = [line for line, _ in starts[1:]] + [last + 1]
    return [CodeUnit(line, stop - 1, node) for (line, node), stop in zip(starts, bounds, strict=True)]


class _Source:
    """A code block's text with its line offsets into DocumentView.text."""

    def __init__(self, view: DocumentView, span: Range) -> None:
        self.view, self.start, self.end = view, span[0], span[1]
        self.text = view.text[self.start : self.end]
        self.lines = self.text.split("\n")
        self._offsets = [0]
        for line in self.lines:
            self._offsets.append(self._offsets[-1] + len(line) + 1)

    def piece(self, first: int, last: int) -> Piece:
        """Lines first..last without leading blank lines and trailing whitespace."""
        start = self.start + self._offsets[first - 1]
        end = min(self.end, self.start + self._offsets[last] - 1)
        lead = _LEADING_BLANK_LINES.match(self.view.text, start, end)
        start = lead.end() if lead else start
        while end > start and self.view.text[end - 1].isspace():
            end -= 1
        return self.view.piece(start, end)


class CodeChunker(PlannedChunker):
    """CODE blocks as described above; other blocks are packed as paragraphs. A CODE block
    without a language is Python when the document's media type is Python source."""

    name = "code"

    def plan(self, view: DocumentView, blocks: Sequence[int]) -> list[Draft]:
        drafts: list[Draft] = []
        prose: list[int] = []
        for index in blocks:
            if view.blocks[index].kind is BlockKind.CODE:
                drafts += self._prose(view, prose) + self.plan_code_block(view, index)
                prose = []
            else:
                prose.append(index)
        return drafts + self._prose(view, prose)

    def _limits(self) -> Limits:
        return Limits(self.config.chunk_size, self.config.max_tokens)

    def _prose(self, view: DocumentView, blocks: list[int]) -> list[Draft]:
        pieces = split_blocks(view, blocks, self._limits())
        return pack_drafts(view, pieces, self._limits(), self.name, min_tokens=self.config.min_chunk_tokens)

    def plan_code_block(self, view: DocumentView, index: int) -> list[Draft]:
        span = view.block_span(index)
        if self._is_python(view, index):
            source = _Source(view, span)
            try:
                tree = ast.parse(source.text)
            except (SyntaxError, ValueError) as exc:
                logger.debug("python block %d does not parse (%s): blank-line chunking", index, exc)
            else:
                units = code_units(tree.body, source.lines, 1, len(source.lines))
                return self._python_drafts(source, self._merge_small(source, units))
        return self._by_blank_lines(view, span)

    def _by_blank_lines(self, view: DocumentView, span: Range) -> list[Draft]:
        """Blank-line separated blocks packed up to chunk_size (then lines, then tokens)."""
        pieces = split_range(view, span, CODE_LEVELS, self._limits())
        return pack_drafts(view, pieces, self._limits(), self.name, min_tokens=self.config.min_chunk_tokens)

    @staticmethod
    def _is_python(view: DocumentView, index: int) -> bool:
        language = view.blocks[index].language.strip().lower()
        return language in PYTHON_LANGUAGES or (not language and view.media_type in PYTHON_MEDIA_TYPES)

    def _merge_small(self, source: _Source, units: list[CodeUnit]) -> list[CodeUnit]:
        """Module-level statements under min_chunk_tokens join the unit before them (the
        first ones the unit after them, unless that is a class), within max_tokens."""
        out: list[CodeUnit] = []
        pending: CodeUnit | None = None
        for unit in units:
            if pending is not None:
                if not isinstance(unit.node, ast.ClassDef) and self._fits(source, pending.first, unit.last):
                    unit = CodeUnit(pending.first, unit.last, unit.node)
                else:
                    out.append(pending)
                pending = None
            small = unit.node is None and source.piece(unit.first, unit.last).tokens < self.config.min_chunk_tokens
            if small and out and self._fits(source, out[-1].first, unit.last):
                out[-1] = CodeUnit(out[-1].first, unit.last, out[-1].node)
            elif small and not out:
                pending = unit
            else:
                out.append(unit)
        return out + ([pending] if pending is not None else [])

    def _fits(self, source: _Source, first: int, last: int) -> bool:
        return source.piece(first, last).tokens <= self.config.max_tokens

    def _python_drafts(self, source: _Source, units: list[CodeUnit]) -> list[Draft]:
        drafts: list[Draft] = []
        for unit in units:
            piece = source.piece(unit.first, unit.last)
            if piece.start >= piece.end:
                continue
            if piece.tokens <= self.config.max_tokens:
                drafts.append(Draft([(piece.start, piece.end)], self.name, piece.start))
            elif isinstance(unit.node, ast.ClassDef) and unit.node.body:
                drafts += self._class_drafts(source, unit, unit.node)
            else:
                drafts += self._by_blank_lines(source.view, (piece.start, piece.end))
        return drafts

    def _class_drafts(self, source: _Source, unit: CodeUnit, node: ast.ClassDef) -> list[Draft]:
        """Parts of a big class, each headed by the class line (decorators included)."""
        body_first = _definition_start(node.body[0], source.lines, node.lineno)
        header = source.piece(unit.first, body_first - 1)
        limits = Limits(self.config.chunk_size - header.tokens, self.config.max_tokens - header.tokens)
        if header.start >= header.end or limits.size < self.config.chunk_size // 2:
            whole = source.piece(unit.first, unit.last)
            return self._by_blank_lines(source.view, (whole.start, whole.end))
        pieces: list[Piece] = []
        for member in code_units(node.body, source.lines, body_first, unit.last):
            piece = source.piece(member.first, member.last)
            pieces += split_range(source.view, (piece.start, piece.end), CODE_LEVELS, limits, atomic=True)
        groups = pack(source.view, pieces, limits, min_tokens=self.config.min_chunk_tokens)
        return [
            Draft([(header.start, header.end), (g.pieces[0].start, g.pieces[-1].end)], self.name, header.start)
            for g in groups
        ]
