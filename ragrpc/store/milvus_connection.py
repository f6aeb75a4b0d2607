"""Connecting to Milvus and translating its failures into ragrpc errors.

Works against a `milvus-lite server`, Milvus standalone/distributed and Zilliz alike: only
the URI changes. Connection loss becomes UnavailableError (retriable) so callers see
UNAVAILABLE with retry information, and the client reconnects by itself when the
server returns.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ragrpc import errors
from ragrpc.security import is_loopback
from ragrpc.store.column_writes import ColumnWrites
from ragrpc.store.failures import Failure, classify, is_unavailable
from ragrpc.store.group_commit import WriteGroups
from ragrpc.store.key_write_times import KeyWriteTimes
from ragrpc.store.read_groups import ReadGroups

logger = logging.getLogger(__name__)

T = TypeVar("T")

_EXISTENCE_CHECK_KEYS = 1024  # primary keys per existence read before repeating an insert

_RELEASED_HINTS = ("not loaded", "state 'released'", "call load()", "collection not loaded")


def _looks_released(exc: BaseException) -> bool:
    """Milvus' CollectionNotLoaded (code 101), or its wording on servers whose code differs: the
    consequence of a false match is only a reload of the kept collections and one repeat of a
    call the server refused (nothing was applied)."""
    return classify(exc) is Failure.RELEASED or any(hint in f"{exc}".lower() for hint in _RELEASED_HINTS)


_WRITES = frozenset({"insert", "upsert", "insert_chunks", "upsert_chunks", "put", "put_job", "write_lease"})
_COLLECTION_MISSING = 100  # Milvus' CollectionNotFound


def translate_exception(exc: Exception, operation: str) -> errors.RagrpcError:
    """The ragrpc error for a Milvus failure, by its class (ragrpc.store.failures). The caller's
    message names no internal object (collection, filter expression, client type): the full store
    error goes to the service log, with the operation, under this module's logger.

        UNAVAILABLE / RELEASED   UnavailableError    retriable: the store is down, slow or loading
        TOO_LARGE                InternalError       a message over the store's limit (the service pages)
        REFUSED, a write         InvalidInputError   the store refused the data it was given
        REFUSED, collection gone PreconditionError   the collection was dropped: restart the writer
        REFUSED, otherwise       InternalError       the store refused a call the service made
    """
    if isinstance(exc, errors.RagrpcError):
        return exc
    failure = classify(exc)
    logger.warning("vector store call %s failed (%s): %s", operation, failure.value, exc)
    if failure in (Failure.UNAVAILABLE, Failure.RELEASED):
        return errors.UnavailableError(
            "the vector store is unavailable or did not answer in time; retry shortly",
            retry_after_s=2.0,
            reason="STORE_UNAVAILABLE",
        )
    if failure is Failure.TOO_LARGE:
        return errors.InternalError(
            f"a message of the vector store's {operation} call was over the store's message limit; "
            "the service log has the details",
            reason="STORE_MESSAGE_TOO_LARGE",
        )
    code = getattr(exc, "code", None)
    if code == _COLLECTION_MISSING:
        return errors.PreconditionError(
            "the collection is missing from the vector store (was it dropped?); restart the ingest service to "
            "create it, then ingest the documents again",
            reason="STORE_COLLECTION_MISSING",
        )
    if operation in _WRITES:
        return errors.InvalidInputError(
            "the vector store refused the data of this request (a value over a field's limit or of the wrong "
            f"type; store error code {code}); the service log has the details",
            reason="STORE_REFUSED_DATA",
            metadata={"store_code": str(code)},
        )
    return errors.InternalError(
        f"the vector store refused the service's {operation} call (store error code {code}); "
        "the service log has the details",
        reason="STORE_REFUSED",
        metadata={"store_code": str(code)},
    )


def translate_errors(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorator: a Milvus failure becomes UnavailableError (connection) or InternalError."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except errors.RagrpcError:
            raise
        except Exception as exc:  # noqa: BLE001 - the store boundary
            raise translate_exception(exc, fn.__name__) from exc

    return wrapper


class MilvusConnection:
    """Owns one pymilvus MilvusClient; reconnects after a failure.

    Writes go through `write()`, which runs them one at a time: a milvus-lite server that
    receives concurrent inserts/upserts corrupts its write-ahead log, and after a restart
    most acknowledged rows are gone (measured: 8 concurrent writers, SIGTERM, 24,779 of
    25,627 acknowledged rows lost; the same load serialised lost none under SIGTERM or
    SIGKILL). Row writes that queue behind the writer are sent together (`write_rows`, group
    commit). Reads by primary key of one collection are grouped the same way, one call at a time
    (`get_rows`); other reads run concurrently.

    Under load a grouped write or read first lingers `group_linger_s` (see `GroupLinger`), so the
    writes that arrive within that time leave in its call instead of in calls of their own."""

    def __init__(
        self,
        uri: str,
        token: str = "",
        timeout_s: float = 30.0,
        write_group_rows: int = 512,
        group_linger_s: float = 0.0,
    ) -> None:
        self.uri = uri
        self._token = token
        self.timeout_s = timeout_s
        self._client: Any = None
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self.write_groups = WriteGroups(max_rows=write_group_rows)
        self.column_writes = ColumnWrites()  # inserts and upserts packed column by column
        self.read_groups = ReadGroups(max_keys=write_group_rows)
        self._linger = GroupLinger(group_linger_s)
        self._keep_loaded: set[str] = set()
        # collection -> consistency level of this client's reads where it differs from the collection's own
        # (the sole writer, once its recovery read the registry with Strong consistency, reads it with Session
        # consistency: its own writes, without Strong's wait; ingest_service.__main__ sets it)
        self.read_consistency: dict[str, str] = {}
        # the server timestamps of this client's writes by key, for the Session-read collections that
        # `follow_key_writes` names: a read by key waits for its keys' writes only (key_write_times)
        self.key_write_times = KeyWriteTimes()
        self.unflushed_since: float | None = None  # monotonic time of the first write since the last flush
        self.last_write_at = 0.0

    @property
    def group_linger_s(self) -> float:
        return self._linger.linger_s

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = ConsistentReads(self._connect(), self.read_consistency)
            return self._client

    def _connect(self) -> Any:
        from pymilvus import MilvusClient

        try:
            return MilvusClient(uri=self.uri, token=self._token, timeout=self.timeout_s, **client_options(self.uri))
        except Exception as exc:  # noqa: BLE001
            raise errors.UnavailableError(
                f"cannot connect to the vector store at {self.uri}: {exc}",
                retry_after_s=2.0,
                reason="STORE_UNAVAILABLE",
            ) from exc

    def reset(self) -> None:
        """Drops the client so the next call reconnects."""
        with self._lock:
            client, self._client = self._client, None
        self.column_writes.forget()
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001
                logger.debug("closing a broken Milvus client failed", exc_info=True)

    def keep_loaded(self, *names: str) -> None:
        """Collections to load again when the server reports them released (it restarted)."""
        with self._lock:
            self._keep_loaded.update(names)

    def call(self, fn: Callable[[Any], T], *, repeat: Callable[[], T] | None = None) -> T:
        """Runs fn(client); when the server is unavailable, reconnects and runs `repeat()` once
        (default: fn again, for idempotent calls: reads, upserts, deletes). A call that may have
        been applied and must not be applied twice passes its own `repeat`."""
        try:
            return self._call_loaded(fn)
        except errors.RagrpcError:
            raise
        except Exception as exc:  # noqa: BLE001
            if not is_unavailable(exc):
                raise
            logger.warning("Milvus call failed (%s); reconnecting", exc)
            self.reset()
            time.sleep(0.2)
            return repeat() if repeat is not None else self._call_loaded(fn)

    def _call_loaded(self, fn: Callable[[Any], T]) -> T:
        """fn(client); when a collection turns out released (a restarted server comes back with
        every collection released), loads the kept collections and retries once."""
        client = self.client()
        try:
            return fn(client)
        except errors.RagrpcError:
            raise
        except Exception as exc:  # noqa: BLE001
            with self._lock:
                names = sorted(self._keep_loaded)
            if not names or not _looks_released(exc):
                raise
            logger.warning("Milvus reports a collection released (%s); loading %s again", exc, ", ".join(names))
            for name in names:
                if client.has_collection(name):
                    client.load_collection(name)
            return fn(client)

    def write(self, fn: Callable[[Any], T], *, collection: str = "", keys: Sequence[Any] | None = None) -> T:
        """Runs a mutating call (insert, upsert, delete, create) alone: one writer at a time. A
        change of rows names its `collection` and the primary `keys` it changes (None: any key, a
        delete by filter), for the reads by key that wait for them (key_write_times)."""
        with self._write_lock:
            if not collection:
                return self._write_locked(fn)
            return self._recorded(collection, keys, lambda: self._write_locked(fn))

    def _recorded(self, collection: str, keys: Sequence[Any] | None, write: Callable[[], T]) -> T:
        """`write()` (under the write lock), its keys' timestamp recorded, or their doubt."""
        times = self.key_write_times
        if not times.follows(collection):
            return write()
        before = self._last_write_ts(collection)
        try:
            result = write()
        except BaseException:
            times.failed(collection, keys)
            raise
        times.answered(collection, keys, before, self._last_write_ts(collection))
        return result

    def follow_key_writes(self, *collections: str) -> None:
        """Reads by key of these collections (read with Session consistency) wait for this client's
        writes of their keys only, from now on (call it where the Session level is set)."""
        with self._write_lock:  # the newest write to any of them (the writer lease's, at least): timestamps are global
            floor = max((self._last_write_ts(name) for name in collections), default=0)
            for name in collections:
                self.key_write_times.follow(name, floor)

    def _last_write_ts(self, collection: str) -> int:
        """The server timestamp of this client's last write to `collection`, as pymilvus records it
        for Session reads (0 where it cannot be read)."""
        try:
            from pymilvus.client import ts_utils

            milvus = self.client()._client
            address = milvus._get_connection().server_address  # noqa: SLF001 - pymilvus' own record
            return int(ts_utils.get_collection_ts(collection, address, milvus._config.db_name) or 0)  # noqa: SLF001
        except Exception:  # noqa: BLE001 - another pymilvus: plain Session reads
            logger.debug("the last write timestamp of %s is not readable", collection, exc_info=True)
            return 0

    def _write_locked(self, fn: Callable[[Any], T]) -> T:
        now = time.monotonic()
        self.last_write_at = now
        if self.unflushed_since is None:
            self.unflushed_since = now
        return self.call(fn)

    def write_rows(self, operation: str, collection: str, rows: list[dict[str, Any]], key_field: str) -> None:
        """`insert` or `upsert` of rows, group-committed (see group_commit): returns once these rows
        are written, possibly in one call with other callers' rows for the same collection."""
        if operation not in ("insert", "upsert"):
            raise ValueError(f"write_rows does {operation!r}: only insert and upsert")
        if not rows:
            return
        group = (operation, collection)

        def write(merged: list[dict[str, Any]]) -> object:
            keys = [row[key_field] for row in merged]
            if operation == "upsert":  # idempotent: repeated as it is
                return self._recorded(
                    collection,
                    keys,
                    lambda: self._write_locked(lambda c: self.column_writes.upsert(c, collection, merged)),
                )
            return self._recorded(collection, keys, lambda: self._insert_once(collection, merged, key_field))

        self.write_groups.write(
            group,
            rows,
            key_field,
            write,
            retry_alone=lambda exc: not is_unavailable(exc),
            writer_lock=self._write_lock,
            linger=lambda: self._linger.wait(group),
        )

    def _insert_once(self, collection: str, rows: list[dict[str, Any]], key_field: str) -> object:
        """An insert that is never applied twice: when the server was unavailable (the insert may
        have landed, its reply lost), the repeat first reads which of the rows exist and inserts
        only the others. (Milvus does not refuse a duplicate primary key: it would keep both.)"""

        def missing_rows() -> object:
            keys = [row[key_field] for row in rows]
            found: set[Any] = set()
            for start in range(0, len(keys), _EXISTENCE_CHECK_KEYS):
                present = self._call_loaded(
                    functools.partial(_get_keys, collection, keys[start : start + _EXISTENCE_CHECK_KEYS], key_field)
                )
                found.update(row[key_field] for row in present)
            left = [row for row in rows if row[key_field] not in found]
            if found:
                logger.warning(
                    "an insert into %s had landed before its reply was lost: %d of %d rows written again",
                    collection,
                    len(left),
                    len(rows),
                )
            return self._call_loaded(lambda c: self.column_writes.insert(c, collection, left)) if left else None

        now = time.monotonic()
        self.last_write_at = now
        if self.unflushed_since is None:
            self.unflushed_since = now
        return self.call(lambda c: self.column_writes.insert(c, collection, rows), repeat=missing_rows)

    def get_rows(
        self, collection: str, keys: list[Any], output_fields: list[str], key_field: str
    ) -> list[dict[str, Any]]:
        """The rows with these primary keys (those that exist); reads of the same collection and fields
        that wait behind a running one are fetched together (see read_groups)."""
        return self.read_groups.get(
            collection,
            keys,
            lambda wanted: self.call(
                lambda c: c.get(
                    collection, ids=wanted, output_fields=output_fields, **self._key_read_options(collection, wanted)
                )
            ),
            key_of=lambda row: row[key_field],
            retry_alone=lambda exc: not is_unavailable(exc),
            linger=lambda: self._linger.wait(("get", collection)),
            fields=tuple(output_fields),
        )

    def _key_read_options(self, collection: str, keys: list[Any]) -> dict[str, Any]:
        """A Session read by key of a followed collection names its keys' last write (key_write_times)."""
        if self.read_consistency.get(collection) != "Session":
            return {}
        return self.key_write_times.read_options(collection, keys)

    def flush(self, names: Sequence[str]) -> None:
        """Seals what was written to these collections (between writes, under the writer lock)."""
        with self._write_lock:
            for name in names:
                self.call(functools.partial(_flush, name=name))
            self.unflushed_since = None

    def wait_until_ready(self, timeout_s: float = 60.0) -> None:
        """Blocks until the server answers (used at service start)."""
        deadline = time.monotonic() + timeout_s
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                self.call(lambda c: c.list_collections())
                return
            except Exception as exc:  # noqa: BLE001
                last = exc
                self.reset()
                time.sleep(0.5)
        raise errors.UnavailableError(
            f"the vector store at {self.uri} did not answer within {timeout_s:.0f}s: {last}",
            reason="STORE_UNAVAILABLE",
        )


