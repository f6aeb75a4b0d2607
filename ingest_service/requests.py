"""Domain form of ingestion requests and their validation (no protobuf here)."""

from __future__ import annotations

import functools
import hashlib
import re
import tempfile
from dataclasses import dataclass, field

from ragrpc import errors
from ragrpc.store import schema as s

DOCUMENT_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
COLLECTION_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
MAX_METADATA_ENTRIES = 64
MAX_METADATA_VALUE_CHARS = 4096
MAX_FILE_NAME_BYTES = 1024


def _check_bytes(value: str, limit: int, field: str) -> None:
    """Stored VARCHAR values are limited in UTF-8 bytes (ragrpc.store.schema.VARCHAR_LIMITS)."""
    size = s.utf8_length(value)
    if size > limit:
        raise errors.InvalidInputError(
            f"{field} is {size} bytes in UTF-8; the limit is {limit} bytes (a CJK character takes 3)",
            field=field,
            reason="VALUE_TOO_LONG",
            metadata={"limit_bytes": str(limit), "bytes": str(size)},
        )


@dataclass
class DocumentSpecInput:
    """What the caller says about a document (DocumentSpec in the API)."""

    document_id: str = ""
    file_name: str = ""
    media_type: str = ""
    collection: str = ""
    source: str = ""
    title: str = ""
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    password: str = ""
    chunking_strategy: str = "auto"
    chunk_size_tokens: int = 0
    chunk_overlap_tokens: int = 0


class SpooledUpload:
    """The bytes of an upload as they arrive: in memory up to `memory_limit` bytes, then in a
    temporary file (deleted on close), hashed on the way in. Many uploads waiting for their turn
    then cost disk, not memory; only the documents being extracted are read back whole."""

    def __init__(self, memory_limit: int, directory: str | None = None) -> None:
        self._file = tempfile.SpooledTemporaryFile(max_size=memory_limit, dir=directory)
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self._hash.update(data)
        self.size += len(data)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    @property
    def on_disk(self) -> bool:
        return bool(getattr(self._file, "_rolled", False))

    def read(self) -> bytes:
        self._file.seek(0)
        return self._file.read()

    def close(self) -> None:
        self._file.close()


@dataclass
class IngestItem:
    """One document to ingest, for one tenant: its spec and its bytes (inline `content`, or an
    `upload` spooled as it arrived)."""

    tenant: str
    spec: DocumentSpecInput
    content: bytes = b""
    upload: SpooledUpload | None = None

    @property
    def size(self) -> int:
        return self.upload.size if self.upload is not None else len(self.content)

    def read(self) -> bytes:
        """The bytes (read back from the spool for an upload: call it off the event loop)."""
        return self.upload.read() if self.upload is not None else self.content

    @functools.cached_property
    def content_hash(self) -> str:
        """SHA-256 of the bytes, computed once (the pipeline asks for it off the event loop)."""
        if self.upload is not None:
            return self.upload.sha256
        return hashlib.sha256(self.content).hexdigest()

    def close(self) -> None:
        """Drops a spooled upload's bytes (when its ingestion has ended)."""
        if self.upload is not None:
            self.upload.close()


def derived_document_id(content_hash: str) -> str:
    return f"doc-{content_hash[:24]}"


def validate_spec(spec: DocumentSpecInput, *, field_prefix: str = "spec") -> None:
    """Raises InvalidInputError naming the offending field."""
    if spec.document_id and not DOCUMENT_ID_PATTERN.match(spec.document_id):
        raise errors.InvalidInputError(
            f"document_id {spec.document_id[:140]!r} is invalid: use 1-128 characters of A-Z a-z 0-9 . _ : -",
            field=f"{field_prefix}.document_id",
        )
    if spec.collection and not COLLECTION_PATTERN.match(spec.collection):
        raise errors.InvalidInputError(
            f"collection {spec.collection[:80]!r} is invalid: use 1-64 characters of A-Z a-z 0-9 . _ -",
            field=f"{field_prefix}.collection",
        )
    if len(spec.tags) > s.MAX_TAGS:
        raise errors.InvalidInputError(
            f"at most {s.MAX_TAGS} tags are allowed, got {len(spec.tags)}", field=f"{field_prefix}.tags"
        )
    for tag in spec.tags:
        if not tag or s.utf8_length(tag) > s.MAX_TAG_LENGTH:
            raise errors.InvalidInputError(
                f"each tag must be 1-{s.MAX_TAG_LENGTH} bytes in UTF-8; {tag[:40]!r} is {s.utf8_length(tag)} bytes",
                field=f"{field_prefix}.tags",
                reason="VALUE_TOO_LONG",
                metadata={"limit_bytes": str(s.MAX_TAG_LENGTH)},
            )
    if len(spec.metadata) > MAX_METADATA_ENTRIES:
        raise errors.InvalidInputError(
            f"at most {MAX_METADATA_ENTRIES} metadata entries are allowed", field=f"{field_prefix}.metadata"
        )
    for key, value in spec.metadata.items():
        if not key or len(value) > MAX_METADATA_VALUE_CHARS:
            raise errors.InvalidInputError(
                f"metadata keys must be non-empty and values at most {MAX_METADATA_VALUE_CHARS} characters",
                field=f"{field_prefix}.metadata",
            )
    _check_bytes(spec.source, s.VARCHAR_LIMITS[s.SOURCE], f"{field_prefix}.source")
    _check_bytes(spec.title, s.VARCHAR_LIMITS[s.TITLE], f"{field_prefix}.title")
    _check_bytes(spec.file_name, MAX_FILE_NAME_BYTES, f"{field_prefix}.file_name")
    if spec.chunk_size_tokens < 0 or spec.chunk_overlap_tokens < 0:
        raise errors.InvalidInputError("chunk sizes cannot be negative", field=f"{field_prefix}.chunking")
