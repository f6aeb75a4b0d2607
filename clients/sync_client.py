"""Blocking clients of IngestService and RetrieveService.

Every failed call raises a `clients.errors.RagrpcClientError` subclass. Streams are iterators
of typed events (clients.events); `close()` (or leaving a `with` block) cancels the call.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ClassVar, Generic, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients import convert
from clients.channel import INGEST_SERVICE, RETRIEVE_SERVICE, ChannelSettings, create_channel
from clients.errors import cancelled_by_client, from_rpc_error
from clients.events import (
    AskEvent,
    AskResults,
    Hit,
    IngestEvent,
    IngestResults,
    RetrievalSummary,
    RetrieveResults,
)
from clients.session import ReadYourWrites, recorded, with_session_token
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2_grpc

T = TypeVar("T")
StreamT = TypeVar("StreamT", bound="SyncStream[Any]")
UploadSource = str | os.PathLike[str] | bytes | bytearray | memoryview
DEFAULT_CHUNK_BYTES = 1024 * 1024


class SyncStream(Generic[T]):
    """Iterator over a server stream: converts each message, records it (`accept`) and yields
    what `accept` returns (None means "recorded, not yielded")."""

    def __init__(self, call: Any, convert_message: Callable[[Any], Any]) -> None:
        self._call = call
        self._convert_message = convert_message
        self._cancelled = False

    def accept(self, item: Any) -> Any:
        raise NotImplementedError

    def __iter__(self) -> SyncStream[T]:
        return self

    def __next__(self) -> T:
        while True:
            if self._cancelled:
                raise cancelled_by_client()
            try:
                message = next(self._call)
            except grpc.RpcError as err:
                raise from_rpc_error(err) from err
            item = self.accept(self._convert_message(message))
            if item is not None:
                return item  # type: ignore[no-any-return]

    def drain(self: StreamT) -> StreamT:
        """Consumes the rest of the stream; returns the stream (for its collected results)."""
        for _ in self:
            pass
        return self

    def close(self) -> None:
        """Cancels the call (a no-op once it finished); later reads raise Cancelled."""
        self._cancelled = self._call.cancel() or self._cancelled

    cancel = close

    def __enter__(self: StreamT) -> StreamT:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RetrieveStream(RetrieveResults, SyncStream[Hit]):
    """Yields hits best first; `.summary` is set once the stream is exhausted."""

    def __init__(self, call: Any) -> None:
        RetrieveResults.__init__(self)
        SyncStream.__init__(self, call, convert.retrieve_item)


class AskStream(AskResults, SyncStream[AskEvent]):
    """Yields Source, Token, Retraction, Citation and Final events; `.answer`, `.sources`,
    `.citations` and `.final` reflect what arrived so far."""

    def __init__(self, call: Any) -> None:
        AskResults.__init__(self)
        SyncStream.__init__(self, call, convert.ask_event)


class IngestStream(IngestResults, SyncStream[IngestEvent]):
    """Yields Progress events, then one BatchSummary; `.job_id`, `.documents`, `.summary`."""

    def __init__(self, call: Any, on_token: Callable[[str], None] | None = None) -> None:
        IngestResults.__init__(self, on_token)
        SyncStream.__init__(self, call, convert.ingest_event)


def health_status(
    channel: grpc.Channel, service: str, timeout: float, metadata: tuple[tuple[str, str], ...] = ()
) -> str:
    """The grpc.health.v1 status name of `service` ("SERVING", "NOT_SERVING", ...)."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout, metadata=metadata)
    except grpc.RpcError as err:
        raise from_rpc_error(err) from err
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def wait_until_serving(
    settings: ChannelSettings, wait_s: float, *, service: str = "", poll_s: float = 0.25
) -> tuple[str, Exception | None]:
    """Polls the health of `service` until SERVING or `wait_s` passed; returns the last status
    ("UNREACHABLE" when no answer came) and the last error."""
    deadline = time.monotonic() + wait_s
    status, last_error = "UNREACHABLE", None
    with create_channel(settings) as channel:
        while True:
            remaining = deadline - time.monotonic()
            try:
                check_timeout = max(0.1, min(remaining, 2.0))
                status = health_status(channel, service, check_timeout, settings.call_metadata())
                last_error = None
            except Exception as err:  # noqa: BLE001 - any failure means "not yet"
                status, last_error = "UNREACHABLE", err
            if status == "SERVING" or time.monotonic() + poll_s >= deadline:
                return status, last_error
            time.sleep(poll_s)


