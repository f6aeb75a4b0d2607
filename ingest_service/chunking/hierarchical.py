"""Parent/child chunking: PARENT chunks (a section, or consecutive subsections, up to
parent_size tokens; context for the answer, never embedded) and small RETRIEVABLE children
(up to child_size tokens) that point at their parent through parent_index."""

from __future__ import annotations

from collections.abc import Sequence

from ingest_service.chunking.base import DocumentView, Draft, PlannedChunker
from ingest_service.chunking.units import (
    Limits,
    heading_level,
    pack,
    pack_drafts,
    split_blocks,
    split_sections,
)
from ragrpc.models import ChunkKind


class HierarchicalChunker(PlannedChunker):
    """A section joins the parent of the section before it when it is a subsection of that
    parent's first section and the parent stays within parent_size; a section larger than
    parent_size becomes several parents. Children never cross a parent."""

    name = "hierarchical"

    def plan_short(self, view: DocumentView) -> list[Draft]:
        parts = view.whole_parts()
        parent = Draft(parts, self.name, parts[0][0], ChunkKind.PARENT)
        return [parent, Draft(list(parts), self.name, parts[0][0], parent=parent)]

    def plan(self, view: DocumentView, blocks: Sequence[int]) -> list[Draft]:
        config = self.config
        hard = min(config.max_tokens, config.parent_size)
        child_limits = Limits(min(config.child_size, hard), hard)
        parent_limits = Limits(config.parent_size, config.parent_size)
        drafts: list[Draft] = []
        for parent_blocks in self._parent_sections(view, blocks):
            pieces = split_blocks(view, parent_blocks, child_limits)
            for group in pack(view, pieces, parent_limits, min_tokens=config.min_chunk_tokens):
                parent = group.draft(self.name)
                parent.kind = ChunkKind.PARENT
                drafts.append(parent)
                children = pack_drafts(view, group.pieces, child_limits, self.name, min_tokens=config.min_chunk_tokens)
                for child in children:
                    child.parent = parent
                drafts += children
        return drafts

    def _parent_sections(self, view: DocumentView, blocks: Sequence[int]) -> list[list[int]]:
        merged: list[list[int]] = []
        level, tokens = 0, 0
        for section in split_sections(view, blocks):
            size = sum(view.count(*view.block_span(i)) for i in section)
            deeper = heading_level(view, section[0]) > level
            if merged and deeper and tokens + size <= self.config.parent_size:
                merged[-1] += section
                tokens += size
            else:
                merged.append(list(section))
                level, tokens = heading_level(view, section[0]), size
        return merged
