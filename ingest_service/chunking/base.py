"""What every chunker shares: the configuration, the Chunker protocol, a document tokenized
once (`DocumentView`; its token windows: `token_windows`), and turning a plan (`Draft`s: char
ranges of the document) into numbered `ChunkDraft`s with pages and section paths.

Sizes are in tokens of the injected TokenCounter (the embedding model's own tokenizer in
production). The document is tokenized once; every range is counted by bisecting the token
spans, so no chunker calls the tokenizer in a loop. `finalize` tokenizes a finished
RETRIEVABLE chunk again when that estimate comes near `max_tokens` and cuts it if it is
over, so the limit holds even where joining parts changes the count by a few tokens.
"""

from __future__ import annotations

import bisect
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ingest_service.chunking.token_windows import Range, TokenizedText
from ragrpc.errors import InvalidInputError
from ragrpc.models import Block, BlockKind, ChunkDraft, ChunkKind, ExtractedDocument
from ragrpc.tokens import TokenCounter

logger = logging.getLogger(__name__)

MODEL_MAX_TOKENS = 254  # all-MiniLM-L6-v2: 256 positions less [CLS] and [SEP]
DEFAULT_OVERLAP_FRACTION = 0.15
BLOCK_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class ChunkingConfig:
    """Sizes in tokens.

    chunk_size is the packing target. Units that are indivisible by meaning (a sentence, a
    table, a function, a table row) are kept whole up to max_tokens, the model's hard limit,
    which no retrievable chunk ever exceeds. overlap None means 15% of chunk_size.
    """

    chunk_size: int = 200
    overlap: int | None = None
    max_tokens: int = MODEL_MAX_TOKENS
    min_chunk_tokens: int = 20  # a smaller trailing piece is merged into its neighbour
    parent_size: int = 1024  # hierarchical: a PARENT chunk (context only, not embedded)
    child_size: int = 96  # hierarchical: the retrievable children (capped at max_tokens)
    inline_block_tokens: int = 64  # auto: smaller code/table blocks stay with their text
    semantic_threshold: float = 0.3  # semantic: split where adjacent similarity < this
    semantic_percentile: float | None = None  # semantic: if set, split below this percentile

    @property
    def overlap_tokens(self) -> int:
        if self.overlap is None:
            return round(self.chunk_size * DEFAULT_OVERLAP_FRACTION)
        return self.overlap


def validate_config(config: ChunkingConfig) -> None:
    """Raises InvalidInputError naming the first setting that cannot work."""
    checks: list[tuple[bool, str, str]] = [
        (config.max_tokens >= 1, "max_tokens", f"max_tokens must be >= 1, got {config.max_tokens}"),
        (
            1 <= config.chunk_size <= config.max_tokens,
            "chunk_size",
            f"chunk_size must be between 1 and max_tokens ({config.max_tokens}), got {config.chunk_size}",
        ),
        (
            0 <= config.overlap_tokens < config.chunk_size,
            "overlap",
            f"overlap must be >= 0 and smaller than chunk_size ({config.chunk_size}), got {config.overlap_tokens}",
        ),
        (config.min_chunk_tokens >= 0, "min_chunk_tokens", "min_chunk_tokens must be >= 0"),
        (config.child_size >= 1, "child_size", f"child_size must be >= 1, got {config.child_size}"),
        (
            config.parent_size >= config.child_size,
            "parent_size",
            f"parent_size ({config.parent_size}) must be >= child_size ({config.child_size})",
        ),
        (config.inline_block_tokens >= 0, "inline_block_tokens", "inline_block_tokens must be >= 0"),
        (
            -1.0 <= config.semantic_threshold <= 1.0,
            "semantic_threshold",
            "semantic_threshold is a cosine similarity and must be in [-1, 1]",
        ),
        (
            config.semantic_percentile is None or 0.0 < config.semantic_percentile < 100.0,
            "semantic_percentile",
            "semantic_percentile must be in (0, 100)",
        ),
    ]
    for ok, name, message in checks:
        if not ok:
            raise InvalidInputError(f"invalid chunking config: {message}", field=f"chunking.{name}")


class Chunker(Protocol):
    """Splits an extracted document into chunk drafts (numbered 0..n-1, in order)."""

    name: str

    def chunk(self, document: ExtractedDocument) -> list[ChunkDraft]: ...


@dataclass(frozen=True)
class Piece:
    """A character range of the document text and its token count."""

    start: int
    end: int
    tokens: int


