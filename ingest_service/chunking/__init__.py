"""Chunking strategies and their registry.

    chunker = build_chunker("auto", counter, ChunkingConfig(chunk_size=200))
    drafts = chunker.chunk(extracted_document)

Every strategy returns ChunkDrafts numbered 0..n-1; no RETRIEVABLE draft is longer than
config.max_tokens tokens of the counter (the embedding model's limit).
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

from ingest_service.chunking.auto import AutoChunker
from ingest_service.chunking.base import Chunker, ChunkingConfig, validate_config
from ingest_service.chunking.code import CodeChunker
from ingest_service.chunking.fixed import FixedTokenChunker
from ingest_service.chunking.heading import HeadingChunker
from ingest_service.chunking.hierarchical import HierarchicalChunker
from ingest_service.chunking.paragraph import ParagraphChunker
from ingest_service.chunking.recursive import RecursiveChunker
from ingest_service.chunking.semantic import EmbedFunction, SemanticChunker
from ingest_service.chunking.sentence import SentenceChunker
from ingest_service.chunking.table import TableChunker
from ragrpc.errors import InvalidInputError
from ragrpc.tokens import TokenCounter

__all__ = [
    "CHUNKING_STRATEGIES",
    "DEFAULT_STRATEGY",
    "AutoChunker",
    "Chunker",
    "ChunkingConfig",
    "CodeChunker",
    "EmbedFunction",
    "FixedTokenChunker",
    "HeadingChunker",
    "HierarchicalChunker",
    "ParagraphChunker",
    "RecursiveChunker",
    "SemanticChunker",
    "SentenceChunker",
    "TableChunker",
    "build_chunker",
    "validate_config",
]

_Factory = Callable[[TokenCounter, ChunkingConfig, "EmbedFunction | None"], Chunker]


def _semantic(counter: TokenCounter, config: ChunkingConfig, embed: EmbedFunction | None) -> Chunker:
    if embed is None:
        raise InvalidInputError(
            "the semantic chunking strategy needs an embedding function; none is configured",
            field="chunking.strategy",
        )
    return SemanticChunker(counter, config, embed=embed)


_FACTORIES: MappingProxyType[str, _Factory] = MappingProxyType(
    {
        "auto": lambda counter, config, _: AutoChunker(counter, config),
        "fixed_tokens": lambda counter, config, _: FixedTokenChunker(counter, config),
        "sentence": lambda counter, config, _: SentenceChunker(counter, config),
        "paragraph": lambda counter, config, _: ParagraphChunker(counter, config),
        "recursive": lambda counter, config, _: RecursiveChunker(counter, config),
        "semantic": _semantic,
        "hierarchical": lambda counter, config, _: HierarchicalChunker(counter, config),
        "heading": lambda counter, config, _: HeadingChunker(counter, config),
        "code": lambda counter, config, _: CodeChunker(counter, config),
        "table": lambda counter, config, _: TableChunker(counter, config),
    }
)
CHUNKING_STRATEGIES: tuple[str, ...] = tuple(_FACTORIES)
DEFAULT_STRATEGY = "auto"


def build_chunker(
    strategy: str,
    counter: TokenCounter,
    config: ChunkingConfig | None = None,
    embed: EmbedFunction | None = None,
) -> Chunker:
    """The chunker for `strategy` ("" means auto); InvalidInputError for an unknown name
    (listing the valid ones) or a configuration that cannot work."""
    name = (strategy or DEFAULT_STRATEGY).strip().lower()
    factory = _FACTORIES.get(name)
    if factory is None:
        raise InvalidInputError(
            f"unknown chunking strategy {strategy!r}; valid strategies: {', '.join(CHUNKING_STRATEGIES)}",
            field="chunking.strategy",
        )
    config = config or ChunkingConfig()
    validate_config(config)
    return factory(counter, config, embed)
