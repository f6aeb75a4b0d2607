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

On milvus-lite, a large collection is scanned by key instead (`by_key`). milvus-lite answers each
page of an iterator by assembling, filtering and sorting the whole collection in Python, so an
iterator's scan grows with the square of the collection, while it reads rows by primary key without
a scan. A keyed scan asks once for every matching key, then reads the rows a page of keys at a time,
and keeps those that still match the filter (a row changed between the two reads is returned only as
it is now, and only when it still matches; a row added after the first read is not returned, as a
row added behind an iterator's position is not). It reads each row twice (its key, then the row:
milvus-lite materialises every field of a row even for its key alone), which the iterator's
collection-wide pages outweigh once the collection holds KEYED_SCAN_MIN_PAGES pages of rows (the
break-even point, from the per-row costs measured in docs/benchmarks.md). The caller says from how
many rows of the collection a scan is keyed; the count is the store's own (cheap).

milvus-lite answers at most 256 MB (its gRPC message limit). The keys are therefore asked for in
ranges of the key (`key > lo and key <= hi`) sized to stay under KEY_ANSWER_BYTES, a quarter of that:
how many ranges and where they split comes from the keys of the first page read (a sample of the
matching rows) and the collection's row count. A range whose answer is still over the limit (the
sample did not represent the keys) is split again at the sample's keys inside it, and read with an
iterator when none is left. Each range costs milvus-lite one pass over the collection, so ranges are
as few as the limit allows.

A page of rows can also be over the answer limit (a chunk's text and its BM25 text may each hold
64 KB, so a page of long chunks can pass 256 MB). A refused page is read again in halves: the first
query of a scan and an iterator's page with half the page size (the iterator starts again after
the last row it returned, `pk > last`, so nothing is read twice or skipped), a keyed page's
`get` as two calls of half its keys; down to one row, whose refusal is raised.

A page size above MAX_QUERY_WINDOW or below 1 is a configuration error; a scan that fails
part-way raises (it never ends early as if the collection were smaller).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ragrpc import errors
from ragrpc.store import schema as s
from ragrpc.store.failures import is_answer_too_large
from ragrpc.store.filters import Comparison, FilterExpr, and_
from ragrpc.store.milvus_connection import MilvusConnection, translate_exception
from ragrpc.store.prefetch import prefetched

MAX_QUERY_WINDOW = 16384  # Milvus: offset + limit of one query
DEFAULT_PAGE_SIZE = 8192
KEYED_SCAN_MIN_PAGES = 32  # milvus-lite: from this many pages of rows in the collection, scans go by key
KEY_ANSWER_BYTES = 64 * 2**20  # milvus-lite: keys asked for in one query, a quarter of its 256 MB answer limit
KEY_OVERHEAD_BYTES = 8  # a key's bytes in an answer beyond its UTF-8, with a margin
PRIMARY_KEYS = (s.CHUNK_ID, s.DOC_KEY, s.JOB_ID)

T = TypeVar("T")
logger = logging.getLogger(__name__)


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


def _call(conn: MilvusConnection, fn: Callable[[Any], T], operation: str) -> T:
    """conn.call(fn); a store failure raises the translated ragrpc error, named after `operation`."""
    try:
        return conn.call(fn)
    except Exception as exc:  # noqa: BLE001 - the store boundary
        raise translate_exception(exc, operation) from exc


