import datetime

from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChunkingStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHUNKING_STRATEGY_UNSPECIFIED: _ClassVar[ChunkingStrategy]
    CHUNKING_STRATEGY_AUTO: _ClassVar[ChunkingStrategy]
    CHUNKING_STRATEGY_FIXED_TOKENS: _ClassVar[ChunkingStrategy]
    CHUNKING_STRATEGY_SENTENCE: _ClassVar[ChunkingStrategy]
    CHUNKING_STRATEGY_PARAGRAPH: _ClassVar[ChunkingStrategy]
    CHUNKING_STRATEGY_RECURSIVE: _ClassVar[ChunkingStrategy]
    CHUNKING_STRATEGY_SEMANTIC: _ClassVar[ChunkingStrategy]
    CHUNKING_STRATEGY_HIERARCHICAL: _ClassVar[ChunkingStrategy]
    CHUNKING_STRATEGY_HEADING: _ClassVar[ChunkingStrategy]
    CHUNKING_STRATEGY_CODE: _ClassVar[ChunkingStrategy]
    CHUNKING_STRATEGY_TABLE: _ClassVar[ChunkingStrategy]

class DocumentState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DOCUMENT_STATE_UNSPECIFIED: _ClassVar[DocumentState]
    DOCUMENT_STATE_PENDING: _ClassVar[DocumentState]
    DOCUMENT_STATE_PROCESSING: _ClassVar[DocumentState]
    DOCUMENT_STATE_ACTIVE: _ClassVar[DocumentState]
    DOCUMENT_STATE_FAILED: _ClassVar[DocumentState]

