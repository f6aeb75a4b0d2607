"""The context header of a chunk: what it is part of (the document's title, the section path), put
in front of the chunk's text where it is embedded and indexed for BM25, so that a passage of one
document can be told from the like passage of a sibling (the same table in two quarters' filings,
the same boilerplate section in two reports).

    "amzn-10k 2017 | Amazon.com, Inc. 10-K FY2017 | Item 7. Management's Discussion > Results\\n<text>"

Only what is embedded and indexed carries it: `Chunk.text`, what callers read, prompts and
citations, is the chunk's own text. The header is built from stored fields (the chunk's `title`
and `section_path`, and the header terms in its metadata under `HEADER_TERMS_KEY`: what the
enrichers of its ingestion said the document is, see ragrpc.enrich, or what the request's
metadata gave), so the ingest service (embedding) and the query service (its BM25 index) build
the same one without storing it twice. It is cut to `MAX_HEADER_TOKENS` model tokens and to what
the chunk leaves free of the model's window (`header_budget`): the chunk planner plans with the
whole window, so adding headers never splits a passage that was one chunk, and a chunk that fills
the window gets a shorter header or none. A chunk whose text already begins with the title (the
first chunk of a document that opens with its title) gets no second copy of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ragrpc.models import ChunkRecord
from ragrpc.tokens import TokenCounter

MAX_HEADER_TOKENS = 32
SEPARATOR = " | "
# Chunk metadata key of the words the header names after the title (a document's enrichers give
# them at ingestion, ragrpc.enrich; a request's metadata may give them too).
HEADER_TERMS_KEY = "header_terms"


def context_header(
    title: str,
    section_path: tuple[str, ...] | list[str] = (),
    metadata: Mapping[str, Any] | None = None,
    text: str = "",
) -> str:
    """The header text (without token cut): title, the header terms of `metadata`, then the section
    path. The title is left out when `text`, the chunk's own text, already begins with it."""
    title = " ".join(title.split()) if title else ""
    parts = [title] if title and not _begins_with(text, title) else []
    if terms := " ".join(str((metadata or {}).get(HEADER_TERMS_KEY) or "").split()):
        parts.append(terms)
    sections = [" ".join(s.split()) for s in section_path if s and s.strip()]
    # a section path that repeats the title (a document whose first heading is its title) adds nothing
    if sections and parts and sections[0].casefold() == parts[0].casefold():
        sections = sections[1:]
    if sections:
        parts.append(" > ".join(sections))
    return SEPARATOR.join(parts)


def _begins_with(text: str, title: str) -> bool:
    if not text:
        return False
    opening = " ".join(text[: 2 * len(title) + 16].split()).casefold()
    return opening.startswith(title.casefold())


def header_budget(text: str, counter: TokenCounter, window: int, text_tokens_at_most: int = 0) -> int:
    """The tokens a header may take in front of `text` within `window` (the model's limit):
    `MAX_HEADER_TOKENS` at most, and what the text leaves free (one token for the line break).
    `text_tokens_at_most` (0: not known): a bound on the text's tokens (`ChunkDraft.token_bound`);
    when it leaves the whole header free, the text is not tokenized again (same budget)."""
    if window <= 0:
        return MAX_HEADER_TOKENS
    if 0 < text_tokens_at_most and window - text_tokens_at_most - 1 >= MAX_HEADER_TOKENS:
        return MAX_HEADER_TOKENS
    return max(0, min(MAX_HEADER_TOKENS, window - counter.count(text) - 1))


def cut_to_tokens(header: str, counter: TokenCounter, limit: int = MAX_HEADER_TOKENS) -> str:
    """`header` cut at a word boundary to at most `limit` tokens of the model."""
    if not header or limit <= 0:
        return ""
    if counter.count(header) <= limit:
        return header
    words = header.split(" ")
    low, high = 0, len(words)
    while low < high:  # the most words that fit
        middle = (low + high + 1) // 2
        if counter.count(" ".join(words[:middle])) <= limit:
            low = middle
        else:
            high = middle - 1
    return " ".join(words[:low])


def embedded_text(
    title: str,
    section_path: tuple[str, ...] | list[str],
    metadata: Mapping[str, Any] | None,
    text: str,
    counter: TokenCounter,
    window: int,
    text_tokens_at_most: int = 0,
) -> str:
    """What the model embeds of a chunk: its text after its context header, the header cut to what
    the text leaves free of the model's window (`header_budget`). The ingest pipeline embeds this;
    the ingestion benchmark rebuilds it from the stored chunk (title, section path, metadata, text),
    without the chunker's token bound, and gets the same text."""
    header = context_header(title, section_path, metadata, text)
    if header:
        header = cut_to_tokens(header, counter, header_budget(text, counter, window, text_tokens_at_most))
    return with_header(header, text)


def bm25_text(chunk: ChunkRecord, *, context_headers: bool) -> str:
    """What BM25 indexes of a stored chunk (rank_bm25 in the query service, Milvus' BM25 field at
    ingestion): its text after its context header (not cut by tokens), when headers are on."""
    header = context_header(chunk.title, chunk.section_path, chunk.metadata, chunk.text) if context_headers else ""
    return with_header(header, chunk.text)


def with_header(header: str, text: str) -> str:
    """The text as embedded / indexed."""
    return f"{header}\n{text}" if header else text