def scan_rows(
    conn: MilvusConnection,
    collection: str,
    expr: FilterExpr,
    output_fields: list[str],
    *,
    page_size: int,
    operation: str,
    by_key: str = "",
    by_key_from_rows: int = 0,
    key_answer_bytes: int = KEY_ANSWER_BYTES,
) -> Iterator[list[dict[str, Any]]]:
    """Every row of `collection` matching `expr`, in pages of at most page_size rows, in
    primary-key order. Store failures raise the translated ragrpc error.

    One plain query of page_size rows comes first: when it returns fewer, it holds every match (the
    common case of a follower's poll, one call); otherwise the scan starts over as an iterator, or,
    with `by_key` (the collection's primary-key field, on milvus-lite) when the collection holds at
    least `by_key_from_rows` rows, reads every matching key and then the rows by key."""
    size = checked_page_size(page_size)
    rendered = expr.render()
    while True:
        try:
            probe = conn.call(
                functools.partial(_query, collection=collection, rendered=rendered, fields=output_fields, limit=size)
            )
            break
        except Exception as exc:  # noqa: BLE001 - the store boundary
            size = _halved(exc, size, operation, collection)
    if len(probe) < size:
        if probe:
            key = primary_key(probe[0])
            yield sorted(probe, key=lambda row: row[key]) if key else list(probe)
        return
    rows = _row_count(conn, collection, operation) if by_key else 0
    if by_key and rows >= by_key_from_rows:
        sample = [row[by_key] for row in probe]
        ranges = _KeyRanges(conn, collection, expr, by_key, operation, sample, rows, key_answer_bytes)
        pages = _read_by_key(conn, collection, expr, output_fields, size, operation, ranges)
    else:
        pages = _iterate(conn, collection, expr, output_fields, size, operation)
    # the next page is read while the caller works on this one (ragrpc.store.prefetch)
    yield from prefetched(pages, name=f"scan-{operation}")


def _row_count(conn: MilvusConnection, collection: str, operation: str) -> int:
    """The collection's rows as the store counts them (milvus-lite: keys only, no row is read)."""
    stats = _call(conn, lambda c: c.get_collection_stats(collection), operation)
    return int(stats.get("row_count", 0))


def primary_key(row: dict[str, Any]) -> str:
    """The primary-key field of a row of one of ragrpc's collections (pymilvus always returns it)."""
    return next((name for name in PRIMARY_KEYS if name in row), "")


def _query(client: Any, *, collection: str, rendered: str, fields: list[str], limit: int) -> Any:
    return client.query(collection, filter=rendered, output_fields=fields, limit=limit)


def _query_iterator(client: Any, *, collection: str, rendered: str, fields: list[str], batch_size: int) -> Any:
    return client.query_iterator(collection, batch_size=batch_size, filter=rendered, output_fields=fields)


def _halved(exc: Exception, size: int, operation: str, collection: str) -> int:
    """The page size to ask again with after `exc`: half of `size` when the store refused an answer
    over its message limit (a page of one row raises); any other failure raises, translated."""
    if not is_answer_too_large(exc) or size <= 1:
        raise translate_exception(exc, operation) from exc
    logger.warning(
        "%s: a page of %d rows of %s is over the store's answer limit; reading it in pages of %d",
        operation,
        size,
        collection,
        size // 2,
    )
    return size // 2


def _iterate(
    conn: MilvusConnection,
    collection: str,
    expr: FilterExpr,
    output_fields: list[str],
    page_size: int,
    operation: str,
    key_field: str = "",
) -> Iterator[list[dict[str, Any]]]:
    """A query_iterator's pages in primary-key order; a page over the store's answer limit starts
    the iterator again after the last row returned (`key_field`, or one of ragrpc's primary keys),
    with half the page size."""
    after: tuple[str, Any] | None = None  # (primary-key field, the last key returned)
    returned = False
    size = page_size
    while True:
        rendered = (and_(expr, Comparison(after[0], ">", after[1])) if after else expr).render()
        try:
            iterator = conn.call(
                functools.partial(
                    _query_iterator, collection=collection, rendered=rendered, fields=output_fields, batch_size=size
                )
            )
        except Exception as exc:  # noqa: BLE001 - the store boundary
            size = _halved(exc, size, operation, collection)
            continue
        try:
            while True:
                try:
                    rows = iterator.next()
                except Exception as exc:  # noqa: BLE001
                    if returned and after is None:  # rows without a known key: no place to start again
                        raise translate_exception(exc, operation) from exc
                    size = _halved(exc, size, operation, collection)
                    break
                if not rows:
                    return
                key = key_field or primary_key(rows[-1])
                after = (key, rows[-1][key]) if key else None
                returned = True
                yield rows
        finally:
            iterator.close()


