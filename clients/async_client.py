"""asyncio clients of IngestService and RetrieveService (grpc.aio), with the same API as
clients.sync_client: coroutines for unary calls, async iterators for streams.

Create and use a client inside one event loop; `await client.close()` (or `async with`)
closes its channel. `await stream.aclose()` or leaving `async with stream` cancels a call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from clients import convert
from clients.channel import INGEST_SERVICE, RETRIEVE_SERVICE, ChannelSettings, create_aio_channel
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
from clients.sync_client import DEFAULT_CHUNK_BYTES, UploadSource
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2_grpc

T = TypeVar("T")
StreamT = TypeVar("StreamT", bound="AsyncStream[Any]")


class AsyncStream(Generic[T]):
    """Async iterator over a server stream (see clients.sync_client.SyncStream)."""

    def __init__(self, call: grpc.aio.UnaryStreamCall, convert_message: Callable[[Any], Any]) -> None:
        self._call = call
        self._convert_message = convert_message
        self._cancelled = False

    def accept(self, item: Any) -> Any:
        raise NotImplementedError

    def __aiter__(self) -> AsyncStream[T]:
        return self

    async def __anext__(self) -> T:
        while True:
            if self._cancelled:
                raise cancelled_by_client()
            try:
                message = await self._call.read()
            except grpc.RpcError as err:
                raise from_rpc_error(err) from err
            if message is grpc.aio.EOF:
                raise StopAsyncIteration
            item = self.accept(self._convert_message(message))
            if item is not None:
                return item  # type: ignore[no-any-return]

    async def drain(self: StreamT) -> StreamT:
        """Consumes the rest of the stream; returns the stream (for its collected results)."""
        async for _ in self:
            pass
        return self

    def cancel(self) -> None:
        """Cancels the call (a no-op once it finished); later reads raise Cancelled."""
        self._cancelled = self._call.cancel() or self._cancelled

    async def aclose(self) -> None:
        self.cancel()

    async def __aenter__(self: StreamT) -> StreamT:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()


class AsyncRetrieveStream(RetrieveResults, AsyncStream[Hit]):
    """Yields hits best first; `.summary` is set once the stream is exhausted."""

    def __init__(self, call: grpc.aio.UnaryStreamCall) -> None:
        RetrieveResults.__init__(self)
        AsyncStream.__init__(self, call, convert.retrieve_item)


class AsyncAskStream(AskResults, AsyncStream[AskEvent]):
    """Yields Ask events; `.answer`, `.sources`, `.citations`, `.final` as in AskStream."""

    def __init__(self, call: grpc.aio.UnaryStreamCall) -> None:
        AskResults.__init__(self)
        AsyncStream.__init__(self, call, convert.ask_event)


class AsyncIngestStream(IngestResults, AsyncStream[IngestEvent]):
    """Yields Progress events, then one BatchSummary."""

    def __init__(self, call: grpc.aio.UnaryStreamCall, on_token: Callable[[str], None] | None = None) -> None:
        IngestResults.__init__(self, on_token)
        AsyncStream.__init__(self, call, convert.ingest_event)


class _AsyncClient:
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
        self._channel = create_aio_channel(self.settings)

    def _call_args(self, timeout: float | None, request_id: str | None, *, stream: bool) -> dict[str, Any]:
        return {
            "timeout": self.settings.deadline(timeout, stream=stream),
            "metadata": self.settings.call_metadata(request_id),
        }

    async def _unary(
        self,
        method: Callable[..., Any],
        request: Any,
        timeout: float | None = None,
        request_id: str | None = None,
        *,
        stream: bool = False,
    ) -> Any:
        try:
            return await method(request, **self._call_args(timeout, request_id, stream=stream))
        except grpc.RpcError as err:
            raise from_rpc_error(err) from err

    def _record(self, response: Any) -> Any:
        return recorded(self.session, response)

    def _with_session(self, options: dict[str, Any]) -> dict[str, Any]:
        return with_session_token(self.session, options)

    async def health(self, service: str | None = None, *, timeout: float | None = None) -> str:
        """The health status name of this client's service (or `service`; "" for the server)."""
        request = health_pb2.HealthCheckRequest(service=self.service_name if service is None else service)
        response = await self._unary(health_pb2_grpc.HealthStub(self._channel).Check, request, timeout)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self: Any) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncIngestClient(_AsyncClient):
    """asyncio client of IngestService."""

    service_name = INGEST_SERVICE

    def __init__(self, target: str, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self._stub = ingest_pb2_grpc.IngestServiceStub(self._channel)

    async def upload(
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
        """Uploads a file (path) or bytes as a client stream; returns the ACTIVE document."""
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
            response = await self._unary(self._stub.UploadDocument, requests, timeout, request_id, stream=True)
        return self._record(response).document  # type: ignore[no-any-return]

    def ingest(
        self,
        documents: Iterable[convert.NewDocument | ingest_pb2.InlineDocument | Mapping[str, Any]],
        *,
        timeout: float | None = None,
        request_id: str | None = None,
        final_only: bool = False,
    ) -> AsyncIngestStream:
        """Ingests inline documents; yields progress events, then the batch summary. final_only: each
        document's final event only (PROGRESS_DETAIL_FINAL), one message a document instead of one a stage."""
        request = ingest_pb2.IngestDocumentsRequest(
            documents=[convert.inline_document(d) for d in documents],
            progress_detail=ingest_pb2.PROGRESS_DETAIL_FINAL if final_only else ingest_pb2.PROGRESS_DETAIL_STAGES,
        )
        return AsyncIngestStream(
            self._stub.IngestDocuments(request, **self._call_args(timeout, request_id, stream=True)),
            self.session.record if self.session is not None else None,
        )

    async def get_document(self, document_id: str, *, timeout: float | None = None) -> ingest_pb2.Document:
        request = ingest_pb2.GetDocumentRequest(document_id=document_id)
        return self._record(await self._unary(self._stub.GetDocument, request, timeout)).document  # type: ignore[no-any-return]

    async def list_documents_page(
        self,
        *,
        page_size: int = 0,
        page_token: str = "",
        state: str | None = None,
        source: str = "",
        collection: str = "",
        timeout: float | None = None,
    ) -> ingest_pb2.ListDocumentsResponse:
        request = convert.list_request(
            page_size=page_size, page_token=page_token, state=state, source=source, collection=collection
        )
        return await self._unary(self._stub.ListDocuments, request, timeout)  # type: ignore[no-any-return]

    async def list_documents(
        self,
        *,
        page_size: int = 50,
        state: str | None = None,
        source: str = "",
        collection: str = "",
        timeout: float | None = None,
    ) -> AsyncIterator[ingest_pb2.Document]:
        """Every matching document, fetching pages as the iteration goes."""
        token = ""
        while True:
            page = await self.list_documents_page(
                page_size=page_size,
                page_token=token,
                state=state,
                source=source,
                collection=collection,
                timeout=timeout,
            )
            for document in page.documents:
                yield document
            token = page.next_page_token
            if not token:
                return

    async def update_document(
        self,
        document_id: str,
        *,
        title: str | None = None,
        tags: Iterable[str] | None = None,
        metadata: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> ingest_pb2.Document:
        request = convert.update_request(document_id, title=title, tags=tags, metadata=metadata)
        return self._record(await self._unary(self._stub.UpdateDocument, request, timeout)).document  # type: ignore[no-any-return]

    async def delete_document(self, document_id: str, *, timeout: float | None = None) -> int:
        request = ingest_pb2.DeleteDocumentRequest(document_id=document_id)
        response = self._record(await self._unary(self._stub.DeleteDocument, request, timeout))
        return response.chunks_deleted  # type: ignore[no-any-return]

    async def get_job(self, job_id: str, *, timeout: float | None = None) -> ingest_pb2.IngestJob:
        request = ingest_pb2.GetIngestJobRequest(job_id=job_id)
        return (await self._unary(self._stub.GetIngestJob, request, timeout)).job  # type: ignore[no-any-return]


class AsyncRetrieveClient(_AsyncClient):
    """asyncio client of RetrieveService."""

    service_name = RETRIEVE_SERVICE

    def __init__(self, target: str, **kwargs: Any) -> None:
        super().__init__(target, **kwargs)
        self._stub = retrieve_pb2_grpc.RetrieveServiceStub(self._channel)

    def retrieve(
        self, query: str, *, timeout: float | None = None, request_id: str | None = None, **options: Any
    ) -> AsyncRetrieveStream:
        """Ranked hits, best first; `.summary` once exhausted. Options as RetrieveClient.retrieve."""
        request = convert.retrieve_request(query, **self._with_session(options))
        call = self._stub.Retrieve(request, **self._call_args(timeout, request_id, stream=True))
        return AsyncRetrieveStream(call)

    async def search(self, query: str, **options: Any) -> tuple[list[Hit], RetrievalSummary | None]:
        """All hits and the summary at once."""
        stream = await self.retrieve(query, **options).drain()
        return stream.hits, stream.summary

    def ask(
        self, query: str, *, timeout: float | None = None, request_id: str | None = None, **options: Any
    ) -> AsyncAskStream:
        """The answer stream (async iterator of Ask events)."""
        request = convert.ask_request(query, **self._with_session(options))
        return AsyncAskStream(self._stub.Ask(request, **self._call_args(timeout, request_id, stream=True)))


__all__ = [
    "AsyncAskStream",
    "AsyncIngestClient",
    "AsyncIngestStream",
    "AsyncRetrieveClient",
    "AsyncRetrieveStream",
    "AsyncStream",
]
