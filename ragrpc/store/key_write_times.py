"""The sole writer's reads of its registry by key wait for its own writes of those keys only.

On a Milvus server a read waits until the query nodes have applied everything up to the read's
guarantee timestamp. The writer reads the registry with Session consistency (its own writes, not
Strong's wait for the newest time tick: `read_own_registry_writes`), and a Session read names this
client's last write to the whole collection. Ingestion writes the registry without pause (every
document's attempt and its switch), so every read by key named a write made a moment before and
waited for the next time tick, most of 200 ms on Milvus 2.3: 55 to 60 of the 64 store threads were
seen waiting there, holding ingestion into a 2.3.5 server at a few hundred chunks a second
(docs/benchmarks.md, figures behind the code's choices).

A read of some keys needs only the writes of those keys. `KeyWriteTimes` keeps, for the collections
it follows, the server's timestamp of this client's last write of each key (pymilvus' record of the
collection's last mutation, taken under the connection's write lock right after the call), and a
read by key names the newest of its keys' timestamps as its guarantee ("Customized" consistency):
a key written a second ago was applied long since and its read does not wait; a key written within
the last tick waits for it, as a Session read did.

- A key this client has not written since it started following the collection was last written
  before: by an earlier writer (which stopped before this one took the lease) or by this process's
  recovery. Its read names the *floor*: this client's newest write to any followed collection when
  following started (its writer lease's at least; server timestamps are global), raised to the
  timestamp of every entry dropped.
- A write whose call failed may have been applied at a timestamp nobody knows: its keys are read
  with Strong consistency until a write of them succeeds. So are the keys of a write answered without
  a timestamp (Milvus 2.3 answers a delete so: the recorded timestamp does not advance). A failed
  delete by filter (any key) makes every read of the collection Strong until its next write.
- Where no write is ever answered with a timestamp (milvus-lite, whose reads never wait) or the
  record cannot be read (another pymilvus), the collection keeps plain Session reads.
- Entries older than `keep_s` are dropped and their timestamp raises the floor, so memory is bounded
  by the write rate (30 s at 1,000 writes a second: 30,000 entries); uncertain keys stay.

Thread safety: one lock; the connection records writes under its write lock and reads from any
thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

UNCERTAIN = -1  # a write that failed: maybe applied, at an unknown timestamp
_EVENTUALLY = 1  # pymilvus' guarantee timestamp that waits for nothing


class _Followed:
    __slots__ = ("floor", "keys", "all_uncertain", "session_only")

    def __init__(self, floor: int) -> None:
        self.floor = floor
        self.keys: dict[Any, tuple[int, float]] = {}  # key -> (timestamp or UNCERTAIN, when recorded)
        self.all_uncertain = False
        self.session_only = False  # a write's timestamp could not be read: plain Session reads


class KeyWriteTimes:
    def __init__(self, *, keep_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._keep_s = keep_s
        self._clock = clock
        self._lock = threading.Lock()
        self._followed: dict[str, _Followed] = {}

    def follow(self, collection: str, last_write_ts: int) -> None:
        """From now on, reads by key of `collection` name their keys' timestamps; `last_write_ts`:
        this client's last write to it so far (0: none, the floor waits for nothing)."""
        with self._lock:
            self._followed.setdefault(collection, _Followed(max(0, int(last_write_ts))))

    def follows(self, collection: str) -> bool:
        return collection in self._followed

    def wrote(self, collection: str, keys: Iterable[Any] | None, ts: int) -> None:
        """A successful write of `keys` (None: any key, a delete by filter) at server timestamp `ts`
        (0: not known)."""
        followed = self._followed.get(collection)
        if followed is None:
            return
        now = self._clock()
        with self._lock:
            if ts <= 0:
                followed.session_only = True
                followed.keys.clear()
                return
            if followed.all_uncertain:  # a delete by filter failed before this write: it came earlier
                followed.floor = max(followed.floor, ts)
                followed.all_uncertain = False
            if keys is None:
                followed.floor = max(followed.floor, ts)
                return
            for key in keys:
                followed.keys.pop(key, None)  # re-inserted last: the dict stays in recording order
                followed.keys[key] = (ts, now)
            self._drop_old(followed, now)

    def answered(self, collection: str, keys: Iterable[Any] | None, before: int, after: int) -> None:
        """A write of `keys` (None: any key) succeeded; `before` / `after`: the collection's last write
        timestamp as pymilvus records it, read just before and just after the call. A timestamp that
        did not advance is an answer without one (a delete on Milvus 2.3): its keys may have changed
        after every known timestamp, so they are read Strong until written again; where no write was
        ever answered with a timestamp (milvus-lite), the collection keeps plain Session reads."""
        if after > before:
            self.wrote(collection, keys, after)
            return
        followed = self._followed.get(collection)
        if followed is None:
            return
        with self._lock:
            reported = followed.floor > 0 or any(ts > 0 for ts, _ in followed.keys.values())
        if reported:
            self.failed(collection, keys)
        else:
            self.wrote(collection, keys, 0)

    def failed(self, collection: str, keys: Iterable[Any] | None) -> None:
        """A write of `keys` (None: any key) whose call raised: maybe applied."""
        followed = self._followed.get(collection)
        if followed is None:
            return
        now = self._clock()
        with self._lock:
            if followed.session_only:
                return
            if keys is None:
                followed.all_uncertain = True
                return
            for key in keys:
                followed.keys.pop(key, None)
                followed.keys[key] = (UNCERTAIN, now)

    def read_options(self, collection: str, keys: Iterable[Any]) -> dict[str, Any]:
        """The consistency arguments of a read of `keys` ({} where the collection's level stays)."""
        followed = self._followed.get(collection)
        if followed is None:
            return {}
        with self._lock:
            if followed.session_only:
                return {}
            if followed.all_uncertain:
                return {"consistency_level": "Strong"}
            newest = followed.floor
            for key in keys:
                entry = followed.keys.get(key)
                if entry is None:
                    continue
                ts = entry[0]
                if ts == UNCERTAIN:
                    return {"consistency_level": "Strong"}
                newest = max(newest, ts)
        return {"consistency_level": "Customized", "guarantee_timestamp": newest or _EVENTUALLY}

    def size(self, collection: str) -> int:
        followed = self._followed.get(collection)
        return len(followed.keys) if followed is not None else 0

    def _drop_old(self, followed: _Followed, now: float) -> None:
        keys = followed.keys
        kept: list[tuple[Any, tuple[int, float]]] = []
        while keys:
            key = next(iter(keys))
            ts, at = keys[key]
            if now - at < self._keep_s:
                break
            del keys[key]
            if ts == UNCERTAIN:
                kept.append((key, (ts, at)))  # read Strong until written again
            else:
                followed.floor = max(followed.floor, ts)
        for key, entry in kept:  # an uncertain key goes to the end (checked again keep_s later)
            keys[key] = (entry[0], now)
