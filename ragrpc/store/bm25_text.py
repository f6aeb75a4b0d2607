"""What Milvus' BM25 function indexes for a chunk in collections of schema 2, and the query it is
searched with.

Milvus' own analyzers (milvus-lite 3.2 and the servers this project runs on offer the `standard`
tokenizer; stemmer and stop-word filters are accepted and ignored there) would index "Ducks swim" as
`ducks`, `swim` and never match "duck", and they read only the stored `text`, which carries no
context header. So the ingest service writes a second field, `bm25_text`: the chunk's context header
and text (the header the rank_bm25 backend indexes, ragrpc.context_header) analysed by ragrpc's
English analyzer (stop words removed, Snowball stems) and joined by spaces. The analyzer's terms are
runs of letters and digits, which the standard tokenizer splits back into exactly those terms, so
Milvus' BM25 scores the same terms as rank_bm25 (with its own k1/b and statistics). A query is
analysed the same way before it is sent.

Collections of schema 1 (created before) index the raw `text` and are searched with the raw query;
`CollectionSetup.bm25_analysed` tells which one a collection is.

The same field, on every server (Milvus 2.3.5 has no BM25 function, but stores it), saves the query
service's rank_bm25 index from analysing every chunk again when it loads (a third of its start-up
at 1M chunks): `stored_terms` turns it back into the analyzer's terms. The terms follow the ingest
service's RAGRPC_CONTEXT_HEADERS, which the two services share.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ragrpc.analyzer import Analyzer
from ragrpc.context_header import context_header, with_header
from ragrpc.models import ChunkRecord
from ragrpc.store import schema as s


class Bm25Text:
    """Turns chunks and queries into the space-separated terms Milvus' BM25 function indexes."""

    def __init__(self, analyzer: Analyzer, *, context_headers: bool = True) -> None:
        self._analyzer = analyzer
        self._context_headers = context_headers

    def document(self, chunk: ChunkRecord) -> str:
        """The terms of the chunk's header and text, cut at a term boundary to the field's length: its
        `bm25_terms` when it comes with them (analysed by the ingest service's document workers, with
        an analyser built from the same settings), else analysed here."""
        terms = chunk.bm25_terms
        if terms is None:
            terms = self.terms(chunk.title, chunk.section_path, chunk.metadata, chunk.text)
        return _cut(" ".join(terms), s.VARCHAR_LIMITS[s.BM25_TEXT])

    def terms(
        self, title: str, section_path: tuple[str, ...], metadata: Mapping[str, Any], text: str
    ) -> tuple[str, ...]:
        """The analysed terms of a chunk's header and text (`ragrpc.context_header.bm25_text`)."""
        header = context_header(title, section_path, metadata, text) if self._context_headers else ""
        return tuple(self._analyzer.analyze(with_header(header, text)))

    def query(self, text: str) -> str:
        """The query's terms; empty when it has none (only stop words or punctuation)."""
        return " ".join(self._analyzer.analyze(text))


# A term is at most EnglishAnalyzer's max_token_length (64) characters of at most 4 UTF-8 bytes, so a
# field this close to its limit may have been cut (`_cut`), and then its terms are not the chunk's.
_LONGEST_TERM_BYTES = 4 * 64


def stored_terms(field: str) -> tuple[str, ...] | None:
    """The terms of a stored `bm25_text`, interned; None when the field may have been cut at its length
    (the chunk's text must then be analysed).

    Interned because the query service holds every chunk's terms until its start-up scan ends: a tuple
    of shared strings costs a pointer a term, a tuple of fresh ones a string object each, and the heap
    that many small strings fragment is not given back after the scan (docs/benchmarks.md)."""
    safe = s.VARCHAR_LIMITS[s.BM25_TEXT] - _LONGEST_TERM_BYTES - 1
    if 4 * len(field) > safe and len(field.encode()) > safe:  # (a character is at most 4 bytes)
        return None
    return tuple(map(sys.intern, field.split(" "))) if field else ()


def _cut(terms: str, limit_bytes: int) -> str:
    """At most `limit_bytes` UTF-8 bytes of `terms`, ending at a term boundary (Milvus counts bytes)."""
    encoded = terms.encode()
    if len(encoded) <= limit_bytes:
        return terms
    kept = encoded[: limit_bytes + 1].decode(errors="ignore")
    return kept[: kept.rfind(" ")] if " " in kept else ""
