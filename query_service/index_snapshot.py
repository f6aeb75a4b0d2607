"""Snapshots of the query service's in-memory indexes on local disk, so a replica starts from its
last snapshot and the registry changes since it instead of scanning the whole collection.

A snapshot holds the BM25 index (every tenant scope: postings, forward index, vocabulary, chunk
ids, documents, attribute columns), the held dense vectors where the service keeps them, and the
caller's follower state: an opaque JSON-serialisable object, arrays of per-document state (the
follower's view and what the indexes hold, one packed entry a document: query_service.packed_table)
and the int registry watermark the indexes reflect. Layout of `RAGRPC_INDEX_SNAPSHOT_DIR`:

    CURRENT                          the name of the snapshot to load (replaced atomically)
    snapshot-<utc>-<pid>-<random>/   one snapshot, never changed once written
        arrays.bin                   every numpy array (the indexes', the state's), each at a 4 KiB-aligned offset
        follower.json                {"state": ..., "watermark": ...}
        manifest.json                {"body": {...}, "sha256": <of the body>}

The manifest's body: the format version, the caller's identity (model id, dimension, schema
versions, analyzer, BM25 parameters, collection names: whatever must match for the indexes to be
valid), the creation time, the watermark, each array's dtype/shape/offset, the indexes' own meta,
and per file its size, full sha256 and a sampled sha256 (below).

Taking a snapshot has two parts: `capture_indexes` compacts each index and takes its arrays (what
must happen between two batches of registry changes, so that the watermark is the one the arrays
reflect), and `save_snapshot` writes them (which may run in another thread while the indexes change:
the captured arrays are never changed in place). `save_snapshot(bm25=..., dense=...)` does both.

Writing is atomic: everything goes to a temporary directory, is fsynced, renamed into place, and
only then does CURRENT (written to a temporary file, fsynced, renamed) name it. A crash at any point
leaves the previous snapshot current. The newest `keep` snapshots stay; a replica that still maps
a deleted one keeps its pages (the files go when the last mapping does).

Loading memory-maps arrays.bin once (read-only, shared: replicas on one host share its page cache
pages) and makes every array a view of the mapping, so nothing is read until a search or an update
touches it, and the restored indexes take further updates without copying the mapped arrays (new
documents go to the indexes' recent parts, removals to their liveness flags). A snapshot that is
missing, corrupt, of another format or identity, older than the caller's maximum age, or holding
other indexes than the caller keeps is not used: `load_snapshot` logs why and returns None, and the
caller loads in full.

Verification at load (`verify`). "full" (the default) hashes every file and compares the manifest's
sha256s: reading and hashing a snapshot of a million chunks' BM25 index takes about a second with a
cold page cache on this project's machine (docs/benchmarks.md, index snapshot section), small beside
a start budget of 30 s, and a flipped bit in the postings would otherwise give wrong scores silently;
the read also leaves the pages in the page cache for the first queries. Where the files are too
large for that (many GB on a slow disk), "sampled" checks the manifest's own
checksum, the exact size of each file, the full checksum of the small follower file and the sha256 of
64 blocks of 64 KiB spread evenly over the arrays file (its first and last included): that catches
truncation, a file from another snapshot, a torn or zeroed block where the samples fall and any
damaged header, not a bit flipped between samples. Both modes then check the structure of every
array (offsets that span their data, monotone CSR pointers: each index's `restore`), and
`verify_snapshot` does the full check of a snapshot directory on its own (e.g. in the background).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import mmap
import os
import secrets
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from query_service.dense_index import InProcessDenseIndex, WithoutPartitions
from query_service.index_sync import APPLIED_CODEC
from query_service.packed_table import PackedTable
from query_service.ragged_arrays import nest_arrays, sub_arrays
from query_service.registry_follower import VIEW_CODEC
from query_service.sparse_index import InProcessBm25Index
from ragrpc.analyzer import Analyzer

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 2: the follower's and the sync's per-document state as arrays
CURRENT = "CURRENT"
ARRAYS = "arrays.bin"
FOLLOWER = "follower.json"
MANIFEST = "manifest.json"
_STATE = "state"
_PREFIX = "snapshot-"
_TEMPORARY = ".tmp-"
_ALIGNMENT = 4096
_SAMPLES = 64
_SAMPLE_BYTES = 1 << 16
_WRITE_PIECE = 1 << 24
_READ_PIECE = 1 << 20
_STALE_TEMPORARY_S = 3600.0
_FUTURE_TOLERANCE_S = 300.0


@dataclass(frozen=True)
class LoadedSnapshot:
    """What a snapshot restored: the indexes (None where it holds none), the caller's follower state
    and the registry watermark the indexes reflect."""

    path: Path
    bm25: InProcessBm25Index | None
    dense: InProcessDenseIndex | None
    follower_state: Any
    watermark: int
    created_at: float
    state_arrays: dict[str, np.ndarray]
    tables: dict[str, Any] = dataclasses.field(default_factory=dict)  # unpacked state (IndexSnapshots.load)


class _Unusable(Exception):
    """A snapshot that must not be used; the message says why (it is logged)."""


# --- writing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexCapture:
    """The indexes' arrays and meta at one moment (`capture_indexes`), ready to be written. The arrays
    are never changed afterwards (a later compaction makes new ones), so the indexes may go on
    changing while a capture is written."""

    indexes: dict[str, Any]
    arrays: dict[str, np.ndarray]


def capture_indexes(bm25: InProcessBm25Index | None = None, dense: InProcessDenseIndex | None = None) -> IndexCapture:
    """Each index compacted (under its own writer lock; readers go on) and its arrays taken: the part
    of a snapshot that must happen while no registry change is being applied to the indexes."""
    indexes: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for name, index in (("bm25", bm25), ("dense", dense)):
        if index is not None:
            meta, index_arrays = index.export()
            indexes[name] = meta
            arrays.update(nest_arrays(name, index_arrays))
    return IndexCapture(indexes, arrays)


def save_snapshot(
    directory: str | Path,
    *,
    identity: Mapping[str, Any],
    follower_state: Any,
    watermark: int,
    state_arrays: Mapping[str, np.ndarray] | None = None,
    bm25: InProcessBm25Index | None = None,
    dense: InProcessDenseIndex | None = None,
    capture: IndexCapture | None = None,
    keep: int = 2,
    clock: Callable[[], float] = time.time,
) -> Path:
    """Write a snapshot of the indexes with the follower state they reflect, make it current and drop
    all but the newest `keep` snapshots; its directory.

    The indexes come as `capture` (taken earlier with `capture_indexes`, then this call may run in
    another thread while the indexes change) or as `bm25` / `dense` (captured here). Either way the
    capture must be taken while no registry change is applied to the indexes, and `follower_state` /
    `watermark` must be what the follower had then: capture from the thread that applies the
    follower's changes, between batches. `state_arrays`: the follower state's arrays (restored as
    `LoadedSnapshot.state_arrays`)."""
    if keep < 1:
        raise ValueError("keep at least the snapshot just written")
    if capture is not None and (bm25 is not None or dense is not None):
        raise ValueError("give the indexes or a capture of them, not both")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    content = capture if capture is not None else capture_indexes(bm25, dense)
    indexes, arrays = content.indexes, {**content.arrays, **nest_arrays(_STATE, state_arrays or {})}
    created_at = clock()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(created_at)) + f"{int(created_at * 1e6) % 10**6:06d}"
    name = f"{_PREFIX}{stamp}-{os.getpid()}-{secrets.token_hex(4)}"  # names sort by creation time
    temporary = root / f"{_TEMPORARY}{name}"
    temporary.mkdir()
    try:
        layout, arrays_file = _write_arrays(temporary / ARRAYS, arrays)
        follower = json.dumps({"state": follower_state, "watermark": int(watermark)}).encode()
        body = {
            "format": FORMAT_VERSION,
            "identity": json.loads(_canonical(identity)),
            "created_at": created_at,
            "watermark": int(watermark),
            "indexes": indexes,
            "arrays": layout,
            "files": {ARRAYS: arrays_file, FOLLOWER: _write_file(temporary / FOLLOWER, follower)},
        }
        manifest = {"body": body, "sha256": hashlib.sha256(_canonical(body).encode()).hexdigest()}
        _write_file(temporary / MANIFEST, json.dumps(manifest).encode())
        _fsync_directory(temporary)
        final = root / name
        os.rename(temporary, final)
        _fsync_directory(root)
        _write_current(root, name)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    _prune(root, keep, name, clock())
    logger.info(
        "index snapshot %s written: %d arrays, %.1f MiB, watermark %d, in %.1fs",
        final,
        len(layout),
        arrays_file["size"] / 2**20,
        watermark,
        time.monotonic() - started,
    )
    return final


def _write_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each array at an aligned offset of one file; (layout, the file's size and checksums)."""
    layout: dict[str, Any] = {}
    digest = hashlib.sha256()
    offset = 0
    with open(path, "wb") as handle:
        for name in sorted(arrays):
            array = np.ascontiguousarray(arrays[name])
            if array.dtype.hasobject:
                raise TypeError(f"array {name!r} holds Python objects; a snapshot holds numbers only")
            padding = -offset % _ALIGNMENT
            if padding:
                handle.write(bytes(padding))
                digest.update(bytes(padding))
                offset += padding
            layout[name] = {"dtype": array.dtype.str, "shape": list(array.shape), "offset": offset}
            data = memoryview(array.reshape(-1).view(np.uint8).data) if array.size else memoryview(b"")  # type: ignore[arg-type]
            for start in range(0, len(data), _WRITE_PIECE):
                piece = data[start : start + _WRITE_PIECE]
                handle.write(piece)
                digest.update(piece)
            offset += len(data)
        handle.flush()
        os.fsync(handle.fileno())
    return layout, {"size": offset, "sha256": digest.hexdigest(), "sampled_sha256": _sampled_digest(path, offset)}