@dataclass(eq=False)
class Draft:
    """A planned chunk: ranges of DocumentView.text joined in order, after `prefix`.

    anchor is the offset whose block gives the chunk's section_path (the chunk's own first
    block, not its overlap or repeated header). parent links a child to its PARENT draft.
    """

    parts: list[Range]
    chunker: str
    anchor: int
    kind: ChunkKind = ChunkKind.RETRIEVABLE
    parent: Draft | None = None
    prefix: str = ""  # a line put on top of the parts (a compacted table header)


class DocumentView:
    """The non-blank blocks of a document joined by blank lines, tokenized once."""

    def __init__(self, document: ExtractedDocument, counter: TokenCounter) -> None:
        self.media_type = document.media_type
        self.blocks: tuple[Block, ...] = tuple(b for b in document.blocks if b.text.strip())
        self._block_starts: list[int] = []
        position = 0
        for block in self.blocks:
            self._block_starts.append(position)
            position += len(block.text) + len(BLOCK_SEPARATOR)
        text = BLOCK_SEPARATOR.join(b.text for b in self.blocks)
        self.tokens = TokenizedText(text, counter.spans(text) if text else [])

    @property
    def text(self) -> str:
        return self.tokens.text

    @property
    def total_tokens(self) -> int:
        return self.tokens.total_tokens

    def count(self, start: int, end: int) -> int:
        return self.tokens.count(start, end)

    def piece(self, start: int, end: int) -> Piece:
        return Piece(start, end, self.tokens.count(start, end))

    def block_span(self, index: int) -> Range:
        """Block `index` without surrounding whitespace (code keeps its first indent)."""
        block, start = self.blocks[index], self._block_starts[index]
        end = start + len(block.text.rstrip())
        if block.kind is BlockKind.CODE:
            lead = re.match(r"(?:[ \t]*\r?\n)*", block.text)
            return start + (lead.end() if lead else 0), end
        return start + len(block.text) - len(block.text.lstrip()), end

    def block_at(self, offset: int) -> int:
        return max(0, bisect.bisect_right(self._block_starts, offset) - 1)

    def blocks_of(self, parts: Sequence[Range]) -> list[int]:
        """Blocks the chunk's text comes from; a repeated header (a part that does not run
        on into the next one) is left out when there is text after it."""
        found: set[int] = set()
        for k, (start, end) in enumerate(parts):
            if k + 1 < len(parts) and not self._runs_on(parts[k], parts[k + 1]):
                continue
            found.update(range(self.block_at(start), self.block_at(max(start, end - 1)) + 1))
        return sorted(found)

    def _runs_on(self, part: Range, following: Range) -> bool:
        if part[1] <= following[0] and not self.text[part[1] : following[0]].strip():
            return True
        return self.same_table(self.block_at(max(part[0], part[1] - 1)), self.block_at(following[0]))

    def same_table(self, first: int, later: int) -> bool:
        """Whether block `later` goes on with the table of block `first` (a table over a page
        break: every block after `first` up to `later` continues it)."""
        if not 0 <= first < later < len(self.blocks) or self.blocks[first].kind is not BlockKind.TABLE:
            return False
        return all(self.blocks[k].continues_table for k in range(first + 1, later + 1))

    def is_heading(self, piece: Piece) -> bool:
        index = self.block_at(piece.start)
        return self.blocks[index].kind is BlockKind.HEADING and self.block_span(index) == (
            piece.start,
            piece.end,
        )

    def render(self, parts: Sequence[Range]) -> str:
        """Text of the parts; ranges that follow each other keep the original whitespace
        between them, others are joined by a newline (a blank line across blocks)."""
        out: list[str] = []
        for k, (start, end) in enumerate(parts):
            if k:
                prev_start, prev_end = parts[k - 1]
                gap = self.text[prev_end:start]
                if not self._runs_on(parts[k - 1], (start, end)) or self.text[prev_end:start].strip():
                    before, after = self.block_at(max(prev_start, prev_end - 1)), self.block_at(start)
                    gap = "\n" if before == after or self.same_table(before, after) else BLOCK_SEPARATOR
                out.append(gap)
            out.append(self.text[start:end])
        return "".join(out)

    def whole(self) -> Range:
        return self.block_span(0)[0], self.block_span(len(self.blocks) - 1)[1]

    def whole_parts(self) -> list[Range]:
        """The whole text as parts, without the repeated header lines of a table that goes on
        over a page break."""
        parts: list[Range] = []
        start = self.block_span(0)[0]
        for index in range(1, len(self.blocks)):
            if self.same_table(index - 1, index):
                rows = self.continued_rows(index)
                parts.append((start, self.block_span(index - 1)[1]))
                start = rows[0] if rows[0] < rows[1] else self.block_span(index)[1]
        parts.append((start, self.whole()[1]))
        return [part for part in parts if part[0] < part[1]]

    def continued_rows(self, index: int) -> Range:
        """The rows of TABLE block `index`, a continuation (`continues_table`) that begins with the
        declared header lines (Block.table_header) of the table it goes on with."""
        start, end = self.block_span(index)
        header = self.blocks[index].table_header.strip()
        if header and self.text.startswith(header, start):
            start = min(end, start + len(header))
            while start < end and self.text[start].isspace():
                start += 1
        return start, end