class GroupLinger:
    """Holds a grouped call back for a moment while calls of its kind keep coming.

    Group commit only merges calls that queue while another one runs. Ingestion's calls come in
    bursts (the documents of one model call finish together), but they reach the store a fraction
    of a millisecond apart, so the first of a burst used to leave alone and the rest queued behind
    it. When another call of the same kind arrived within the last `busy_window_s`, a call now
    waits `linger_s` first (in the store thread, off the event loop), and the next call to take
    the lock carries everything that queued meanwhile. An isolated call (a single upload) does not
    wait: its kind has been quiet."""

    def __init__(self, linger_s: float, busy_window_s: float = 0.1) -> None:
        if linger_s < 0:
            raise ValueError(f"the group linger must be >= 0 seconds, got {linger_s}")
        self.linger_s = linger_s
        self._busy_window_s = busy_window_s
        self._last: dict[Any, float] = {}
        self._lock = threading.Lock()
        self.lingered = 0  # calls that waited (for tests and benchmarks)

    def wait(self, kind: Any) -> None:
        if self.linger_s <= 0:
            return
        now = time.monotonic()
        with self._lock:
            previous = self._last.get(kind)
            self._last[kind] = now
            busy = previous is not None and now - previous < self._busy_window_s
            self.lingered += busy
        if busy:
            time.sleep(self.linger_s)