class ProgressDetail(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROGRESS_DETAIL_UNSPECIFIED: _ClassVar[ProgressDetail]
    PROGRESS_DETAIL_STAGES: _ClassVar[ProgressDetail]
    PROGRESS_DETAIL_FINAL: _ClassVar[ProgressDetail]

class IngestStage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INGEST_STAGE_UNSPECIFIED: _ClassVar[IngestStage]
    INGEST_STAGE_QUEUED: _ClassVar[IngestStage]
    INGEST_STAGE_EXTRACTING: _ClassVar[IngestStage]
    INGEST_STAGE_CHUNKING: _ClassVar[IngestStage]
    INGEST_STAGE_EMBEDDING: _ClassVar[IngestStage]
    INGEST_STAGE_WRITING: _ClassVar[IngestStage]
    INGEST_STAGE_DONE: _ClassVar[IngestStage]
CHUNKING_STRATEGY_UNSPECIFIED: ChunkingStrategy
CHUNKING_STRATEGY_AUTO: ChunkingStrategy
CHUNKING_STRATEGY_FIXED_TOKENS: ChunkingStrategy
CHUNKING_STRATEGY_SENTENCE: ChunkingStrategy
CHUNKING_STRATEGY_PARAGRAPH: ChunkingStrategy
CHUNKING_STRATEGY_RECURSIVE: ChunkingStrategy
CHUNKING_STRATEGY_SEMANTIC: ChunkingStrategy
CHUNKING_STRATEGY_HIERARCHICAL: ChunkingStrategy
CHUNKING_STRATEGY_HEADING: ChunkingStrategy
CHUNKING_STRATEGY_CODE: ChunkingStrategy
CHUNKING_STRATEGY_TABLE: ChunkingStrategy
DOCUMENT_STATE_UNSPECIFIED: DocumentState
DOCUMENT_STATE_PENDING: DocumentState
DOCUMENT_STATE_PROCESSING: DocumentState
DOCUMENT_STATE_ACTIVE: DocumentState
DOCUMENT_STATE_FAILED: DocumentState
PROGRESS_DETAIL_UNSPECIFIED: ProgressDetail
PROGRESS_DETAIL_STAGES: ProgressDetail
PROGRESS_DETAIL_FINAL: ProgressDetail
INGEST_STAGE_UNSPECIFIED: IngestStage
INGEST_STAGE_QUEUED: IngestStage
INGEST_STAGE_EXTRACTING: IngestStage
INGEST_STAGE_CHUNKING: IngestStage
INGEST_STAGE_EMBEDDING: IngestStage
INGEST_STAGE_WRITING: IngestStage
INGEST_STAGE_DONE: IngestStage

class ChunkingOptions(_message.Message):
    __slots__ = ("strategy", "chunk_size_tokens", "chunk_overlap_tokens")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_OVERLAP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    strategy: ChunkingStrategy
    chunk_size_tokens: int
    chunk_overlap_tokens: int
    def __init__(self, strategy: _Optional[_Union[ChunkingStrategy, str]] = ..., chunk_size_tokens: _Optional[int] = ..., chunk_overlap_tokens: _Optional[int] = ...) -> None: ...

class Document(_message.Message):
    __slots__ = ("document_id", "collection", "source", "title", "media_type", "content_hash", "state", "error_message", "chunk_count", "page_count", "pages_without_text", "size_bytes", "author", "language", "tags", "metadata", "chunker", "document_time", "create_time", "update_time", "etag")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DOCUMENT_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    PAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    PAGES_WITHOUT_TEXT_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    AUTHOR_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CHUNKER_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_TIME_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    document_id: str
    collection: str
    source: str
    title: str
    media_type: str
    content_hash: str
    state: DocumentState
    error_message: str
    chunk_count: int
    page_count: int
    pages_without_text: _containers.RepeatedScalarFieldContainer[int]
    size_bytes: int
    author: str
    language: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    metadata: _containers.ScalarMap[str, str]
    chunker: str
    document_time: _timestamp_pb2.Timestamp
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    etag: str
    def __init__(self, document_id: _Optional[str] = ..., collection: _Optional[str] = ..., source: _Optional[str] = ..., title: _Optional[str] = ..., media_type: _Optional[str] = ..., content_hash: _Optional[str] = ..., state: _Optional[_Union[DocumentState, str]] = ..., error_message: _Optional[str] = ..., chunk_count: _Optional[int] = ..., page_count: _Optional[int] = ..., pages_without_text: _Optional[_Iterable[int]] = ..., size_bytes: _Optional[int] = ..., author: _Optional[str] = ..., language: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., chunker: _Optional[str] = ..., document_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., etag: _Optional[str] = ...) -> None: ...

class DocumentSpec(_message.Message):
    __slots__ = ("document_id", "file_name", "media_type", "collection", "source", "title", "tags", "metadata", "password", "chunking")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    DOCUMENT_ID_FIELD_NUMBER: _ClassVar[int]
    FILE_NAME_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    CHUNKING_FIELD_NUMBER: _ClassVar[int]
    document_id: str
    file_name: str
    media_type: str
    collection: str
    source: str
    title: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    metadata: _containers.ScalarMap[str, str]
    password: str
    chunking: ChunkingOptions
    def __init__(self, document_id: _Optional[str] = ..., file_name: _Optional[str] = ..., media_type: _Optional[str] = ..., collection: _Optional[str] = ..., source: _Optional[str] = ..., title: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., metadata: _Optional[_Mapping[str, str]] = ..., password: _Optional[str] = ..., chunking: _Optional[_Union[ChunkingOptions, _Mapping]] = ...) -> None: ...

class UploadDocumentRequest(_message.Message):
    __slots__ = ("header", "data")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    header: DocumentSpec
    data: bytes
    def __init__(self, header: _Optional[_Union[DocumentSpec, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadDocumentResponse(_message.Message):
    __slots__ = ("document", "unchanged", "consistency_token")
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    document: Document
    unchanged: bool
    consistency_token: str
    def __init__(self, document: _Optional[_Union[Document, _Mapping]] = ..., unchanged: _Optional[bool] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class InlineDocument(_message.Message):
    __slots__ = ("spec", "content")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    spec: DocumentSpec
    content: bytes
    def __init__(self, spec: _Optional[_Union[DocumentSpec, _Mapping]] = ..., content: _Optional[bytes] = ...) -> None: ...

class IngestDocumentsRequest(_message.Message):
    __slots__ = ("documents", "progress_detail")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_DETAIL_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[InlineDocument]
    progress_detail: ProgressDetail
    def __init__(self, documents: _Optional[_Iterable[_Union[InlineDocument, _Mapping]]] = ..., progress_detail: _Optional[_Union[ProgressDetail, str]] = ...) -> None: ...

class DocumentProgress(_message.Message):
    __slots__ = ("index", "document_id", "stage", "state", "chunk_count", "chunks_embedded", "error_message", "unchanged", "error_code", "status")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_ID_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_EMBEDDED_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    index: int
    document_id: str
    stage: IngestStage
    state: DocumentState
    chunk_count: int
    chunks_embedded: int
    error_message: str
    unchanged: bool
    error_code: str
    status: _status_pb2.Status
    def __init__(self, index: _Optional[int] = ..., document_id: _Optional[str] = ..., stage: _Optional[_Union[IngestStage, str]] = ..., state: _Optional[_Union[DocumentState, str]] = ..., chunk_count: _Optional[int] = ..., chunks_embedded: _Optional[int] = ..., error_message: _Optional[str] = ..., unchanged: _Optional[bool] = ..., error_code: _Optional[str] = ..., status: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

class IngestSummary(_message.Message):
    __slots__ = ("succeeded", "failed", "unchanged", "chunks_written", "elapsed_seconds", "consistency_token")
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    succeeded: int
    failed: int
    unchanged: int
    chunks_written: int
    elapsed_seconds: float
    consistency_token: str
    def __init__(self, succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., unchanged: _Optional[int] = ..., chunks_written: _Optional[int] = ..., elapsed_seconds: _Optional[float] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class IngestDocumentsResponse(_message.Message):
    __slots__ = ("job_id", "progress", "summary")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    progress: DocumentProgress
    summary: IngestSummary
    def __init__(self, job_id: _Optional[str] = ..., progress: _Optional[_Union[DocumentProgress, _Mapping]] = ..., summary: _Optional[_Union[IngestSummary, _Mapping]] = ...) -> None: ...

class GetDocumentRequest(_message.Message):
    __slots__ = ("document_id",)
    DOCUMENT_ID_FIELD_NUMBER: _ClassVar[int]
    document_id: str
    def __init__(self, document_id: _Optional[str] = ...) -> None: ...

class GetDocumentResponse(_message.Message):
    __slots__ = ("document", "consistency_token")
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    document: Document
    consistency_token: str
    def __init__(self, document: _Optional[_Union[Document, _Mapping]] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class ListDocumentsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "state", "source", "collection")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    state: DocumentState
    source: str
    collection: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., state: _Optional[_Union[DocumentState, str]] = ..., source: _Optional[str] = ..., collection: _Optional[str] = ...) -> None: ...

class ListDocumentsResponse(_message.Message):
    __slots__ = ("documents", "next_page_token")
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    documents: _containers.RepeatedCompositeFieldContainer[Document]
    next_page_token: str
    def __init__(self, documents: _Optional[_Iterable[_Union[Document, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateDocumentRequest(_message.Message):
    __slots__ = ("document", "update_mask")
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    document: Document
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, document: _Optional[_Union[Document, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class UpdateDocumentResponse(_message.Message):
    __slots__ = ("document", "consistency_token")
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    document: Document
    consistency_token: str
    def __init__(self, document: _Optional[_Union[Document, _Mapping]] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class DeleteDocumentRequest(_message.Message):
    __slots__ = ("document_id",)
    DOCUMENT_ID_FIELD_NUMBER: _ClassVar[int]
    document_id: str
    def __init__(self, document_id: _Optional[str] = ...) -> None: ...

class DeleteDocumentResponse(_message.Message):
    __slots__ = ("chunks_deleted", "consistency_token")
    CHUNKS_DELETED_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    chunks_deleted: int
    consistency_token: str
    def __init__(self, chunks_deleted: _Optional[int] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class GetIngestJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetIngestJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: IngestJob
    def __init__(self, job: _Optional[_Union[IngestJob, _Mapping]] = ...) -> None: ...

class IngestJob(_message.Message):
    __slots__ = ("job_id", "done", "documents", "summary", "create_time", "update_time")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    done: bool
    documents: _containers.RepeatedCompositeFieldContainer[DocumentProgress]
    summary: IngestSummary
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., done: _Optional[bool] = ..., documents: _Optional[_Iterable[_Union[DocumentProgress, _Mapping]]] = ..., summary: _Optional[_Union[IngestSummary, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