def _read_by_key(
    conn: MilvusConnection,
    collection: str,
    expr: FilterExpr,
    output_fields: list[str],
    page_size: int,
    operation: str,
    ranges: _KeyRanges,
) -> Iterator[list[dict[str, Any]]]:
    """milvus-lite: every matching key (`_KeyRanges`), then the rows page_size keys at a time, each
    page re-checked against the filter (see the module's text)."""
    key_field = ranges.key_field
    keys = ranges.keys()
    if set(output_fields) <= {key_field}:  # the keys are the answer
        for start in range(0, len(keys), page_size):
            yield [{key_field: key} for key in keys[start : start + page_size]]
        return
    fields = sorted(set(output_fields) | expr.fields() | {key_field})
    for start in range(0, len(keys), page_size):
        wanted = keys[start : start + page_size]
        rows = _get_halving(conn, collection, wanted, fields, operation)
        page = sorted((row for row in rows if expr.matches(row)), key=lambda row: row[key_field])
        if page:
            yield page


def _get_halving(
    conn: MilvusConnection, collection: str, keys: list[str], fields: list[str], operation: str
) -> list[dict[str, Any]]:
    """The rows of `keys`; an answer over the store's limit is read again as two halves of the keys."""
    try:
        return conn.call(lambda c: c.get(collection, ids=keys, output_fields=fields))
    except Exception as exc:  # noqa: BLE001 - the store boundary
        half = _halved(exc, len(keys), operation, collection)
        return _get_halving(conn, collection, keys[:half], fields, operation) + _get_halving(
            conn, collection, keys[half:], fields, operation
        )


class _KeyRanges:
    """Every key of `collection` matching `expr`, sorted, read in ranges of the key whose answers stay
    under `answer_bytes` (milvus-lite answers at most 256 MB; see the module's text). `sample`: keys
    of matching rows (the scan's first page), for the ranges' bounds; `rows`: the collection's."""

    def __init__(
        self,
        conn: MilvusConnection,
        collection: str,
        expr: FilterExpr,
        key_field: str,
        operation: str,
        sample: list[str],
        rows: int,
        answer_bytes: int,
    ) -> None:
        self._conn = conn
        self._collection = collection
        self._expr = expr
        self.key_field = key_field
        self._operation = operation
        self._bounds = sorted(set(sample))
        key_bytes = max((len(key.encode()) for key in sample), default=0) + KEY_OVERHEAD_BYTES
        self.planned = min(max(1, -(-rows * key_bytes // max(1, answer_bytes))), len(self._bounds) + 1)

    def keys(self) -> list[str]:
        """Sorted; ranges are read in key order, so their keys concatenate sorted."""
        n = self.planned
        splits = [self._bounds[len(self._bounds) * i // n] for i in range(1, n)]
        found: list[str] = []
        for lo, hi in zip([None, *splits], [*splits, None], strict=True):
            found += self._range(lo, hi)
        return found

    def _range(self, lo: str | None, hi: str | None) -> list[str]:
        """The keys in (lo, hi] (None: unbounded) in key order."""
        expr = and_(
            self._expr,
            *([Comparison(self.key_field, ">", lo)] if lo is not None else []),
            *([Comparison(self.key_field, "<=", hi)] if hi is not None else []),
        )
        rendered = expr.render()
        try:
            found = self._conn.call(
                lambda c: c.query(self._collection, filter=rendered, output_fields=[self.key_field])
            )
        except Exception as exc:  # noqa: BLE001 - the store boundary
            if not is_answer_too_large(exc):
                raise translate_exception(exc, self._operation) from exc
            inside = [key for key in self._bounds if (lo is None or key > lo) and (hi is None or key <= hi)]
            if not inside or inside == [hi]:
                logger.warning(
                    "%s: the keys of %s in (%s, %s] are over the store's answer limit and no key of the "
                    "first page splits them; reading them with an iterator (slow on milvus-lite: a Milvus "
                    "server suits a collection of this size)",
                    self._operation,
                    self._collection,
                    lo,
                    hi,
                )
                return [
                    row[self.key_field]
                    for page in _iterate(
                        self._conn,
                        self._collection,
                        expr,
                        [self.key_field],
                        MAX_QUERY_WINDOW,
                        self._operation,
                        self.key_field,
                    )
                    for row in page
                ]
            mid = inside[(len(inside) - 1) // 2]
            return self._range(lo, mid) + self._range(mid, hi)
        return sorted(row[self.key_field] for row in found)