def draft_of(pieces: Sequence[Piece], chunker: str, own_from: int = 0) -> Draft:
    """One draft over consecutive pieces (their whole stretch of the text); its section
    comes from piece `own_from` (the first piece that is not overlap)."""
    return Draft([(pieces[0].start, pieces[-1].end)], chunker, pieces[own_from].start)


def _token_bound(view: DocumentView, draft: Draft, text: str, counter: TokenCounter, config: ChunkingConfig) -> int:
    """At most how many model tokens the rendered chunk has. The estimate from the document's own
    tokenization can only be off by a few tokens where parts are joined, so only a chunk near
    max_tokens (or one with a prefix line) is tokenized again, and its bound is then exact."""
    estimate = sum(view.count(a, b) for a, b in draft.parts)
    bound = estimate + max(8, config.max_tokens // 10)
    if not draft.prefix and bound < config.max_tokens:
        return bound
    return counter.count(text)


def finalize(
    view: DocumentView, drafts: Sequence[Draft], counter: TokenCounter, config: ChunkingConfig
) -> list[ChunkDraft]:
    """Renders drafts into ChunkDrafts numbered 0..n-1, with pages (of the blocks the text
    comes from, a repeated header left out), section paths and parent indexes; a retrievable
    chunk over max_tokens (should not happen) is cut by tokens."""
    rendered: list[tuple[Draft, str, int]] = []  # (draft, text, token bound; 0 when not known)
    for draft in drafts:
        text = view.render(draft.parts)
        if draft.prefix:
            text = f"{draft.prefix}\n{text}"
        if not text.strip():
            continue
        if draft.kind is not ChunkKind.RETRIEVABLE:
            rendered.append((draft, text, 0))
            continue
        bound = _token_bound(view, draft, text, counter, config)
        if bound > config.max_tokens:
            logger.warning("chunk by %s over %d tokens: cut by tokens", draft.chunker, config.max_tokens)
            own = TokenizedText(text, counter.spans(text))
            pieces = own.windows(0, len(text), config.chunk_size)
            rendered.extend((draft, text[a:b], 0) for a, b in pieces)  # a slice re-tokenizes: not known
        else:
            rendered.append((draft, text, bound))
    first_index: dict[int, int] = {}
    out: list[ChunkDraft] = []
    for index, (draft, text, bound) in enumerate(rendered):
        first_index.setdefault(id(draft), index)
        pages = [p for b in view.blocks_of(draft.parts) if (p := view.blocks[b].page) is not None]
        parent = first_index.get(id(draft.parent), -1) if draft.parent is not None else -1
        out.append(
            ChunkDraft(
                text=text,
                chunk_index=index,
                chunker=draft.chunker,
                page_start=min(pages, default=0),
                page_end=max(pages, default=0),
                section_path=view.blocks[view.block_at(draft.anchor)].section_path,
                kind=draft.kind,
                parent_index=parent,
                token_bound=bound,
            )
        )
    return out


class PlannedChunker:
    """Base of the strategies: chunk() = view, plan, finalize. A document no longer than
    one chunk becomes exactly one chunk. Subclasses set `name` and implement plan()."""

    name = "base"

    def __init__(self, counter: TokenCounter, config: ChunkingConfig | None = None) -> None:
        self.counter = counter
        self.config = config or ChunkingConfig()
        validate_config(self.config)

    def chunk(self, document: ExtractedDocument) -> list[ChunkDraft]:
        view = DocumentView(document, self.counter)
        if not view.blocks:
            return []
        if view.total_tokens <= self.config.chunk_size:
            drafts = self.plan_short(view)
        else:
            drafts = self.plan(view, range(len(view.blocks)))
        chunks = finalize(view, drafts, self.counter, self.config)
        logger.debug("%s: %d tokens -> %d chunks", self.name, view.total_tokens, len(chunks))
        return chunks

    def plan_short(self, view: DocumentView) -> list[Draft]:
        parts = view.whole_parts()
        return [Draft(parts, self.name, parts[0][0])]

    def plan(self, view: DocumentView, blocks: Sequence[int]) -> list[Draft]:
        raise NotImplementedError
