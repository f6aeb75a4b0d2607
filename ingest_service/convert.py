"""Protobuf <-> domain conversion for the ingest service (the servicer's only helper)."""

from __future__ import annotations

from typing import Any

from google.protobuf import timestamp_pb2

from ingest_service.attempts import document_etag
from ingest_service.jobs import JobSummary
from ingest_service.pipeline import ProgressEvent
from ingest_service.requests import DocumentSpecInput
from ragrpc import errors
from ragrpc.grpc_errors import basic_status
from ragrpc.models import DocumentRecord, DocumentState, IngestJobRecord
from ragrpc.v1 import ingest_pb2

_STAGES = {
    "queued": ingest_pb2.INGEST_STAGE_QUEUED,
    "extracting": ingest_pb2.INGEST_STAGE_EXTRACTING,
    "chunking": ingest_pb2.INGEST_STAGE_CHUNKING,
    "embedding": ingest_pb2.INGEST_STAGE_EMBEDDING,
    "writing": ingest_pb2.INGEST_STAGE_WRITING,
    "done": ingest_pb2.INGEST_STAGE_DONE,
}


def strategy_name(value: int, field: str = "spec.chunking.strategy") -> str:
    if value == ingest_pb2.CHUNKING_STRATEGY_UNSPECIFIED:
        return "auto"
    if value not in ingest_pb2.ChunkingStrategy.values():  # proto3 enums are open: any int32 arrives
        raise errors.InvalidInputError(f"unknown chunking strategy {value}", field=field)
    return ingest_pb2.ChunkingStrategy.Name(value).removeprefix("CHUNKING_STRATEGY_").lower()


def final_progress_only(value: int, field: str = "progress_detail") -> bool:
    """Whether an IngestDocuments stream carries each document's final event only (ProgressDetail)."""
    if value not in ingest_pb2.ProgressDetail.values():  # proto3 enums are open: any int32 arrives
        raise errors.InvalidInputError(
            f"unknown progress_detail {value}; use PROGRESS_DETAIL_STAGES or PROGRESS_DETAIL_FINAL", field=field
        )
    return value == ingest_pb2.PROGRESS_DETAIL_FINAL


def state_from_pb(value: int, field: str = "state") -> DocumentState | None:
    """The DocumentState filter of a request (None when unspecified)."""
    if not value:
        return None
    if value not in {int(s) for s in DocumentState}:
        raise errors.InvalidInputError(f"unknown document state {value}", field=field)
    return DocumentState(value)


def spec_from_pb(spec: ingest_pb2.DocumentSpec, *, field_prefix: str = "spec") -> DocumentSpecInput:
    """The domain spec; an unknown chunking strategy is an InvalidInputError naming the field."""
    return DocumentSpecInput(
        document_id=spec.document_id,
        file_name=spec.file_name,
        media_type=spec.media_type,
        collection=spec.collection,
        source=spec.source,
        title=spec.title,
        tags=list(spec.tags),
        metadata=dict(spec.metadata),
        password=spec.password,
        chunking_strategy=strategy_name(spec.chunking.strategy, field=f"{field_prefix}.chunking.strategy"),
        chunk_size_tokens=spec.chunking.chunk_size_tokens,
        chunk_overlap_tokens=spec.chunking.chunk_overlap_tokens,
    )


def _timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def document_to_pb(record: DocumentRecord) -> ingest_pb2.Document:
    doc = ingest_pb2.Document(
        document_id=record.document_id,
        collection=record.collection,
        source=record.source,
        title=record.title,
        media_type=record.media_type,
        content_hash=record.content_hash,
        state=int(record.state),  # type: ignore[arg-type]
        chunk_count=record.chunk_count,
        page_count=record.page_count,
        pages_without_text=record.pages_without_text,
        size_bytes=record.size_bytes,
        author=record.author,
        language=record.language,
        tags=record.tags,
        metadata=record.metadata,
        chunker=record.chunker,
    )
    if record.state == DocumentState.FAILED or record.error:
        doc.error_message = record.error
    if record.doc_date:
        doc.document_time.CopyFrom(_timestamp(record.doc_date))
    if record.created_at:
        doc.create_time.CopyFrom(_timestamp(record.created_at))
    if record.updated_at:
        doc.update_time.CopyFrom(_timestamp(record.updated_at))
    doc.etag = document_etag(record)
    return doc


def progress_to_pb(index: int, event: ProgressEvent) -> ingest_pb2.DocumentProgress:
    return ingest_pb2.DocumentProgress(
        index=index,
        document_id=event.document_id,
        stage=_STAGES.get(event.stage, 0),  # type: ignore[arg-type]
        state=int(event.state),  # type: ignore[arg-type]
        chunk_count=event.chunk_count,
        chunks_embedded=event.chunks_embedded,
        error_message=event.error,
        unchanged=event.unchanged,
        error_code=event.error_code,
        status=basic_status(event.error_code, event.error, event.error_reason, event.error_metadata)
        if event.state == DocumentState.FAILED and event.error_code
        else None,
    )


def summary_to_pb(summary: JobSummary | dict[str, Any]) -> ingest_pb2.IngestSummary:
    values = summary if isinstance(summary, dict) else summary.__dict__
    return ingest_pb2.IngestSummary(**values)


def job_to_pb(job: IngestJobRecord) -> ingest_pb2.IngestJob:
    result = ingest_pb2.IngestJob(job_id=job.job_id, done=job.done)
    for entry in job.documents:
        event = ProgressEvent(
            document_id=entry.get("document_id", ""),
            stage=entry.get("stage", "queued"),
            state=DocumentState(int(entry.get("state", 1))),
            chunk_count=entry.get("chunk_count", 0),
            chunks_embedded=entry.get("chunks_embedded", 0),
            error=entry.get("error", ""),
            error_code=entry.get("error_code", ""),
            unchanged=entry.get("unchanged", False),
            error_reason=entry.get("error_reason", ""),
            error_metadata=dict(entry.get("error_metadata") or {}),
        )
        result.documents.append(progress_to_pb(int(entry.get("index", 0)), event))
    if job.done and job.summary:
        result.summary.CopyFrom(summary_to_pb(job.summary))
    result.create_time.CopyFrom(_timestamp(job.created_at))
    result.update_time.CopyFrom(_timestamp(job.updated_at or job.created_at))
    return result
