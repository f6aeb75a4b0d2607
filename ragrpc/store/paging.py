"""Reading through a Milvus collection page by page, so that no read is silently capped.

Milvus answers one `query` with at most MAX_QUERY_WINDOW rows (offset + limit; Milvus 2.x
refuses more), and a `query` without a limit returns everything on milvus-lite but fails on a
Milvus server. Every read that can grow with the collection therefore goes through
`scan_rows`, a pymilvus `query_iterator`: pages of `page_size` rows in primary-key order,
each one a keyset query (`pk > last`), until the filter has no more rows. Because pages come in
key order, the first rows of a scan with `pk > after` are also the next page of a listing
(keyset pagination, as `ListDocuments` does).

A scan of more than one page reads the next page in a thread while its caller works on the current
one (`ragrpc.store.prefetch`), so the store's time and the caller's overlap.

A page size above MAX_QUERY_WINDOW or below 1 is a configuration error; a scan that fails
part-way raises (it never ends early as if the collection were smaller).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ragrpc import errors
from ragrpc.store import schema as s
from ragrpc.store.milvus_connection import MilvusConnection, translate_exception
from ragrpc.store.prefetch import prefetched

MAX_QUERY_WINDOW = 16384  # Milvus: offset + limit of one query
DEFAULT_PAGE_SIZE = 8192
PRIMARY_KEYS = (s.CHUNK_ID, s.DOC_KEY, s.JOB_ID)


def checked_page_size(page_size: int) -> int:
    if not 1 <= page_size <= MAX_QUERY_WINDOW:
        raise ValueError(f"RAGRPC_STORE_PAGE_SIZE must be between 1 and {MAX_QUERY_WINDOW}, got {page_size}")
    return page_size


def checked_limit(limit: int, operation: str) -> int:
    """A limit for one query call; asking for more is a fault of the caller (it must scan)."""
    if not 1 <= limit <= MAX_QUERY_WINDOW:
        raise errors.InternalError(
            f"{operation} reads at most {MAX_QUERY_WINDOW} rows in one call (asked for {limit}); it must scan"
        )
    return limit


def scan_rows(
    conn: MilvusConnection,
    collection: str,
    expr: str,
    output_fields: list[str],
    *,
    page_size: int,
    operation: str,
) -> Iterator[list[dict[str, Any]]]:
    """Every row of `collection` matching `expr`, in pages of at most page_size rows, in
    primary-key order. Store failures raise the translated ragrpc error.

    One plain query of page_size rows comes first: when it returns fewer, it holds every match (the
    common case of a follower's poll, one call); otherwise the scan starts over as an iterator."""
    size = checked_page_size(page_size)
    try:
        probe = conn.call(lambda c: c.query(collection, filter=expr, output_fields=output_fields, limit=size))
    except Exception as exc:  # noqa: BLE001 - the store boundary
        raise translate_exception(exc, operation) from exc
    if len(probe) < size:
        if probe:
            key = primary_key(probe[0])
            yield sorted(probe, key=lambda row: row[key]) if key else list(probe)
        return
    # the next page is read while the caller works on this one (ragrpc.store.prefetch)
    yield from prefetched(_iterate(conn, collection, expr, output_fields, size, operation), name=f"scan-{operation}")


def primary_key(row: dict[str, Any]) -> str:
    """The primary-key field of a row of one of ragrpc's collections (pymilvus always returns it)."""
    return next((name for name in PRIMARY_KEYS if name in row), "")


def _iterate(
    conn: MilvusConnection, collection: str, expr: str, output_fields: list[str], page_size: int, operation: str
) -> Iterator[list[dict[str, Any]]]:
    try:
        iterator = conn.call(
            lambda c: c.query_iterator(collection, batch_size=page_size, filter=expr, output_fields=output_fields)
        )
    except Exception as exc:  # noqa: BLE001 - the store boundary
        raise translate_exception(exc, operation) from exc
    try:
        while True:
            try:
                rows = iterator.next()
            except Exception as exc:  # noqa: BLE001
                raise translate_exception(exc, operation) from exc
            if not rows:
                return
            yield rows
    finally:
        iterator.close()
