"""Documents as resources: get, list (paged), update metadata, delete."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from ingest_service.lifecycle import DocumentLifecycle
from ingest_service.requests import DOCUMENT_ID_PATTERN, DocumentSpecInput, validate_spec
from ragrpc import errors
from ragrpc.models import DocumentRecord, DocumentState
from ragrpc.store import schema as s
from ragrpc.store.base import DocumentRegistry
from ragrpc.store.filters import FilterBuilder

MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 50
UPDATABLE_FIELDS = ("title", "tags", "metadata")

_REGISTRY_FILTER = FilterBuilder(s.REGISTRY_FILTERABLE_FIELDS)


@dataclass
class DocumentPage:
    documents: list[DocumentRecord]
    next_page_token: str


def _check_id(document_id: str) -> None:
    if not document_id:
        raise errors.InvalidInputError("document_id is required", field="document_id")
    if not DOCUMENT_ID_PATTERN.match(document_id):
        raise errors.InvalidInputError(f"document_id {document_id[:140]!r} is invalid", field="document_id")


def _encode_token(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode()


def _decode_token(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise errors.InvalidInputError("page_token is not a token this service issued", field="page_token") from None


class DocumentService:
    """Documents as resources. Reads (`get`, `list_page`) are synchronous (callers run them off the
    event loop); `update` and `delete` are transitions of the document's lifecycle, made by
    `DocumentLifecycle` under the document's lock."""

    def __init__(self, registry: DocumentRegistry, lifecycle: DocumentLifecycle) -> None:
        self._registry = registry
        self._lifecycle = lifecycle

    def get(self, tenant: str, document_id: str) -> DocumentRecord:
        _check_id(document_id)
        record = self._registry.get(tenant, document_id)
        if record is None or record.deleting:
            raise errors.NotFoundError(
                f"document {document_id!r} does not exist", metadata={"document_id": document_id}
            )
        return record

    def list_page(
        self,
        tenant: str,
        *,
        page_size: int = 0,
        page_token: str = "",
        state: DocumentState | None = None,
        source: str = "",
        collection: str = "",
    ) -> DocumentPage:
        if page_size < 0 or page_size > MAX_PAGE_SIZE:
            raise errors.InvalidInputError(f"page_size must be between 0 and {MAX_PAGE_SIZE}", field="page_size")
        size = page_size or DEFAULT_PAGE_SIZE
        conditions = [_REGISTRY_FILTER.eq(s.TENANT, tenant)]
        if state is not None:
            conditions.append(_REGISTRY_FILTER.eq(s.STATE, int(state)))
        if source:
            conditions.append(_REGISTRY_FILTER.eq(s.SOURCE, source))
        if collection:
            conditions.append(_REGISTRY_FILTER.eq(s.COLLECTION, collection))
        after = _decode_token(page_token) if page_token else ""
        expr = _REGISTRY_FILTER.and_(*conditions)
        # One more key than the page tells whether another page follows; documents being deleted are
        # skipped, so a page may hold fewer than `size` documents and still have a next page.
        keys = self._registry.list_keys(expr, after=after, limit=size + 1)
        page_keys = keys[:size]
        found = self._registry.get_many(page_keys)
        documents = [found[k] for k in page_keys if k in found and not found[k].deleting]
        next_token = _encode_token(page_keys[-1]) if len(keys) > size else ""
        return DocumentPage(documents, next_token)

    async def update(
        self,
        tenant: str,
        document_id: str,
        *,
        fields: list[str],
        etag: str = "",
        title: str = "",
        tags: list[str] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> DocumentRecord:
        """Changes title/tags/metadata in the registry and on the stored chunks (their vectors are
        kept), so filters see the new values. No re-extraction, no re-embedding. A non-empty
        `etag` must be the document's current one (AIP-154)."""
        unknown = [name for name in fields if name not in UPDATABLE_FIELDS]
        if not fields or unknown:
            raise errors.InvalidInputError(
                f"update_mask must name some of {', '.join(UPDATABLE_FIELDS)}; got {', '.join(fields) or 'nothing'}",
                field="update_mask",
            )
        _check_id(document_id)
        validate_spec(
            DocumentSpecInput(
                title=title if "title" in fields else "", tags=list(tags or []), metadata=dict(metadata or {})
            ),
            field_prefix="document",
        )
        return await self._lifecycle.update(
            tenant, document_id, fields=fields, etag=etag, title=title, tags=tags, metadata=metadata
        )

    async def delete(self, tenant: str, document_id: str) -> int:
        """Deletes the document and its chunks; an ingestion of it in flight is cancelled first."""
        _check_id(document_id)
        return await self._lifecycle.delete(tenant, document_id)
