"""code: Python by `ast` (one definition per chunk), other code by blank-line blocks."""

from __future__ import annotations

import json.decoder
import re
from pathlib import Path

from ingest_service.chunking import ChunkingConfig, CodeChunker
from ragrpc.models import Block, BlockKind, ChunkDraft, ExtractedDocument
from ragrpc.tokens import WordTokenCounter
from tests.unit.chunking_helpers import missing_words

COUNTER = WordTokenCounter()
TOP_LEVEL_DEF = re.compile(r"^(?:async\s+def|def|class)\s+(\w+)", re.MULTILINE)

MODULE = '''"""Inventory service helpers."""

from __future__ import annotations

import logging
from dataclasses import dataclass

logger = logging.getLogger(__name__)
DEFAULT_LIMIT = 100


# Items are kept in memory; see the store module for persistence.
@dataclass(frozen=True)
class Item:
    """One stocked item."""

    sku: str
    name: str
    quantity: int = 0

    def restock(self, amount: int) -> "Item":
        if amount <= 0:
            raise ValueError(f"amount must be positive, got {amount}")
        return Item(self.sku, self.name, self.quantity + amount)


def find_item(items: list[Item], sku: str) -> Item | None:
    """The item with this SKU, if any."""
    for item in items:
        if item.sku == sku:
            return item
    return None


# Cached because the report is expensive to build.
@functools_cache
def low_stock(items: list[Item], limit: int = DEFAULT_LIMIT) -> list[Item]:
    """Items under the limit, lowest first."""
    found = [item for item in items if item.quantity < limit]
    found.sort(key=lambda item: item.quantity)
    logger.info("low stock: %d items", len(found))
    return found


async def sync_items(client, items: list[Item]) -> int:
    sent = 0
    for item in items:
        await client.put(item.sku, {"name": item.name, "quantity": item.quantity})
        sent += 1
    return sent


if __name__ == "__main__":
    print(low_stock([Item("a", "apple", 3)]))
'''


def _code_document(source: str, language: str = "python") -> ExtractedDocument:
    return ExtractedDocument("text/x-python", [Block(BlockKind.CODE, source, 1, language=language)])


def _definitions(chunk: ChunkDraft) -> list[str]:
    return TOP_LEVEL_DEF.findall(chunk.text)


def test_one_top_level_definition_per_chunk() -> None:
    config = ChunkingConfig(chunk_size=60, overlap=0, max_tokens=120, min_chunk_tokens=10)
    chunks = CodeChunker(COUNTER, config).chunk(_code_document(MODULE))
    names = [_definitions(c) for c in chunks]
    assert [n for n in names if n] == [["Item"], ["find_item"], ["low_stock"], ["sync_items"]]
    assert all(len(n) <= 1 for n in names)
    by_name = {n[0]: c.text for n, c in zip(names, chunks, strict=True) if n}
    assert by_name["Item"].startswith("# Items are kept in memory")  # comment and decorator go along
    assert "@dataclass(frozen=True)\nclass Item:" in by_name["Item"]
    assert by_name["low_stock"].startswith("# Cached because")
    assert chunks[0].text.startswith('"""Inventory service helpers."""')  # module code grouped
    assert "DEFAULT_LIMIT = 100" in chunks[0].text
    assert 'if __name__ == "__main__":' in chunks[-1].text  # small tail joins the chunk before
    assert not missing_words(_code_document(MODULE), chunks)


def test_a_big_class_is_split_by_methods_under_its_class_line() -> None:
    methods = "\n".join(
        f"    def method_{k}(self, value: int) -> int:\n"
        f"        total = value * {k} + self.offset\n"
        f"        return total - {k}\n"
        for k in range(20)
    )
    header = "import os\n\n\n@register\nclass Big(Base):\n    offset = 3\n\n"
    source = f"{header}{methods}\n\ndef after():\n    return 1\n"
    config = ChunkingConfig(chunk_size=60, overlap=0, max_tokens=80, min_chunk_tokens=0)
    chunks = CodeChunker(COUNTER, config).chunk(_code_document(source))
    big = [c for c in chunks if "method_" in c.text]
    assert len(big) > 3
    assert all(c.text.startswith("@register\nclass Big(Base):\n") for c in big)
    assert all(COUNTER.count(c.text) <= 80 for c in chunks)
    method_chunks = [re.findall(r"def (method_\d+)", c.text) for c in big]
    assert [m for ms in method_chunks for m in ms] == [f"method_{k}" for k in range(20)]  # whole, once
    assert chunks[-1].text.startswith("def after():")


def test_a_real_standard_library_module() -> None:
    source = Path(json.decoder.__file__).read_text(encoding="utf-8")
    chunks = CodeChunker(COUNTER, ChunkingConfig()).chunk(_code_document(source))
    assert all(COUNTER.count(c.text) <= 254 for c in chunks)
    assert all(len(_definitions(c)) <= 1 for c in chunks)
    defined = TOP_LEVEL_DEF.findall(source)
    assert list(dict.fromkeys(n for c in chunks for n in _definitions(c))) == defined
    decoder_parts = [c for c in chunks if _definitions(c) == ["JSONDecoder"]]
    assert len(decoder_parts) > 1  # too big for one chunk: split under its class line
    assert all(c.text.startswith("class JSONDecoder(object):\n    ") for c in decoder_parts)
    assert not missing_words(_code_document(source), chunks)


def test_unparseable_python_and_other_languages_split_at_blank_lines() -> None:
    blocks = "\n\n".join(f"function f{k}(x) {{\n  const y = x * {k};\n  return y + {k};\n}}" for k in range(12))
    broken = "def broken(:\n    pass\n\n" + blocks
    config = ChunkingConfig(chunk_size=50, overlap=0, max_tokens=60, min_chunk_tokens=0)
    for document in (_code_document(blocks, "javascript"), _code_document(broken)):
        chunks = CodeChunker(COUNTER, config).chunk(document)
        assert len(chunks) > 2
        for c in chunks:
            assert COUNTER.count(c.text) <= 50
            assert c.text.rstrip().endswith(("}", "pass"))  # whole blocks
        assert not missing_words(document, chunks)


def test_text_around_code_is_chunked_as_text() -> None:
    document = ExtractedDocument(
        "text/markdown",
        [
            Block(BlockKind.PARAGRAPH, "Some words about the code below. " * 20),
            Block(BlockKind.CODE, MODULE, language="python"),
        ],
    )
    config = ChunkingConfig(chunk_size=100, overlap=0)
    chunks = CodeChunker(COUNTER, config).chunk(document)
    assert chunks[0].text.startswith("Some words") and "import" not in chunks[0].text
    assert all(c.chunker == "code" for c in chunks)
