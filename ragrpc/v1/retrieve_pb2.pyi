import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from ragrpc.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RetrievalMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RETRIEVAL_MODE_UNSPECIFIED: _ClassVar[RetrievalMode]
    RETRIEVAL_MODE_HYBRID: _ClassVar[RetrievalMode]
    RETRIEVAL_MODE_DENSE: _ClassVar[RetrievalMode]
    RETRIEVAL_MODE_SPARSE: _ClassVar[RetrievalMode]

class FusionMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FUSION_METHOD_UNSPECIFIED: _ClassVar[FusionMethod]
    FUSION_METHOD_RRF: _ClassVar[FusionMethod]
    FUSION_METHOD_WEIGHTED: _ClassVar[FusionMethod]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_NO_SOURCES: _ClassVar[FinishReason]
RETRIEVAL_MODE_UNSPECIFIED: RetrievalMode
RETRIEVAL_MODE_HYBRID: RetrievalMode
RETRIEVAL_MODE_DENSE: RetrievalMode
RETRIEVAL_MODE_SPARSE: RetrievalMode
FUSION_METHOD_UNSPECIFIED: FusionMethod
FUSION_METHOD_RRF: FusionMethod
FUSION_METHOD_WEIGHTED: FusionMethod
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_NO_SOURCES: FinishReason

class MetadataFilter(_message.Message):
    __slots__ = ("document_ids", "sources", "media_types", "tags", "document_time_after", "document_time_before", "organizations", "document_types", "fiscal_periods", "tickers", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: MetadataValues
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[MetadataValues, _Mapping]] = ...) -> None: ...
    DOCUMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    MEDIA_TYPES_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_TIME_AFTER_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_TIME_BEFORE_FIELD_NUMBER: _ClassVar[int]
    ORGANIZATIONS_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_TYPES_FIELD_NUMBER: _ClassVar[int]
    FISCAL_PERIODS_FIELD_NUMBER: _ClassVar[int]
    TICKERS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    document_ids: _containers.RepeatedScalarFieldContainer[str]
    sources: _containers.RepeatedScalarFieldContainer[str]
    media_types: _containers.RepeatedScalarFieldContainer[str]
    tags: _containers.RepeatedScalarFieldContainer[str]
    document_time_after: _timestamp_pb2.Timestamp
    document_time_before: _timestamp_pb2.Timestamp
    organizations: _containers.RepeatedScalarFieldContainer[str]
    document_types: _containers.RepeatedScalarFieldContainer[str]
    fiscal_periods: _containers.RepeatedScalarFieldContainer[str]
    tickers: _containers.RepeatedScalarFieldContainer[str]
    metadata: _containers.MessageMap[str, MetadataValues]
    def __init__(self, document_ids: _Optional[_Iterable[str]] = ..., sources: _Optional[_Iterable[str]] = ..., media_types: _Optional[_Iterable[str]] = ..., tags: _Optional[_Iterable[str]] = ..., document_time_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., document_time_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., organizations: _Optional[_Iterable[str]] = ..., document_types: _Optional[_Iterable[str]] = ..., fiscal_periods: _Optional[_Iterable[str]] = ..., tickers: _Optional[_Iterable[str]] = ..., metadata: _Optional[_Mapping[str, MetadataValues]] = ...) -> None: ...

