from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCORE_KIND_UNSPECIFIED: _ClassVar[ScoreKind]
    SCORE_KIND_COSINE: _ClassVar[ScoreKind]
    SCORE_KIND_BM25: _ClassVar[ScoreKind]
    SCORE_KIND_RRF: _ClassVar[ScoreKind]
    SCORE_KIND_WEIGHTED: _ClassVar[ScoreKind]
    SCORE_KIND_RERANK: _ClassVar[ScoreKind]
SCORE_KIND_UNSPECIFIED: ScoreKind
SCORE_KIND_COSINE: ScoreKind
SCORE_KIND_BM25: ScoreKind
SCORE_KIND_RRF: ScoreKind
SCORE_KIND_WEIGHTED: ScoreKind
SCORE_KIND_RERANK: ScoreKind

class Chunk(_message.Message):
    __slots__ = ("chunk_id", "document_id", "collection", "text", "source", "title", "media_type", "page_start", "page_end", "section_path", "chunk_index", "chunker", "parent_id", "parent_text", "tags", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_ID_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAGE_START_FIELD_NUMBER: _ClassVar[int]
    PAGE_END_FIELD_NUMBER: _ClassVar[int]
    SECTION_PATH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_INDEX_FIELD_NUMBER: _ClassVar[int]
    CHUNKER_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_TEXT_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    chunk_id: str
    document_id: str
    collection: str
    text: str
    source: str
    title: str
    media_type: str
    page_start: int
    page_end: int
    section_path: _containers.RepeatedScalarFieldContainer[str]
    chunk_index: int
    chunker: str
    parent_id: str
    parent_text: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, chunk_id: _Optional[str] = ..., document_id: _Optional[str] = ..., collection: _Optional[str] = ..., text: _Optional[str] = ..., source: _Optional[str] = ..., title: _Optional[str] = ..., media_type: _Optional[str] = ..., page_start: _Optional[int] = ..., page_end: _Optional[int] = ..., section_path: _Optional[_Iterable[str]] = ..., chunk_index: _Optional[int] = ..., chunker: _Optional[str] = ..., parent_id: _Optional[str] = ..., parent_text: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class StageScores(_message.Message):
    __slots__ = ("dense", "sparse", "fused", "rerank")
    DENSE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    FUSED_FIELD_NUMBER: _ClassVar[int]
    RERANK_FIELD_NUMBER: _ClassVar[int]
    dense: float
    sparse: float
    fused: float
    rerank: float
    def __init__(self, dense: _Optional[float] = ..., sparse: _Optional[float] = ..., fused: _Optional[float] = ..., rerank: _Optional[float] = ...) -> None: ...

class ScoredChunk(_message.Message):
    __slots__ = ("chunk", "rank", "score", "score_kind", "stage_scores")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    SCORE_KIND_FIELD_NUMBER: _ClassVar[int]
    STAGE_SCORES_FIELD_NUMBER: _ClassVar[int]
    chunk: Chunk
    rank: int
    score: float
    score_kind: ScoreKind
    stage_scores: StageScores
    def __init__(self, chunk: _Optional[_Union[Chunk, _Mapping]] = ..., rank: _Optional[int] = ..., score: _Optional[float] = ..., score_kind: _Optional[_Union[ScoreKind, str]] = ..., stage_scores: _Optional[_Union[StageScores, _Mapping]] = ...) -> None: ...

class StageTiming(_message.Message):
    __slots__ = ("stage", "millis")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MILLIS_FIELD_NUMBER: _ClassVar[int]
    stage: str
    millis: float
    def __init__(self, stage: _Optional[str] = ..., millis: _Optional[float] = ...) -> None: ...