def _write_file(path: Path, data: bytes) -> dict[str, Any]:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _write_current(root: Path, name: str) -> None:
    temporary = root / f"{_TEMPORARY}{CURRENT}-{os.getpid()}-{secrets.token_hex(4)}"
    _write_file(temporary, (name + "\n").encode())
    os.replace(temporary, root / CURRENT)
    _fsync_directory(root)


def _fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _prune(root: Path, keep: int, current: str, now: float) -> None:
    """Drop all but the newest `keep` snapshots (never `current`) and temporary directories of
    writers that died an hour ago or more."""
    snapshots = sorted(p.name for p in root.iterdir() if p.name.startswith(_PREFIX) and p.is_dir())
    for name in snapshots[: max(0, len(snapshots) - keep)]:
        if name != current:
            shutil.rmtree(root / name, ignore_errors=True)
    for path in root.iterdir():
        if path.name.startswith(_TEMPORARY) and now - path.stat().st_mtime > _STALE_TEMPORARY_S:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


# --- reading -----------------------------------------------------------------------------


def load_snapshot(
    directory: str | Path,
    *,
    identity: Mapping[str, Any],
    max_age_s: float,
    analyzer: Analyzer | None = None,
    dense: bool = False,
    verify: str = "full",
    bm25_options: Mapping[str, Any] | None = None,
    dense_options: Mapping[str, Any] | None = None,
    clock: Callable[[], float] = time.time,
) -> LoadedSnapshot | None:
    """The current snapshot's indexes and follower state, or None (the reason logged) when there is
    none or it must not be used. `analyzer`: the BM25 index's (None: the caller keeps no BM25 index);
    `dense`: whether the caller holds dense vectors; a snapshot must hold exactly the indexes the
    caller keeps. `verify`: "full" (default) or "sampled" (see the module docstring)."""
    if verify not in ("sampled", "full"):
        raise ValueError(f"verify is 'sampled' or 'full', not {verify!r}")
    started = time.monotonic()
    root = Path(directory)
    path = root
    try:
        path = _current(root)
        body = _manifest(path)
        _check_body(body, identity, max_age_s, clock(), analyzer is not None, dense)
        arrays = _mapped_arrays(path, body, verify)
        follower = _follower(path, body)
        indexes = body["indexes"]
        bm25 = None
        if analyzer is not None:
            bm25 = InProcessBm25Index.restore(
                analyzer, indexes["bm25"], sub_arrays(arrays, "bm25"), **dict(bm25_options or {})
            )
        held = None
        if dense:
            held = InProcessDenseIndex.restore(
                indexes["dense"], sub_arrays(arrays, "dense"), **dict(dense_options or {})
            )
    except (_Unusable, WithoutPartitions) as unusable:
        logger.warning("index snapshot %s not used: %s; the indexes load in full", path, unusable)
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        logger.warning(
            "index snapshot %s not used: corrupt (%s: %s); the indexes load in full", path, type(error).__name__, error
        )
        return None
    logger.info(
        "index snapshot %s loaded (watermark %d, %.0fs old, verify %s) in %.2fs",
        path,
        body["watermark"],
        clock() - body["created_at"],
        verify,
        time.monotonic() - started,
    )
    return LoadedSnapshot(
        path,
        bm25,
        held,
        follower["state"],
        int(follower["watermark"]),
        float(body["created_at"]),
        sub_arrays(arrays, _STATE),
    )