class _SyncClient:
    service_name: ClassVar[str] = ""

    def __init__(
        self,
        target: str,
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        stream_timeout: float = 300.0,
        secure: bool = False,
        root_certificates: bytes | None = None,
        max_message_bytes: int = 16 * 1024 * 1024,
        session: ReadYourWrites | None = None,
    ) -> None:
        self.session = session  # read your writes (clients.session): writes recorded, reads pass it on
        self.settings = ChannelSettings(
            target=target,
            api_key=api_key,
            secure=secure,
            root_certificates=root_certificates,
            timeout=timeout,
            stream_timeout=stream_timeout,
            max_message_bytes=max_message_bytes,
        )
        self._channel = create_channel(self.settings)

    def _call_args(self, timeout: float | None, request_id: str | None, *, stream: bool) -> dict[str, Any]:
        return {
            "timeout": self.settings.deadline(timeout, stream=stream),
            "metadata": self.settings.call_metadata(request_id),
        }

    def _unary(
        self,
        method: Callable[..., Any],
        request: Any,
        timeout: float | None = None,
        request_id: str | None = None,
        *,
        stream: bool = False,
    ) -> Any:
        try:
            return method(request, **self._call_args(timeout, request_id, stream=stream))
        except grpc.RpcError as err:
            raise from_rpc_error(err) from err

    def _record(self, response: Any) -> Any:
        return recorded(self.session, response)

    def _with_session(self, options: dict[str, Any]) -> dict[str, Any]:
        return with_session_token(self.session, options)

    def health(self, service: str | None = None, *, timeout: float | None = None) -> str:
        """The health status name of this client's service (or `service`; "" for the server)."""
        name = self.service_name if service is None else service
        return health_status(
            self._channel, name, self.settings.deadline(timeout, stream=False), self.settings.call_metadata()
        )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self: Any) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class IngestClient(_SyncClient):
    """Client of IngestService (uploads, batches, document resources, jobs)."""

    service_name = INGEST_SERVICE

    def __init__(self, target: str, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self._stub = ingest_pb2_grpc.IngestServiceStub(self._channel)

    def upload(
        self,
        source: UploadSource,
        *,
        file_name: str = "",
        media_type: str = "",
        collection: str = "",
        document_id: str = "",
        source_name: str = "",
        title: str = "",
        tags: Iterable[str] = (),
        metadata: Mapping[str, str] | None = None,
        password: str = "",
        chunking: convert.ChunkingLike = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        on_progress: Callable[[int], None] | None = None,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> ingest_pb2.Document:
        """Uploads a file (path) or bytes as a client stream; returns the ACTIVE document.
        `file_name` defaults to the path's name; `on_progress(n)` is called per piece sent."""
        spec = convert.document_spec(
            file_name=file_name or convert.default_file_name(source),
            media_type=media_type,
            collection=collection,
            document_id=document_id,
            source=source_name,
            title=title,
            tags=tags,
            metadata=metadata,
            password=password,
            chunking=chunking,
        )
        with convert.open_upload_source(source) as reader:
            requests = convert.upload_requests(spec, reader, chunk_bytes, on_progress)
            response = self._unary(self._stub.UploadDocument, requests, timeout, request_id, stream=True)
        self._record(response)
        return response.document  # type: ignore[no-any-return]

    def ingest(
        self,
        documents: Iterable[convert.NewDocument | ingest_pb2.InlineDocument | Mapping[str, Any]],
        *,
        timeout: float | None = None,
        request_id: str | None = None,
        final_only: bool = False,
    ) -> IngestStream:
        """Ingests inline documents; yields progress events, then the batch summary. final_only: each
        document's final event only (PROGRESS_DETAIL_FINAL), one message a document instead of one a stage."""
        request = ingest_pb2.IngestDocumentsRequest(
            documents=[convert.inline_document(d) for d in documents],
            progress_detail=ingest_pb2.PROGRESS_DETAIL_FINAL if final_only else ingest_pb2.PROGRESS_DETAIL_STAGES,
        )
        call = self._stub.IngestDocuments(request, **self._call_args(timeout, request_id, stream=True))
        return IngestStream(call, self.session.record if self.session is not None else None)

    def get_document(self, document_id: str, *, timeout: float | None = None) -> ingest_pb2.Document:
        request = ingest_pb2.GetDocumentRequest(document_id=document_id)
        return self._record(self._unary(self._stub.GetDocument, request, timeout)).document  # type: ignore[no-any-return]

    def list_documents_page(
        self,
        *,
        page_size: int = 0,
        page_token: str = "",
        state: str | None = None,
        source: str = "",
        collection: str = "",
        timeout: float | None = None,
    ) -> ingest_pb2.ListDocumentsResponse:
        """One page of documents (ordered by id) and the next page's token."""
        request = convert.list_request(
            page_size=page_size, page_token=page_token, state=state, source=source, collection=collection
        )
        return self._unary(self._stub.ListDocuments, request, timeout)  # type: ignore[no-any-return]

    def list_documents(
        self,
        *,
        page_size: int = 50,
        state: str | None = None,
        source: str = "",
        collection: str = "",
        timeout: float | None = None,
    ) -> Iterator[ingest_pb2.Document]:
        """Every matching document, fetching pages as the iteration goes."""
        token = ""
        while True:
            page = self.list_documents_page(
                page_size=page_size,
                page_token=token,
                state=state,
                source=source,
                collection=collection,
                timeout=timeout,
            )
            yield from page.documents
            token = page.next_page_token
            if not token:
                return

    def update_document(
        self,
        document_id: str,
        *,
        title: str | None = None,
        tags: Iterable[str] | None = None,
        metadata: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ingest_pb2.Document:
        """Changes the given (not None) fields only."""
        request = convert.update_request(document_id, title=title, tags=tags, metadata=metadata)
        return self._record(self._unary(self._stub.UpdateDocument, request, timeout)).document  # type: ignore[no-any-return]

    def delete_document(self, document_id: str, *, timeout: float | None = None) -> int:
        """Deletes a document; returns the number of chunks removed."""
        request = ingest_pb2.DeleteDocumentRequest(document_id=document_id)
        return self._record(self._unary(self._stub.DeleteDocument, request, timeout)).chunks_deleted  # type: ignore[no-any-return]

    def get_job(self, job_id: str, *, timeout: float | None = None) -> ingest_pb2.IngestJob:
        request = ingest_pb2.GetIngestJobRequest(job_id=job_id)
        return (self._unary(self._stub.GetIngestJob, request, timeout)).job  # type: ignore[no-any-return]


class RetrieveClient(_SyncClient):
    """Client of RetrieveService (search and question answering)."""

    service_name = RETRIEVE_SERVICE

    def __init__(self, target: str, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self._stub = retrieve_pb2_grpc.RetrieveServiceStub(self._channel)

    def retrieve(
        self, query: str, *, timeout: float | None = None, request_id: str | None = None, **options: Any
    ) -> RetrieveStream:
        """Ranked hits, best first. Options: see clients.convert.RETRIEVAL_OPTION_NAMES, and
        consistency_token (read your writes; a session's token by default)."""
        request = convert.retrieve_request(query, **self._with_session(options))
        call = self._stub.Retrieve(request, **self._call_args(timeout, request_id, stream=True))
        return RetrieveStream(call)

    def search(self, query: str, **options: Any) -> tuple[list[Hit], RetrievalSummary | None]:
        """All hits and the summary at once."""
        stream = self.retrieve(query, **options).drain()
        return stream.hits, stream.summary

    def ask(
        self, query: str, *, timeout: float | None = None, request_id: str | None = None, **options: Any
    ) -> AskStream:
        """The answer stream. Options: retrieval options plus template, history,
        max_answer_tokens, token_budget, temperature, consistency_token."""
        request = convert.ask_request(query, **self._with_session(options))
        return AskStream(self._stub.Ask(request, **self._call_args(timeout, request_id, stream=True)))
