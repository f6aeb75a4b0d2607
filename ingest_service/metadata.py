"""Completes the metadata an extractor found: title fallback, a cheap language guess,
size and content hash. Pure functions; nothing here does I/O."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import PurePath
from types import MappingProxyType

from ragrpc.models import BlockKind, DocumentMetadata, ExtractedDocument

# Short, frequent, mostly language-specific function words.
_STOP_WORDS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "en": frozenset("the and of to is in that it with for was are this be on as by not have from".split()),
        "de": frozenset("der die und das ist nicht ein eine zu den mit sich auf für auch dem von wird".split()),
        "fr": frozenset("le la les et des est une dans que pour qui pas sur au avec du ce sont aux".split()),
        "es": frozenset("el la los las y que en es por una con para del se su al lo como más".split()),
        "nl": frozenset("de het een en van is dat niet op te voor met zijn ook als bij aan wordt".split()),
        "it": frozenset("il di che la è e per non una del della sono gli le con nel anche come".split()),
        "pt": frozenset("de que o a os as do da em um uma não para com por se mais são dos".split()),
    }
)
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
_SAMPLE_CHARS = 20_000


def content_hash(data: bytes) -> str:
    """sha256 hex digest of the raw document bytes."""
    return hashlib.sha256(data).hexdigest()


def guess_language(text: str) -> str:
    """ISO 639-1 code (en/de/fr/es/nl/it/pt) by stop-word counts; "" when unsure."""
    words = [w.lower() for w in _WORD.findall(text[:_SAMPLE_CHARS])]
    if len(words) < 20:
        return ""
    counts = Counter(words)
    scores = {lang: sum(counts[w] for w in stop) for lang, stop in _STOP_WORDS.items()}
    ranked = sorted(scores.items(), key=lambda item: item[1], reverse=True)
    (best, top), (_, second) = ranked[0], ranked[1]
    if top < 5 or top < 0.1 * len(words) or top < 1.5 * second:
        return ""
    return best


def _title_fallback(extracted: ExtractedDocument, file_name: str) -> str:
    for block in extracted.blocks:
        if block.kind is BlockKind.HEADING and block.text.strip():
            return block.text.strip()[:300]
    return PurePath(file_name).stem if file_name else ""


def document_metadata(
    extracted: ExtractedDocument,
    *,
    data: bytes = b"",
    file_name: str = "",
    source: str = "",
    sha256: str = "",
    size_bytes: int | None = None,
) -> DocumentMetadata:
    """A copy of extracted.metadata with title, language, size, hash (and source) filled in.

    extra gains "size_bytes", "sha256" (`sha256` when the caller has it, else computed), "file_name"
    and "source" (when given). `size_bytes` when the caller has it (the bytes may no longer be in
    memory), else len(data)."""
    found = extracted.metadata
    extra = dict(found.extra)
    size = len(data) if size_bytes is None else size_bytes
    extra.update({"size_bytes": str(size), "sha256": sha256 or content_hash(data)})
    if file_name:
        extra["file_name"] = file_name
    if source:
        extra["source"] = source
    return dataclasses.replace(
        found,
        title=found.title.strip() or _title_fallback(extracted, file_name),
        language=found.language or guess_language(extracted.text),
        extra=extra,
    )
