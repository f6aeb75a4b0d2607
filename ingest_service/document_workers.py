"""DocumentWorkers: worker processes that prepare documents (ingest_service.preparation) beside the
ingest service, so that extraction, cleaning, chunking and framing use every core instead of
competing with the event loop, the store calls and the embedding calls for one interpreter lock.

Each worker is a process with a `DocumentPreparer` of its own (built from a picklable recipe when it
starts) and a pipe. A thread of the service per worker hands it documents: a document's spec goes
in, then its bytes as one raw pipe message (not pickled; a spooled upload is read back in that
thread, off the event loop), and two answers come back: the extraction's figures once the document
is extracted, then the facts, drafts, embedded texts and BM25 terms (or the error the preparation
raised, as it was raised). The lifecycle of the document stays with the pipeline in the service; a
worker only computes. Documents queue for the next free worker, first come, first served. When every
worker is busy, the next small document waits in a worker's pipe behind the one it prepares, so
the worker goes on to it at once instead of waiting for the service's thread to read the answers
and send it (that thread shares the interpreter lock with the event loop and the store threads:
at the ingest ceiling on milvus-lite, a document's wait for a worker fell from about 380 to 150 ms).

What happens to a document whose worker does not answer:

    the worker dies (killed, out of memory, a crash in a parser)
        -> the worker is replaced and the document is prepared once more on a fresh one; when that
           worker dies too, the document fails with INTERNAL (reason DOCUMENT_WORKER_DIED). Only the
           document on the dead worker is affected: one that waited in its pipe goes to the new
           worker, without counting as a try.
    the caller stops waiting (the document timeout RAGRPC_DOCUMENT_TIMEOUT_S ran out, a delete of the
    document, shutdown)
        -> the worker still busy with it is killed (SIGKILL) and replaced, so a document that hangs a
           parser never holds a worker past its timeout; a document still queued is dropped.

Workers are started by a fork server (multiprocessing's "forkserver": a clean process that imported
the preparation's modules once and forks each worker from itself), never by forking the service,
whose gRPC and store threads must not be copied into a child.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import pickle
import queue
import signal
import threading
import traceback
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from ingest_service.document_facts import DocumentFacts
from ingest_service.preparation import DocumentPreparer, ExtractionStats, FramedDocument
from ingest_service.requests import DocumentSpecInput, IngestItem
from ragrpc import errors
from ragrpc.store.metadata_fields import MetadataFields

logger = logging.getLogger(__name__)

_POLL_S = 0.05  # how often a thread waiting on its worker checks whether its document was cancelled
_PIPE_DEPTH = 2  # documents sent to a worker at once: the one it prepares and the next
# the next document waits in the pipe only when it is this small (its bytes fit the socket's buffer, so
# sending it never blocks while the worker writes the answers of the one before)
_PIPELINED_MAX_BYTES = 32 * 1024
_STOP_WAIT_S = 5.0


class WorkerDiedError(Exception):
    """A worker process ended while it prepared a document (not a ragrpc error: the pool retries)."""


@dataclass
class _Request:
    """What a worker receives first for a document (its bytes follow as one raw message)."""

    tenant: str
    spec: DocumentSpecInput
    content_hash: str
    metadata_fields: MetadataFields | None


@dataclass
class PreparedDocument:
    facts: DocumentFacts
    framed: FramedDocument
    enricher_failures: tuple[str, ...] = ()  # names, one per failed enricher call (the service counts them)


@dataclass
class _Job:
    item: IngestItem
    metadata_fields: MetadataFields | None
    loop: asyncio.AbstractEventLoop
    extracted: asyncio.Future[ExtractionStats]
    prepared: asyncio.Future[PreparedDocument]
    cancelled: threading.Event = field(default_factory=threading.Event)

    def deliver(self, future: asyncio.Future[Any], value: Any) -> None:
        """Sets one of the job's results, from a worker thread."""
        self._on_loop(_settle, future, value)

    def fail(self, error: BaseException) -> None:
        """The job failed: the extraction's result when it is still awaited, else the preparation's."""
        self._on_loop(_fail, self, error)

    def _on_loop(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop was closed: nobody waits any more
            pass


def _settle(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(job: _Job, error: BaseException) -> None:
    # The pipeline awaits `extracted` before `prepared`, and stops at the first error: one of them
    # carries it, the other is cancelled (an error nobody awaits is marked seen: the caller may
    # have been cancelled meanwhile, and then the job was abandoned anyway).
    target = job.prepared if job.extracted.done() else job.extracted
    for future in (job.extracted, job.prepared):
        if future.done():
            continue
        if future is target:
            future.set_exception(error)
            future.exception()
        else:
            future.cancel()


class DocumentWorkers:
    """`processes` worker processes, each preparing one document at a time with the preparer that
    `build()` makes in it (a picklable callable: it is sent to every worker). `setup()`, when given,
    runs first in each worker (its logging)."""

    def __init__(
        self,
        build: Callable[[], DocumentPreparer],
        processes: int,
        *,
        setup: Callable[[], None] | None = None,
        preload: tuple[str, ...] = ("ingest_service.preparation",),
    ) -> None:
        if processes < 1:
            raise ValueError(f"a worker pool needs at least 1 process, got {processes}")
        self._build = build
        self._setup = setup
        self._context = multiprocessing.get_context("forkserver")
        self._preload = preload
        self._processes = processes
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        self._idle = 0  # slots waiting for a document
        self._closed = False
        self.replaced = 0  # workers replaced after they died or were killed (for tests and metrics)

    @property
    def size(self) -> int:
        return self._processes

    def start(self) -> None:
        """Starts the workers (blocking: at service start, or lazily with the first document)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the document workers were closed")
            if self._slots:
                return
            self._context.set_forkserver_preload(list(self._preload))
            self._slots = [_Slot(self, number) for number in range(self._processes)]
        for slot in self._slots:
            slot.start()

    def worker_pids(self) -> list[int]:
        """The process ids of the live workers (for tests)."""
        return [pid for slot in self._slots if (pid := slot.pid) is not None]

    def submit(self, item: IngestItem, metadata_fields: MetadataFields | None) -> Preparation:
        """Queues `item` for the next free worker; await the handle's `extracted()`, then `prepared()`."""
        return Preparation(self, item, metadata_fields)

    def _waiting(self, change: int) -> None:
        with self._lock:
            self._idle += change

    def _idle_slots(self) -> int:
        return self._idle

    def _enqueue(self, job: _Job) -> None:
        if self._closed:
            raise errors.UnavailableError("the ingest service is stopping", reason="SHUTTING_DOWN")
        self._jobs.put(job)

    def close(self) -> None:
        """Stops every worker (a document still being prepared is abandoned: its ingestion was rolled
        back, or will be by recovery) and the threads that served them."""
        with self._lock:
            self._closed = True
            slots = list(self._slots)
        for _ in slots:
            self._jobs.put(None)
        for slot in slots:
            slot.stop()
        while True:  # jobs still queued: nobody will take them
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.fail(errors.UnavailableError("the ingest service is stopping", reason="SHUTTING_DOWN"))


class Preparation:
    """One document's preparation on the workers. `extracted()` then `prepared()`; `cancel()` (a no-op
    once it ended) stops the worker still busy with it. A worker that dies on the document is replaced
    and the document prepared once more; when the second worker dies too, InternalError
    (DOCUMENT_WORKER_DIED)."""

    def __init__(self, pool: DocumentWorkers, item: IngestItem, metadata_fields: MetadataFields | None) -> None:
        self._pool = pool
        self._item = item
        self._fields = metadata_fields
        self._job: _Job | None = None
        self._attempts = 0

    def _start(self) -> _Job:
        loop = asyncio.get_running_loop()
        self._attempts += 1
        job = _Job(self._item, self._fields, loop, loop.create_future(), loop.create_future())
        self._job = job
        self._pool._enqueue(job)
        return job

    async def extracted(self) -> ExtractionStats:
        if not self._pool._slots:
            await asyncio.to_thread(self._pool.start)
        return await self._outcome(extracted=True)

    async def prepared(self) -> PreparedDocument:
        return await self._outcome(extracted=False)

    async def _outcome(self, *, extracted: bool) -> Any:
        while True:
            job = self._job or self._start()
            try:
                stats = await job.extracted  # a retried job is extracted again first, as the first time
                return stats if extracted else await job.prepared
            except WorkerDiedError as died:
                if self._attempts >= 2:
                    name = self._item.spec.document_id or self._item.spec.file_name or "(unnamed)"
                    raise errors.InternalError(
                        f"the worker process preparing document {name!r} died twice ({died}): killed, out of "
                        "memory, or a crash while reading the file; it was not ingested",
                        reason="DOCUMENT_WORKER_DIED",
                    ) from None
                logger.warning("%s; preparing document %r once more", died, self._item.spec.document_id)
                self._job = None
            except asyncio.CancelledError:
                job.cancelled.set()
                raise

    def cancel(self) -> None:
        if self._job is not None and not self._job.prepared.done():
            self._job.cancelled.set()


class _Slot:
    """One worker process and the thread of the service that feeds it."""

    def __init__(self, pool: DocumentWorkers, number: int) -> None:
        self._pool = pool
        self._number = number
        self._process: Any = None
        self._conn: Connection | None = None
        self._stopping = threading.Event()
        self._held: _Job | None = None  # taken from the queue, sent once the pipe is empty
        self._closing = False  # the pool's end was taken from the queue
        self._thread = threading.Thread(target=self._serve, name=f"document-worker-{number}", daemon=True)

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.is_alive() else None

    def start(self) -> None:
        self._spawn()
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(_STOP_WAIT_S)
        self._end_process()

    def _spawn(self) -> None:
        parent, child = self._pool._context.Pipe(duplex=True)
        process = self._pool._context.Process(
            target=_worker_main,
            args=(child, self._pool._build, self._pool._setup),
            name=f"ingest-document-worker-{self._number}",
            daemon=True,
        )
        process.start()
        child.close()
        self._process, self._conn = process, parent

    def _end_process(self) -> None:
        process, conn = self._process, self._conn
        if process is not None and process.is_alive():
            process.kill()
            process.join(_STOP_WAIT_S)
        if conn is not None:
            conn.close()

    def _replace(self, why: str) -> None:
        self._end_process()
        with self._pool._lock:
            self._pool.replaced += 1
        if self._stopping.is_set():
            self._process = self._conn = None
            return
        logger.info("document worker %d replaced: %s", self._number, why)
        self._spawn()

    def _serve(self) -> None:
        sent: deque[_Job] = deque()  # in the worker's pipe, in order; the first is being prepared
        while not self._stopping.is_set():
            if sent:
                self._finish_first(sent)
                continue
            if self._closing:  # the pool closes: the documents that were in the pipe are done
                return
            job, self._held = self._held or self._next_job(), None
            if job is None:
                return
            if job.cancelled.is_set():
                continue
            if self._process is None:
                self._spawn()
            elif not self._process.is_alive():  # it died between two documents
                self._replace(self._death())
            self._start(job, sent)
            self._top_up(sent)
        self._abandon(sent)
        if self._held is not None:
            self._held.fail(errors.UnavailableError("the ingest service is stopping", reason="SHUTTING_DOWN"))

    def _top_up(self, sent: deque[_Job]) -> None:
        """Sends the next queued document behind the one being prepared, so that the worker starts it
        as soon as it ends the one before, not once this thread got the interpreter lock to read the
        answers and send it. Only while every other slot is busy (an idle one takes it at once), and
        only a small one (see _PIPELINED_MAX_BYTES; a larger one is held until the pipe is empty)."""
        if self._held is not None or self._closing or len(sent) >= _PIPE_DEPTH or self._pool._idle_slots():
            return
        try:
            follower = self._pool._jobs.get_nowait()
        except queue.Empty:
            return
        if follower is None:
            self._closing = True
        elif follower.cancelled.is_set():
            return
        elif follower.item.size <= _PIPELINED_MAX_BYTES:
            content = self._content(follower)
            if content is None:
                return
            if self._queue_behind(follower, content):
                sent.append(follower)
            else:
                self._held = follower
        else:
            self._held = follower

    def _next_job(self) -> _Job | None:
        """The next queued job, waiting for one (None: the pool closes)."""
        self._pool._waiting(+1)
        try:
            return self._pool._jobs.get()
        finally:
            self._pool._waiting(-1)

    def _abandon(self, sent: deque[_Job]) -> None:
        for job in sent:
            job.fail(errors.UnavailableError("the ingest service is stopping", reason="SHUTTING_DOWN"))
        sent.clear()

    def _start(self, job: _Job, sent: deque[_Job]) -> None:
        """Sends the job to the worker (a worker found dead fails it: its Preparation retries it)."""
        conn = self._conn
        assert conn is not None
        content = self._content(job)
        if content is None:
            return
        try:
            self._send(conn, job, content)
        except WorkerDiedError as died:
            self._replace(str(died))
            job.fail(died)
            self._resend(sent)
            return
        sent.append(job)

    def _queue_behind(self, job: _Job, content: bytes) -> bool:
        """Sends the job behind the one being prepared; False when the worker's pipe is closed (the
        answers of the document before tell what happened to the worker, and who it happened to)."""
        conn = self._conn
        assert conn is not None
        try:
            self._send(conn, job, content)
        except WorkerDiedError:
            return False
        return True

    @staticmethod
    def _content(job: _Job) -> bytes | None:
        """The document's bytes (a spooled upload is read back here, in this thread), read before anything
        goes into the pipe; None, with the job failed, when they can no longer be read: its ingestion ended
        meanwhile (cancelled, timed out) and closed the upload. Before, such a read raised halfway through
        a send and ended this slot's thread (seen in CI's chaos test, 2026-12-08)."""
        try:
            return job.item.read()
        except (ValueError, OSError) as exc:
            job.fail(
                errors.AbortedError(
                    f"the document's upload could not be read when a worker took it ({exc}); its ingestion had ended",
                    reason="UPLOAD_CLOSED",
                )
            )
            return None

    def _resend(self, sent: deque[_Job]) -> None:
        """The worker was replaced: the documents that waited in its pipe (not started, through no
        fault of theirs) go to the new one."""
        waiting = list(sent)
        sent.clear()
        if self._process is None:  # stopping
            for job in waiting:
                job.fail(errors.UnavailableError("the ingest service is stopping", reason="SHUTTING_DOWN"))
            return
        for job in waiting:
            if not job.cancelled.is_set():
                self._start(job, sent)

    def _finish_first(self, sent: deque[_Job]) -> None:
        """Reads the answers of the document being prepared (the first sent) and delivers them."""
        job = sent.popleft()
        conn = self._conn
        assert conn is not None
        try:
            for future in (job.extracted, job.prepared):
                outcome = self._receive(conn, job, sent)
                if outcome is None:  # the document was cancelled: its worker is gone
                    self._resend(sent)
                    return
                kind, value = outcome
                if kind == "failed":
                    job.fail(value)
                    return
                if future is job.prepared:
                    value = PreparedDocument(*value)
                job.deliver(future, value)
        except WorkerDiedError as died:
            self._replace(str(died))
            job.fail(died)
            self._resend(sent)
        except Exception as exc:  # noqa: BLE001 - e.g. an answer that cannot be read: the pipe's state is unknown
            logger.exception("document worker %d failed to serve a document", self._number)
            self._replace(f"{type(exc).__name__}: {exc}")
            job.fail(exc)
            self._resend(sent)

    def _send(self, conn: Connection, job: _Job, content: bytes) -> None:
        item = job.item
        fields = job.metadata_fields  # a plain copy: the collection's own caches what does not pickle
        portable = MetadataFields(fields.keys, fields.legacy) if fields is not None else None
        request = _Request(item.tenant, item.spec, item.content_hash, portable)
        try:
            conn.send(request)
            conn.send_bytes(content)
        except (BrokenPipeError, ConnectionResetError, EOFError) as exc:
            raise WorkerDiedError(self._death()) from exc

    def _receive(self, conn: Connection, job: _Job, sent: deque[_Job]) -> tuple[str, Any] | None:
        """The worker's next answer; None when the job was cancelled meanwhile (the worker is replaced).
        While it waits, the next queued document may join the pipe (`_top_up`)."""
        while not conn.poll(_POLL_S):
            if job.cancelled.is_set() or self._stopping.is_set():
                self._replace("its document was cancelled while it was being prepared")
                return None
            self._top_up(sent)
        try:
            answer: tuple[str, Any] = conn.recv()
        except (EOFError, ConnectionResetError) as exc:
            raise WorkerDiedError(self._death()) from exc
        return answer

    def _death(self) -> str:
        process = self._process
        if process is not None:
            process.join(1.0)
            code = process.exitcode
            if code is not None and code < 0:
                return f"worker {self._number} ended by signal {signal.Signals(-code).name}"
            if code is not None:
                return f"worker {self._number} exited with status {code}"
        return f"worker {self._number} closed its pipe"


# ---- the worker process -------------------------------------------------------------------------


def _worker_main(conn: Connection, build: Callable[[], DocumentPreparer], setup: Callable[[], None] | None) -> None:
    """A worker's life: build the preparer, then prepare documents until the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the service decides when its workers stop
    if setup is not None:
        setup()
    preparer = build()
    while True:
        try:
            request: _Request = conn.recv()
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        _prepare_one(conn, preparer, request, data)


def _prepare_one(conn: Connection, preparer: DocumentPreparer, request: _Request, data: bytes) -> None:
    item = IngestItem(request.tenant, request.spec, content=data)
    item.__dict__["content_hash"] = request.content_hash  # computed by the service as the bytes arrived
    enrichers = preparer.enrichers
    failed_before = Counter(enrichers.failures) if enrichers is not None else Counter()
    try:
        extracted, facts = preparer.extract(item, request.metadata_fields, data)
        conn.send(("extracted", ExtractionStats.of(extracted)))
        framed = preparer.frame(item, extracted, facts)
    except Exception as exc:  # noqa: BLE001 - the service raises it as the preparation raised it
        conn.send(("failed", _portable(exc)))
        return
    failed = Counter(enrichers.failures) - failed_before if enrichers is not None else Counter()
    conn.send(("prepared", (facts, framed, tuple(failed.elements()))))


def _portable(exc: Exception) -> Exception:
    """`exc` when it survives pickling (ragrpc errors do), else a RuntimeError naming it, with the
    worker's traceback as a note for the service's log."""
    portable: Exception = exc
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001
        portable = RuntimeError(f"{type(exc).__name__}: {exc}")
    if not isinstance(exc, errors.RagrpcError):
        portable.add_note("in the document worker:\n" + "".join(traceback.format_exception(exc)))
    portable.__traceback__ = None
    return portable
