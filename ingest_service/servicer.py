"""IngestService servicer: protobuf in, one domain call, protobuf out. Errors are raised as
ragrpc errors and mapped to gRPC status by the server's interceptor."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import Executor

import grpc

from ingest_service import convert
from ingest_service.admission import AdmissionGate, Reservation
from ingest_service.documents import DocumentService
from ingest_service.ingestions import Ingestions
from ingest_service.jobs import IngestJobRunner
from ingest_service.requests import DocumentSpecInput, IngestItem, SpooledUpload, validate_spec
from ragrpc import errors
from ragrpc.consistency import ConsistencyToken
from ragrpc.models import DocumentRecord, document_key
from ragrpc.request_context import current_tenant
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc

_WRITE_ON_LOOP_BYTES = 64 << 10  # a smaller piece is copied and hashed on the event loop (tens of µs)


class IngestServicer(ingest_pb2_grpc.IngestServiceServicer):
    def __init__(
        self,
        *,
        ingestions: Ingestions,
        documents: DocumentService,
        jobs: IngestJobRunner,
        gate: AdmissionGate,
        executor: Executor,
        max_upload_bytes: int,
        max_batch_documents: int,
        upload_memory_bytes: int = 8 << 20,
        spool_directory: str | None = None,
        spool_executor: Executor | None = None,
    ) -> None:
        self._spool_executor = spool_executor or executor  # writes (and hashes) spooled upload bytes
        self._ingestions = ingestions
        self._gate = gate
        self._upload_memory = upload_memory_bytes
        self._spool_directory = spool_directory
        self._documents = documents
        self._jobs = jobs
        self._executor = executor
        self._max_upload = max_upload_bytes
        self._max_batch = max_batch_documents

    async def _run(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def UploadDocument(
        self, request_iterator: AsyncIterator[ingest_pb2.UploadDocumentRequest], context: grpc.aio.ServicerContext
    ) -> ingest_pb2.UploadDocumentResponse:
        spec, upload, reservation = await self._receive_upload(request_iterator)
        try:
            item = IngestItem(tenant=current_tenant(), spec=spec, upload=upload)
            task = self._ingestions.submit(item, reservation)  # from here the task releases both
        except BaseException:
            reservation.release_all()
            upload.close()
            raise
        # The ingestion is the service's: a caller that cancels or times out only stops waiting.
        outcome = await asyncio.shield(task)
        return ingest_pb2.UploadDocumentResponse(
            document=convert.document_to_pb(outcome.record),
            unchanged=outcome.unchanged,
            consistency_token=_token(outcome.record.key, outcome.record),
        )

    async def _receive_upload(
        self,
        stream: AsyncIterator[ingest_pb2.UploadDocumentRequest],
    ) -> tuple[DocumentSpecInput, SpooledUpload, Reservation]:
        """Reads the upload: the header is checked and admission reserved when it arrives (so a
        malformed header or a busy service is refused before the body is sent), the bytes are
        spooled (to disk past RAGRPC_UPLOAD_MEMORY_BYTES). On any failure, a cancellation
        included, the reservation is released and the spool dropped."""
        header: DocumentSpecInput | None = None
        reservation: Reservation | None = None
        upload = SpooledUpload(self._upload_memory, self._spool_directory)
        try:
            async for message in stream:
                if message.HasField("header"):
                    if header is not None:
                        raise errors.InvalidInputError("the header may only be sent once, first", field="header")
                    if not message.header.file_name:
                        raise errors.InvalidInputError("header.file_name is required", field="header.file_name")
                    header = convert.spec_from_pb(message.header, field_prefix="header")
                    validate_spec(header, field_prefix="header")
                    reservation = self._gate.reserve(1)
                    continue
                if header is None:
                    raise errors.InvalidInputError(
                        "the first message of an upload must carry the header", field="header"
                    )
                if upload.size + len(message.data) > self._max_upload:
                    raise errors.LimitExceededError(
                        f"the upload exceeds the maximum size of {self._max_upload} bytes (RAGRPC_MAX_UPLOAD_BYTES)",
                        reason="UPLOAD_TOO_LARGE",
                        metadata={"limit_bytes": str(self._max_upload)},
                    )
                if (
                    upload.on_disk
                    or len(message.data) > _WRITE_ON_LOOP_BYTES
                    or (upload.size + len(message.data) > self._upload_memory)
                ):  # disk writes, the roll-over to disk and the hashing of large pieces leave the event loop
                    await asyncio.get_running_loop().run_in_executor(self._spool_executor, upload.write, message.data)
                else:
                    upload.write(message.data)
            if header is None or reservation is None:
                raise errors.InvalidInputError("the upload carried no header", field="header")
        except BaseException:
            if reservation is not None:
                reservation.release_all()
            upload.close()
            raise
        return header, upload, reservation

    async def IngestDocuments(
        self, request: ingest_pb2.IngestDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ingest_pb2.IngestDocumentsResponse]:
        if not request.documents:
            raise errors.InvalidInputError("documents must not be empty", field="documents")
        if len(request.documents) > self._max_batch:
            raise errors.LimitExceededError(
                f"a batch may hold at most {self._max_batch} documents (RAGRPC_MAX_BATCH_DOCUMENTS); "
                f"got {len(request.documents)}",
                metadata={"limit": str(self._max_batch)},
            )
        tenant = current_tenant()
        items = [
            IngestItem(
                tenant=tenant, spec=convert.spec_from_pb(d.spec, field_prefix=f"documents[{i}].spec"), content=d.content
            )
            for i, d in enumerate(request.documents)
        ]
        for index, item in enumerate(items):
            if len(item.content) > self._max_upload:
                raise errors.LimitExceededError(
                    f"documents[{index}] exceeds the maximum size of {self._max_upload} bytes",
                    reason="UPLOAD_TOO_LARGE",
                    metadata={"limit_bytes": str(self._max_upload)},
                )
        final_only = convert.final_progress_only(request.progress_detail)
        job_id, events = await self._jobs.start(tenant, items, final_only=final_only)
        async for event in events:
            if event.summary is not None:
                yield ingest_pb2.IngestDocumentsResponse(job_id=job_id, summary=convert.summary_to_pb(event.summary))
            elif event.progress is not None:
                yield ingest_pb2.IngestDocumentsResponse(
                    job_id=job_id, progress=convert.progress_to_pb(event.index, event.progress)
                )

    async def GetDocument(
        self, request: ingest_pb2.GetDocumentRequest, context: grpc.aio.ServicerContext
    ) -> ingest_pb2.GetDocumentResponse:
        record = await self._run(self._documents.get, current_tenant(), request.document_id)
        return ingest_pb2.GetDocumentResponse(
            document=convert.document_to_pb(record), consistency_token=_token(record.key, record)
        )

    async def ListDocuments(
        self, request: ingest_pb2.ListDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> ingest_pb2.ListDocumentsResponse:
        state = convert.state_from_pb(request.state)
        page = await self._run(
            self._documents.list_page,
            current_tenant(),
            page_size=request.page_size,
            page_token=request.page_token,
            state=state,
            source=request.source,
            collection=request.collection,
        )
        return ingest_pb2.ListDocumentsResponse(
            documents=[convert.document_to_pb(d) for d in page.documents], next_page_token=page.next_page_token
        )

    async def UpdateDocument(
        self, request: ingest_pb2.UpdateDocumentRequest, context: grpc.aio.ServicerContext
    ) -> ingest_pb2.UpdateDocumentResponse:
        doc = request.document
        record = await self._documents.update(
            current_tenant(),
            doc.document_id,
            fields=list(request.update_mask.paths),
            etag=doc.etag,
            title=doc.title,
            tags=list(doc.tags),
            metadata=dict(doc.metadata),
        )
        return ingest_pb2.UpdateDocumentResponse(
            document=convert.document_to_pb(record), consistency_token=_token(record.key, record)
        )

    async def DeleteDocument(
        self, request: ingest_pb2.DeleteDocumentRequest, context: grpc.aio.ServicerContext
    ) -> ingest_pb2.DeleteDocumentResponse:
        tenant = current_tenant()
        deleted = await self._documents.delete(tenant, request.document_id)
        return ingest_pb2.DeleteDocumentResponse(
            chunks_deleted=deleted, consistency_token=_token(document_key(tenant, request.document_id), None)
        )

    async def GetIngestJob(
        self, request: ingest_pb2.GetIngestJobRequest, context: grpc.aio.ServicerContext
    ) -> ingest_pb2.GetIngestJobResponse:
        job = await self._jobs.get(current_tenant(), request.job_id)
        return ingest_pb2.GetIngestJobResponse(job=convert.job_to_pb(job))


def _token(key: str, record: DocumentRecord | None) -> str:
    """The consistency token of a write acknowledged now that left the document as `record`."""
    return ConsistencyToken.of_write(time.time(), [(key, record)]).encode()