class ConsistentReads:
    """A pymilvus client whose reads (get, query, query_iterator) of the given collections use the given
    consistency level unless the call names one. Milvus' Strong reads wait for the server's time tick (about
    200 ms a read on Milvus 2.3); a Session read waits only for this process's own last write, which is
    all the single writer needs of the registry it alone writes (reads of rows another process writes,
    such as the writer lease, name Strong themselves)."""

    def __init__(self, client: Any, levels: dict[str, str]) -> None:
        self._client = client
        self._levels = levels  # the connection's own dict: a level set later applies from then on

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _with_level(self, collection: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        if collection in self._levels:
            kwargs.setdefault("consistency_level", self._levels[collection])
        return kwargs

    def get(self, collection_name: str, *args: Any, **kwargs: Any) -> Any:
        return self._client.get(collection_name, *args, **self._with_level(collection_name, kwargs))

    def query(self, collection_name: str, *args: Any, **kwargs: Any) -> Any:
        return self._client.query(collection_name, *args, **self._with_level(collection_name, kwargs))

    def query_iterator(self, collection_name: str, *args: Any, **kwargs: Any) -> Any:
        return self._client.query_iterator(collection_name, *args, **self._with_level(collection_name, kwargs))


def client_options(uri: str) -> dict[str, Any]:
    """pymilvus options for `uri`. On a loopback server (milvus-lite next to the services) the
    client's keepalive pings are off: pymilvus pings every 10 s, also during one long call (a
    BM25 search or a load over 100k rows), and milvus-lite's gRPC server answers that with
    GOAWAY too_many_pings, which drops the connection under load. Over a network the pings
    stay: they detect a dead peer, and Milvus' own server allows them."""
    if is_loopback(urlsplit(uri).hostname or ""):
        return {"grpc_options": {"grpc.keepalive_time_ms": _KEEPALIVE_OFF_MS}}
    return {}


_KEEPALIVE_OFF_MS = 2**31 - 1  # gRPC's "never"


def _flush(client: Any, name: str) -> None:
    client.flush(name)


def _get_keys(collection: str, keys: list[Any], key_field: str, client: Any) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = client.get(collection, ids=keys, output_fields=[key_field])
    return result