def verify_snapshot(path: str | Path) -> str | None:
    """Full check of one snapshot directory (every byte hashed): None when intact, else what is wrong.
    For a background check after a start from the snapshot's sampled verification."""
    try:
        body = _manifest(Path(path))
        for name, expected in body["files"].items():
            _check_size(Path(path) / name, expected)
            if _file_sha256(Path(path) / name) != expected["sha256"]:
                return f"{name}: checksum differs"
    except (_Unusable, OSError, ValueError, KeyError, TypeError) as error:
        return str(error)
    return None


def _current(root: Path) -> Path:
    try:
        name = (root / CURRENT).read_text().strip()
    except FileNotFoundError:
        raise _Unusable("missing (no snapshot written yet)") from None
    if not name.startswith(_PREFIX) or "/" in name or not (root / name).is_dir():
        raise _Unusable(f"missing (CURRENT names {name!r}, which is not a snapshot here)")
    return root / name


def _manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((path / MANIFEST).read_bytes())
        body = manifest["body"]
        checksum = manifest["sha256"]
    except FileNotFoundError:
        raise _Unusable("corrupt (no manifest)") from None
    except (ValueError, KeyError, TypeError) as error:
        raise _Unusable(f"corrupt (manifest unreadable: {error})") from None
    if hashlib.sha256(_canonical(body).encode()).hexdigest() != checksum:
        raise _Unusable("corrupt (manifest checksum differs)")
    return dict(body)


