"""Test inputs for the chunking tests: a tiny Markdown-to-blocks reader (independent of the
extraction package), a deterministic fake embedding function, and a synthetic document
whose every word names the block it comes from ("b7x3" = block 7), so a test can tell
which blocks a chunk came from."""

from __future__ import annotations

import re
import zlib
from collections import Counter
from pathlib import Path

import numpy as np

from ragrpc.models import Block, BlockKind, ChunkDraft, ChunkKind, ExtractedDocument

EVAL_DOCS = Path(__file__).resolve().parents[2].parent / "shared" / "eval" / "docs"
MARKDOWN_DIR = EVAL_DOCS / "markdown"
WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)
TAG = re.compile(r"\bb(\d+)x\d+[ab]?\b", re.IGNORECASE)

_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+.#-]*)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_SEPARATOR = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def _starts_block(line: str) -> bool:
    return bool(_FENCE.match(line) or _HEADING.match(line) or line.lstrip().startswith("|"))


def _read_fence(lines: list[str], i: int) -> tuple[Block, int]:
    fence = _FENCE.match(lines[i])
    assert fence is not None
    body: list[str] = []
    i += 1
    while i < len(lines) and not lines[i].lstrip().startswith(fence.group(1)):
        body.append(lines[i])
        i += 1
    return Block(BlockKind.CODE, "\n".join(body), language=fence.group(2).lower()), i + 1


def _read_run(lines: list[str], i: int, table: bool) -> tuple[list[str], int]:
    run = [lines[i]]
    i += 1
    while i < len(lines) and lines[i].strip():
        if table != lines[i].lstrip().startswith("|") or (not table and _starts_block(lines[i])):
            break
        if not table and _LIST_ITEM.match(lines[i]) and _LIST_ITEM.match(run[0]):
            break
        run.append(lines[i])
        i += 1
    return run, i


def markdown_blocks(text: str, blocks_per_page: int = 8) -> list[Block]:
    """Blocks of a Markdown text; pages are made up (a new page every few blocks)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    path: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        heading = _HEADING.match(line)
        if not line.strip():
            i += 1
            continue
        if _FENCE.match(line):
            block, i = _read_fence(lines, i)
        elif heading:
            level = len(heading.group(1))
            path = [p for p in path if p[0] < level] + [(level, heading.group(2))]
            block, i = Block(BlockKind.HEADING, line, level=level), i + 1
        elif line.lstrip().startswith("|"):
            run, i = _read_run(lines, i, table=True)
            header = "\n".join(run[:2]) if len(run) > 1 and _SEPARATOR.match(run[1]) else ""
            block = Block(BlockKind.TABLE, "\n".join(run), table_header=header)
        else:
            run, i = _read_run(lines, i, table=False)
            kind = BlockKind.LIST_ITEM if _LIST_ITEM.match(run[0]) else BlockKind.PARAGRAPH
            block = Block(kind, "\n".join(run))
        page = 1 + len(blocks) // blocks_per_page
        blocks.append(
            Block(
                block.kind,
                block.text,
                page=page,
                section_path=tuple(t for _, t in path),
                level=block.level,
                language=block.language,
                table_header=block.table_header,
            )
        )
    return blocks


def markdown_document(name: str, blocks_per_page: int = 8) -> ExtractedDocument:
    text = (MARKDOWN_DIR / name).read_text(encoding="utf-8")
    return ExtractedDocument("text/markdown", markdown_blocks(text, blocks_per_page))


def fake_embed(texts: list[str], dim: int = 256) -> np.ndarray:
    """Bag of hashed words, L2-normalised: texts sharing words are similar."""
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for row, text in enumerate(texts):
        for word in re.findall(r"[a-z]{3,}", text.lower()):
            out[row, zlib.crc32(word.encode()) % dim] += 1.0
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.maximum(norms, 1e-9)


def words(text: str) -> list[str]:
    return WORD.findall(text)


def missing_words(document: ExtractedDocument, chunks: list[ChunkDraft]) -> Counter[str]:
    """Words of the document that the retrievable chunks do not account for."""
    have = Counter(w for c in chunks if c.kind is ChunkKind.RETRIEVABLE for w in words(c.text))
    need = Counter(words(document.text))
    return need - have


def blocks_in(text: str) -> set[int]:
    return {int(m.group(1)) for m in TAG.finditer(text)}


def _sentences(block: int, count: int, length: int) -> list[str]:
    return [
        " ".join([f"B{block}x{s * 100}"] + [f"b{block}x{s * 100 + k}" for k in range(1, length)]) + "."
        for s in range(count)
    ]


def tagged_document() -> tuple[ExtractedDocument, list[str]]:
    """A document of every block kind over 4 pages; returns it and its sentences."""
    sentences = {n: _sentences(n, c, ln) for n, c, ln in [(1, 8, 10), (3, 4, 7), (5, 30, 12), (7, 6, 9)]}
    code = "\n".join(
        f"def b6x{k}0(b6x{k}1):\n    b6x{k}2 = b6x{k}1 + 1\n    return b6x{k}2 * b6x{k}3\n" for k in range(12)
    )
    table = "| b8x1 | b8x2 |\n| --- | --- |\n" + "\n".join(f"| b8x{k}a | b8x{k}b |" for k in range(3, 45))
    giant = " ".join(f"b10x{k}" for k in range(300))
    blocks = [
        Block(BlockKind.HEADING, "# Guide b0x1", 1, ("Guide b0x1",), level=1),
        Block(BlockKind.PARAGRAPH, " ".join(sentences[1]), 1, ("Guide b0x1",)),
        Block(BlockKind.HEADING, "## Setup b2x1", 1, ("Guide b0x1", "Setup b2x1"), level=2),
        Block(BlockKind.LIST_ITEM, " ".join(sentences[3]), 2, ("Guide b0x1", "Setup b2x1"), level=1),
        Block(BlockKind.HEADING, "## Details b4x1", 2, ("Guide b0x1", "Details b4x1"), level=2),
        Block(BlockKind.PARAGRAPH, " ".join(sentences[5]), 2, ("Guide b0x1", "Details b4x1")),
        Block(BlockKind.CODE, code, 3, ("Guide b0x1", "Details b4x1"), language="python"),
        Block(BlockKind.PARAGRAPH, "\n\n".join(sentences[7]), 3, ("Guide b0x1", "Details b4x1")),
        Block(
            BlockKind.TABLE,
            table,
            3,
            ("Guide b0x1", "Details b4x1"),
            table_header="| b8x1 | b8x2 |\n| --- | --- |",
        ),
        Block(BlockKind.PARAGRAPH, "  \n\t ", 4, ("Guide b0x1", "Details b4x1")),
        Block(BlockKind.OTHER, giant, 4, ("Guide b0x1", "Details b4x1")),
    ]
    all_sentences = [s for n in sorted(sentences) for s in sentences[n]]
    return ExtractedDocument("text/markdown", blocks), all_sentences
