"""Read your writes across the ingest and retrieve clients of one caller.

    session = ReadYourWrites()
    with IngestClient(ingest_addr, session=session) as ingest, RetrieveClient(query_addr, session=session) as query:
        ingest.upload("note.md")
        hits, _ = query.search("what the note says")   # answered once note.md is searchable

Every write through an ingest client given the session (upload, a batch's summary, update, delete,
get_document) hands its consistency token to the session, which keeps one merged token (the latest
position and the latest version of each document written); every Retrieve and Ask through a
retrieve client given the session passes it on, so the query service answers once it reflects
those writes (waiting at most the call's deadline; FailedPrecondition with reason CONSISTENCY_LAG when
it does not catch up). Thread-safe: one session may serve threads and tasks of one caller.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from ragrpc import errors
from ragrpc.consistency import ConsistencyToken


class ReadYourWrites:
    """With `path`, the session is kept in that file (the `ragrpc` CLI: an `ingest` and a later
    `search` are two processes): read when the session starts, written after every write."""

    def __init__(self, token: str = "", *, path: str | os.PathLike[str] | None = None) -> None:
        self._lock = threading.Lock()
        self._token: ConsistencyToken | None = None
        self._path = Path(path) if path is not None else None
        if self._path is not None:
            self._merge(self._read_file())
        if token:
            self.record(token)

    def record(self, token: str) -> None:
        """Adds the token of a write (an empty string, from a server without tokens, is ignored)."""
        if not token:
            return
        written = ConsistencyToken.decode(token)
        with self._lock:
            if self._path is not None:
                self._merge_locked(self._read_file())
            self._merge_locked(written)
            if self._path is not None and self._token is not None:
                self._write_file(self._token.encode())

    def _merge(self, token: ConsistencyToken | None) -> None:
        with self._lock:
            self._merge_locked(token)

    def _merge_locked(self, token: ConsistencyToken | None) -> None:
        if token is not None:
            self._token = token if self._token is None else self._token.merge(token)

    def _read_file(self) -> ConsistencyToken | None:
        assert self._path is not None
        try:
            return ConsistencyToken.decode(self._path.read_text().strip())
        except (OSError, errors.InvalidInputError):  # none yet, or unreadable: no earlier writes to wait for
            return None

    def _write_file(self, text: str) -> None:
        assert self._path is not None
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self._path.parent, delete=False) as handle:
                handle.write(text)
            os.replace(handle.name, self._path)
        except OSError:  # a read-only home: the session still holds the token in memory
            return

    @property
    def token(self) -> str:
        """The merged token to pass as `consistency_token` ("" before any write)."""
        with self._lock:
            return self._token.encode() if self._token is not None else ""

    def clear(self) -> None:
        with self._lock:
            self._token = None


def recorded(session: ReadYourWrites | None, response: Any) -> Any:
    """`response` (a write's), its consistency token handed to the session when there is one."""
    if session is not None:
        session.record(response.consistency_token)
    return response


def with_session_token(session: ReadYourWrites | None, options: dict[str, Any]) -> dict[str, Any]:
    """Read options with the session's token, unless the caller passed one."""
    if session is not None and not options.get("consistency_token"):
        options["consistency_token"] = session.token
    return options