def _check_body(
    body: Mapping[str, Any], identity: Mapping[str, Any], max_age_s: float, now: float, bm25: bool, dense: bool
) -> None:
    if body.get("format") != FORMAT_VERSION:
        raise _Unusable(f"format {body.get('format')!r}, this service reads {FORMAT_VERSION}")
    if _canonical(body["identity"]) != _canonical(identity):
        differing = sorted(
            key
            for key in {*body["identity"], *identity}
            if _canonical(body["identity"].get(key)) != _canonical(identity.get(key))
        )
        raise _Unusable(f"other identity (differs in {', '.join(differing)})")
    age = now - float(body["created_at"])
    if age > max_age_s:
        raise _Unusable(f"too old ({age:.0f}s, at most {max_age_s:.0f}s)")
    if age < -_FUTURE_TOLERANCE_S:
        raise _Unusable(f"written {-age:.0f}s in the future (clock)")
    held = sorted(body["indexes"])
    wanted = sorted(name for name, kept in (("bm25", bm25), ("dense", dense)) if kept)
    if held != wanted:
        raise _Unusable(f"holds indexes {held}, the service keeps {wanted}")


def _mapped_arrays(path: Path, body: Mapping[str, Any], verify: str) -> dict[str, np.ndarray]:
    expected = body["files"][ARRAYS]
    file = path / ARRAYS
    size = _check_size(file, expected)
    if verify == "full":
        if _file_sha256(file) != expected["sha256"]:
            raise _Unusable(f"corrupt ({ARRAYS} checksum differs)")
    elif _sampled_digest(file, size) != expected["sampled_sha256"]:
        raise _Unusable(f"corrupt ({ARRAYS} sampled checksum differs)")
    buffer: Any = b""
    if size:
        with open(file, "rb") as handle:
            buffer = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    arrays: dict[str, np.ndarray] = {}
    for name, spec in body["arrays"].items():
        dtype, shape, offset = np.dtype(spec["dtype"]), tuple(int(n) for n in spec["shape"]), int(spec["offset"])
        count = int(np.prod(shape, dtype=np.int64))
        if offset < 0 or offset + count * dtype.itemsize > size:
            raise _Unusable(f"corrupt (array {name!r} lies past the end of {ARRAYS})")
        if count:
            arrays[name] = np.frombuffer(buffer, dtype=dtype, count=count, offset=offset).reshape(shape)
        else:
            arrays[name] = np.zeros(shape, dtype=dtype)
    return arrays


def _follower(path: Path, body: Mapping[str, Any]) -> dict[str, Any]:
    expected = body["files"][FOLLOWER]
    data = (path / FOLLOWER).read_bytes()
    if len(data) != expected["size"] or hashlib.sha256(data).hexdigest() != expected["sha256"]:
        raise _Unusable(f"corrupt ({FOLLOWER} checksum differs)")
    follower = json.loads(data)
    if int(follower["watermark"]) != int(body["watermark"]):
        raise _Unusable("corrupt (follower watermark differs from the manifest's)")
    return dict(follower)