class MetadataValues(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class RetrievalOptions(_message.Message):
    __slots__ = ("top_k", "mode", "fusion", "candidates", "rrf_k", "dense_weight", "sparse_weight", "rerank", "mmr_lambda", "min_score", "include_parent", "filter", "collection")
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUSION_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    RRF_K_FIELD_NUMBER: _ClassVar[int]
    DENSE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    SPARSE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    RERANK_FIELD_NUMBER: _ClassVar[int]
    MMR_LAMBDA_FIELD_NUMBER: _ClassVar[int]
    MIN_SCORE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PARENT_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    top_k: int
    mode: RetrievalMode
    fusion: FusionMethod
    candidates: int
    rrf_k: int
    dense_weight: float
    sparse_weight: float
    rerank: bool
    mmr_lambda: float
    min_score: float
    include_parent: bool
    filter: MetadataFilter
    collection: str
    def __init__(self, top_k: _Optional[int] = ..., mode: _Optional[_Union[RetrievalMode, str]] = ..., fusion: _Optional[_Union[FusionMethod, str]] = ..., candidates: _Optional[int] = ..., rrf_k: _Optional[int] = ..., dense_weight: _Optional[float] = ..., sparse_weight: _Optional[float] = ..., rerank: _Optional[bool] = ..., mmr_lambda: _Optional[float] = ..., min_score: _Optional[float] = ..., include_parent: _Optional[bool] = ..., filter: _Optional[_Union[MetadataFilter, _Mapping]] = ..., collection: _Optional[str] = ...) -> None: ...

class RetrieveRequest(_message.Message):
    __slots__ = ("query", "options", "consistency_token")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    query: str
    options: RetrievalOptions
    consistency_token: str
    def __init__(self, query: _Optional[str] = ..., options: _Optional[_Union[RetrievalOptions, _Mapping]] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class RetrievalSummary(_message.Message):
    __slots__ = ("timings", "returned", "dense_candidates", "sparse_candidates", "reranked", "rerank_skipped_reason", "sparse_backend")
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    RETURNED_FIELD_NUMBER: _ClassVar[int]
    DENSE_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    SPARSE_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    RERANKED_FIELD_NUMBER: _ClassVar[int]
    RERANK_SKIPPED_REASON_FIELD_NUMBER: _ClassVar[int]
    SPARSE_BACKEND_FIELD_NUMBER: _ClassVar[int]
    timings: _containers.RepeatedCompositeFieldContainer[_common_pb2.StageTiming]
    returned: int
    dense_candidates: int
    sparse_candidates: int
    reranked: bool
    rerank_skipped_reason: str
    sparse_backend: str
    def __init__(self, timings: _Optional[_Iterable[_Union[_common_pb2.StageTiming, _Mapping]]] = ..., returned: _Optional[int] = ..., dense_candidates: _Optional[int] = ..., sparse_candidates: _Optional[int] = ..., reranked: _Optional[bool] = ..., rerank_skipped_reason: _Optional[str] = ..., sparse_backend: _Optional[str] = ...) -> None: ...

class RetrieveResponse(_message.Message):
    __slots__ = ("chunk", "summary")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    chunk: _common_pb2.ScoredChunk
    summary: RetrievalSummary
    def __init__(self, chunk: _Optional[_Union[_common_pb2.ScoredChunk, _Mapping]] = ..., summary: _Optional[_Union[RetrievalSummary, _Mapping]] = ...) -> None: ...

class ConversationTurn(_message.Message):
    __slots__ = ("role", "content")
    class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ROLE_UNSPECIFIED: _ClassVar[ConversationTurn.Role]
        ROLE_USER: _ClassVar[ConversationTurn.Role]
        ROLE_ASSISTANT: _ClassVar[ConversationTurn.Role]
    ROLE_UNSPECIFIED: ConversationTurn.Role
    ROLE_USER: ConversationTurn.Role
    ROLE_ASSISTANT: ConversationTurn.Role
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: ConversationTurn.Role
    content: str
    def __init__(self, role: _Optional[_Union[ConversationTurn.Role, str]] = ..., content: _Optional[str] = ...) -> None: ...

class AskRequest(_message.Message):
    __slots__ = ("query", "options", "template", "history", "max_answer_tokens", "token_budget", "temperature", "consistency_token")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    MAX_ANSWER_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    query: str
    options: RetrievalOptions
    template: str
    history: _containers.RepeatedCompositeFieldContainer[ConversationTurn]
    max_answer_tokens: int
    token_budget: int
    temperature: float
    consistency_token: str
    def __init__(self, query: _Optional[str] = ..., options: _Optional[_Union[RetrievalOptions, _Mapping]] = ..., template: _Optional[str] = ..., history: _Optional[_Iterable[_Union[ConversationTurn, _Mapping]]] = ..., max_answer_tokens: _Optional[int] = ..., token_budget: _Optional[int] = ..., temperature: _Optional[float] = ..., consistency_token: _Optional[str] = ...) -> None: ...

class TokenDelta(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class Retraction(_message.Message):
    __slots__ = ("model", "reason")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    model: str
    reason: str
    def __init__(self, model: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Citation(_message.Message):
    __slots__ = ("source_number", "document_id", "chunk_id", "title", "answer_start", "answer_end")
    SOURCE_NUMBER_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ID_FIELD_NUMBER: _ClassVar[int]
    TITLE_FIELD_NUMBER: _ClassVar[int]
    ANSWER_START_FIELD_NUMBER: _ClassVar[int]
    ANSWER_END_FIELD_NUMBER: _ClassVar[int]
    source_number: int
    document_id: str
    chunk_id: str
    title: str
    answer_start: int
    answer_end: int
    def __init__(self, source_number: _Optional[int] = ..., document_id: _Optional[str] = ..., chunk_id: _Optional[str] = ..., title: _Optional[str] = ..., answer_start: _Optional[int] = ..., answer_end: _Optional[int] = ...) -> None: ...

class TokenUsage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class AskFinal(_message.Message):
    __slots__ = ("finish_reason", "model", "usage", "timings", "answer", "retrieval")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    RETRIEVAL_FIELD_NUMBER: _ClassVar[int]
    finish_reason: FinishReason
    model: str
    usage: TokenUsage
    timings: _containers.RepeatedCompositeFieldContainer[_common_pb2.StageTiming]
    answer: str
    retrieval: RetrievalSummary
    def __init__(self, finish_reason: _Optional[_Union[FinishReason, str]] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[TokenUsage, _Mapping]] = ..., timings: _Optional[_Iterable[_Union[_common_pb2.StageTiming, _Mapping]]] = ..., answer: _Optional[str] = ..., retrieval: _Optional[_Union[RetrievalSummary, _Mapping]] = ...) -> None: ...

class AskResponse(_message.Message):
    __slots__ = ("source", "token", "retraction", "citation", "final")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    RETRACTION_FIELD_NUMBER: _ClassVar[int]
    CITATION_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    source: _common_pb2.ScoredChunk
    token: TokenDelta
    retraction: Retraction
    citation: Citation
    final: AskFinal
    def __init__(self, source: _Optional[_Union[_common_pb2.ScoredChunk, _Mapping]] = ..., token: _Optional[_Union[TokenDelta, _Mapping]] = ..., retraction: _Optional[_Union[Retraction, _Mapping]] = ..., citation: _Optional[_Union[Citation, _Mapping]] = ..., final: _Optional[_Union[AskFinal, _Mapping]] = ...) -> None: ...
