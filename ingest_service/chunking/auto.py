"""The default strategy: picks a strategy per document and per region, as an engineer
would. A document within one chunk stays whole. Code blocks go to the code chunker and
tables to the table chunker (kept intact; the text around them is chunked separately),
unless they are small enough to stay inside their text. The text goes to the heading
chunker when the document has headings, else to the recursive chunker. Each chunk's
`chunker` says which strategy made it ("auto/table", "auto/heading", ...)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ingest_service.chunking.base import ChunkingConfig, DocumentView, Draft, PlannedChunker
from ingest_service.chunking.code import CodeChunker
from ingest_service.chunking.heading import HeadingChunker
from ingest_service.chunking.recursive import RecursiveChunker
from ingest_service.chunking.table import TableChunker
from ingest_service.chunking.units import parts_tokens
from ragrpc.models import BlockKind
from ragrpc.tokens import TokenCounter

logger = logging.getLogger(__name__)


class AutoChunker(PlannedChunker):
    name = "auto"

    def __init__(self, counter: TokenCounter, config: ChunkingConfig | None = None) -> None:
        super().__init__(counter, config)
        self._code = CodeChunker(counter, self.config)
        self._table = TableChunker(counter, self.config)
        self._heading = HeadingChunker(counter, self.config)
        self._recursive = RecursiveChunker(counter, self.config)

    def plan_short(self, view: DocumentView) -> list[Draft]:
        parts = view.whole_parts()
        return [Draft(parts, f"{self.name}/whole", parts[0][0])]

    def plan(self, view: DocumentView, blocks: Sequence[int]) -> list[Draft]:
        has_headings = any(view.blocks[i].kind is BlockKind.HEADING for i in blocks)
        text_chunker: PlannedChunker = self._heading if has_headings else self._recursive
        drafts: list[Draft] = []
        headings: list[int] = []  # headings right before a code block or table
        regions = self._regions(view, blocks, text_chunker)
        for number, (chunker, region) in enumerate(regions):
            if chunker is text_chunker and number + 1 < len(regions):
                region, headings = _split_trailing_headings(view, region)
            planned = self._relabel(chunker.plan(view, region), chunker) if region else []
            if chunker is not text_chunker and headings:
                drafts += self._attach_headings(view, headings, planned)
                headings = []
            drafts += planned
        return drafts

    def _relabel(self, drafts: list[Draft], chunker: PlannedChunker) -> list[Draft]:
        for draft in drafts:
            draft.chunker = f"{self.name}/{chunker.name}"
        return drafts

    def _attach_headings(self, view: DocumentView, headings: list[int], planned: list[Draft]) -> list[Draft]:
        """Puts the headings on top of the first planned draft when that stays within
        max_tokens; else they become a chunk of their own (returned)."""
        header = (view.block_span(headings[0])[0], view.block_span(headings[-1])[1])
        if planned and parts_tokens(view, [header, *planned[0].parts]) <= self.config.max_tokens:
            planned[0].parts = [header, *planned[0].parts]
            return []
        return self._relabel(self._heading.plan(view, headings), self._heading)

    def _special_chunker(self, view: DocumentView, index: int) -> PlannedChunker | None:
        kind = view.blocks[index].kind
        if kind not in (BlockKind.CODE, BlockKind.TABLE):
            return None
        over_a_page_break = kind is BlockKind.TABLE and (
            view.same_table(index - 1, index) or view.same_table(index, index + 1)
        )
        if view.count(*view.block_span(index)) <= self.config.inline_block_tokens and not over_a_page_break:
            return None  # small: stays with the text around it (a table over a page break stays one)
        return self._code if kind is BlockKind.CODE else self._table

    def _regions(
        self, view: DocumentView, blocks: Sequence[int], text_chunker: PlannedChunker
    ) -> list[tuple[PlannedChunker, list[int]]]:
        """Consecutive blocks that go to the same chunker."""
        regions: list[tuple[PlannedChunker, list[int]]] = []
        for index in blocks:
            chunker = self._special_chunker(view, index) or text_chunker
            if regions and regions[-1][0] is chunker:
                regions[-1][1].append(index)
            else:
                regions.append((chunker, [index]))
        logger.debug("auto: %s", [(c.name, len(r)) for c, r in regions])
        return regions


def _split_trailing_headings(view: DocumentView, region: list[int]) -> tuple[list[int], list[int]]:
    cut = len(region)
    while cut > 0 and view.blocks[region[cut - 1]].kind is BlockKind.HEADING:
        cut -= 1
    return region[:cut], region[cut:]