def _check_size(file: Path, expected: Mapping[str, Any]) -> int:
    try:
        size = file.stat().st_size
    except FileNotFoundError:
        raise _Unusable(f"corrupt ({file.name} missing)") from None
    if size != int(expected["size"]):
        raise _Unusable(f"corrupt ({file.name} is {size} bytes, {expected['size']} written)")
    return size


def _sampled_digest(file: Path, size: int) -> str:
    """sha256 of the file's size and of _SAMPLES blocks spread evenly over it (the whole file when small)."""
    digest = hashlib.sha256(size.to_bytes(8, "little"))
    with open(file, "rb") as handle:
        if size <= _SAMPLES * _SAMPLE_BYTES:
            digest.update(handle.read())
        else:
            for offset in np.linspace(0, size - _SAMPLE_BYTES, _SAMPLES).astype(np.int64).tolist():
                digest.update(os.pread(handle.fileno(), _SAMPLE_BYTES, offset))
    return digest.hexdigest()


def _file_sha256(file: Path) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(_READ_PIECE)  # one buffer read into again and again: no heap left behind
    view = memoryview(buffer)
    with open(file, "rb", buffering=0) as handle:
        while count := handle.readinto(view):
            digest.update(view[:count])
    return digest.hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# --- the query service's use of snapshots --------------------------------------------------------


class IndexSnapshots:
    """When the query service saves a snapshot of its view (the registry follower's state and the
    in-process indexes of its ChunkIndexSync, taken together while no registry change is applied)
    and how it starts from one (RAGRPC_INDEX_SNAPSHOT_DIR). `identity` is everything the snapshot's
    indexes depend on (model, dimension, collection, analyzer, BM25 parameters, context headers,
    which indexes are held): a snapshot of another identity is not used."""

    def __init__(
        self,
        directory: str | Path,
        *,
        identity: Mapping[str, Any],
        max_age_s: float,
        verify: str = "full",
        keep: int = 2,
        dense_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self._dense_options = dict(dense_options or {})
        self.identity = dict(identity)
        self._max_age_s = max_age_s
        self._verify = verify
        self._keep = keep
        self.saved = 0

    def load(self, *, analyzer: Analyzer | None, dense: bool) -> LoadedSnapshot | None:
        """The current snapshot with the follower's and the sync's tables unpacked from it (into
        `tables`), or None (logged) where it must not be used."""
        snapshot = load_snapshot(
            self.directory,
            identity=self.identity,
            max_age_s=self._max_age_s,
            analyzer=analyzer,
            dense=dense,
            verify=self._verify,
            dense_options=self._dense_options,
        )
        if snapshot is None:
            return None
        arrays = snapshot.state_arrays
        try:
            view = PackedTable.restore(VIEW_CODEC, sub_arrays(arrays, "follower"))
            applied = PackedTable.restore(APPLIED_CODEC, sub_arrays(arrays, "sync"), share_keys_with=view)
            tables = {"follower": view, "sync": applied}
        except (ValueError, KeyError) as error:
            logger.warning(
                "index snapshot %s not used: corrupt state (%s: %s); the indexes load in full",
                snapshot.path,
                type(error).__name__,
                error,
            )
            return None
        return dataclasses.replace(snapshot, state_arrays={}, tables=tables)

    @staticmethod
    def restore(snapshot: LoadedSnapshot, follower: Any, sync: Any) -> None:
        """The follower and the sync take the snapshot's view (the sync was built on its indexes)."""
        sync.restore_state(snapshot.tables["sync"])
        follower.restore(snapshot.follower_state["follower"], snapshot.tables["follower"], snapshot.watermark)

    def save(self, follower: Any, sync: Any) -> Path:
        """A snapshot of the view now: captured while the follower is paused (compacting the indexes
        under their own locks; queries go on), written afterwards."""
        with follower.paused():
            follower_state, follower_arrays, watermark = follower.export_state()
            capture = capture_indexes(bm25=sync.bm25_index, dense=sync.dense_index)
            arrays = {**nest_arrays("follower", follower_arrays), **nest_arrays("sync", sync.export_state())}
        path = save_snapshot(
            self.directory,
            identity=self.identity,
            follower_state={"follower": follower_state},
            state_arrays=arrays,
            watermark=watermark,
            capture=capture,
            keep=self._keep,
        )
        self.saved += 1
        return path
