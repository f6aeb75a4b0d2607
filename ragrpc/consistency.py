"""Read your writes: the consistency token an ingest response carries and a query request may pass
back, so that the query service answers only once it reflects that write (the model: Elasticsearch's
`refresh=wait_for`, Milvus' guarantee timestamps).

A token names the registry position the write reached:

  * `written_at`: when the ingest service acknowledged the write (its wall clock, seconds). Every
    write acknowledged before it is in the registry by then; a query service whose registry
    follower has applied a poll that began after `written_at` (plus the clock slack the follower
    allows for) reflects it, or something newer.
  * `versions`: for the documents the write changed (at most MAX_VERSIONS), the version it made
    visible (`document_version`: a digest of the visible generation and the fields copied onto the
    chunks) or "" for a document it removed or left invisible. A follower that shows exactly these
    versions reflects the write without waiting for a poll.

Tokens are opaque to callers: "v1." and base64url of a small JSON. `merge` keeps the later position
and the latest version of each document, for a client session that passes on its last writes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from ragrpc import errors
from ragrpc.models import DocumentRecord, DocumentState

MAX_VERSIONS = 256  # documents named in one token; a larger write is waited for by its position alone
_PREFIX = "v1."
_MAX_TOKEN_CHARS = 64_000


def chunk_fields(record: DocumentRecord) -> tuple:
    """The document-level fields copied onto every chunk (filters on them run inside the indexes)."""
    return (record.title, tuple(record.tags), tuple(sorted((str(k), str(v)) for k, v in record.metadata.items())))


def is_visible(record: DocumentRecord | None) -> bool:
    return (
        record is not None and record.state == DocumentState.ACTIVE and bool(record.generation) and not record.deleting
    )


def version_digest(generation: str, fields: tuple) -> str:
    """The version of a visible document: its generation and chunk fields, as a short digest."""
    body = json.dumps([generation, fields], separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def document_version(record: DocumentRecord | None) -> str:
    """What a query service shows of the document: its version, or "" when it shows nothing."""
    if record is None or not is_visible(record):
        return ""
    return version_digest(record.generation, chunk_fields(record))


@dataclass(frozen=True)
class ConsistencyToken:
    written_at: float
    versions: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of_write(cls, written_at: float, records: Iterable[tuple[str, DocumentRecord | None]]) -> ConsistencyToken:
        """The token of a write acknowledged at `written_at` that left these documents (key, stored
        record or None when removed)."""
        versions = tuple((key, document_version(record)) for key, record in records)
        return cls(written_at, versions if len(versions) <= MAX_VERSIONS else ())

    def merge(self, other: ConsistencyToken) -> ConsistencyToken:
        latest = dict(self.versions)
        if other.written_at >= self.written_at:
            latest.update(other.versions)
        else:
            latest = {**dict(other.versions), **latest}
        versions = tuple(latest.items())
        return ConsistencyToken(
            max(self.written_at, other.written_at), versions if len(versions) <= MAX_VERSIONS else ()
        )

    def encode(self) -> str:
        body = {"t": round(self.written_at, 6), "d": [list(pair) for pair in self.versions]}
        raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        return _PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str, *, field: str = "consistency_token") -> ConsistencyToken:
        """The token a caller passed back; InvalidInputError naming `field` when it is not one."""
        bad = errors.InvalidInputError(
            "consistency_token is not a token an ingest response carried; pass it back unchanged, or leave it empty",
            field=field,
            reason="BAD_CONSISTENCY_TOKEN",
        )
        if not text.startswith(_PREFIX) or len(text) > _MAX_TOKEN_CHARS:
            raise bad
        encoded = text[len(_PREFIX) :]
        try:
            body = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
            written_at = float(body["t"])
            versions = tuple((str(key), str(version)) for key, version in body.get("d", []))
        except (binascii.Error, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            raise bad from None
        if not written_at >= 0 or written_at == float("inf"):
            raise bad
        return cls(written_at, versions)
