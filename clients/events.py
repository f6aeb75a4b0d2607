"""Typed events of the client streams and the state they accumulate.

The dataclasses are what the clients yield; `to_dict()` gives a JSON-ready form that other
services can relay (see clients/examples/sse_relay.py). The `*Results` classes collect what
a stream has delivered so far; the sync and async stream wrappers share them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from google.protobuf import json_format

from ragrpc.v1 import common_pb2


@dataclass(frozen=True)
class RetrievalSummary:
    """Per-stage information of a retrieval (RetrievalSummary)."""

    timings: Mapping[str, float] = field(default_factory=dict)
    returned: int = 0
    dense_candidates: int = 0
    sparse_candidates: int = 0
    reranked: bool = False
    rerank_skipped_reason: str = ""
    sparse_backend: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["timings"] = dict(self.timings)
        return data


@dataclass(frozen=True)
class Hit:
    """A ranked chunk. `score_kind` says what `score` means ("rrf", "cosine", "bm25", ...)."""

    rank: int
    score: float
    score_kind: str
    chunk: common_pb2.Chunk
    stage_scores: Mapping[str, float] = field(default_factory=dict)

    @property
    def document_id(self) -> str:
        return self.chunk.document_id

    @property
    def chunk_id(self) -> str:
        return self.chunk.chunk_id

    @property
    def title(self) -> str:
        return self.chunk.title

    @property
    def text(self) -> str:
        return self.chunk.text

    def to_dict(self) -> dict[str, Any]:
        chunk = json_format.MessageToDict(
            self.chunk, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
        return {
            "rank": self.rank,
            "score": self.score,
            "score_kind": self.score_kind,
            "stage_scores": dict(self.stage_scores),
            "chunk": chunk,
        }


@dataclass(frozen=True)
class Source:
    """Ask: a ranked chunk given to the model; `number` is what citations refer to."""

    kind: ClassVar[str] = "source"
    number: int
    hit: Hit

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, **self.hit.to_dict()}


@dataclass(frozen=True)
class Token:
    """Ask: text to append to the answer."""

    kind: ClassVar[str] = "token"
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text}


@dataclass(frozen=True)
class Retraction:
    """Ask: the answer so far is void; another generator starts over."""

    kind: ClassVar[str] = "retraction"
    model: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "reason": self.reason}


@dataclass(frozen=True)
class Citation:
    """Ask: the answer span [answer_start, answer_end) cites source `source_number`."""

    kind: ClassVar[str] = "citation"
    source_number: int
    document_id: str
    chunk_id: str
    title: str
    answer_start: int
    answer_end: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Final:
    """Ask: the last event; `answer` is the complete, authoritative answer."""

    kind: ClassVar[str] = "final"
    finish_reason: str
    model: str
    answer: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    timings: Mapping[str, float] = field(default_factory=dict)
    retrieval: RetrievalSummary = field(default_factory=RetrievalSummary)

    def to_dict(self) -> dict[str, Any]:
        return {
            "finish_reason": self.finish_reason,
            "model": self.model,
            "answer": self.answer,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "timings": dict(self.timings),
            "retrieval": self.retrieval.to_dict(),
        }


AskEvent = Source | Token | Retraction | Citation | Final


@dataclass(frozen=True)
class Progress:
    """IngestDocuments: progress of the document at `index` of the batch."""

    kind: ClassVar[str] = "progress"
    job_id: str
    index: int
    document_id: str
    stage: str
    state: str
    chunk_count: int = 0
    chunks_embedded: int = 0
    error_message: str = ""
    error_code: str = ""
    unchanged: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BatchSummary:
    """IngestDocuments: the last event of a batch."""

    kind: ClassVar[str] = "summary"
    job_id: str
    succeeded: int
    failed: int
    unchanged: int
    chunks_written: int
    elapsed_seconds: float
    consistency_token: str = ""  # read your writes: pass as consistency_token (or use a ReadYourWrites session)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


IngestEvent = Progress | BatchSummary


class RetrieveResults:
    """What a Retrieve stream delivered: the hits so far and, once exhausted, the summary."""

    def __init__(self) -> None:
        self.hits: list[Hit] = []
        self.summary: RetrievalSummary | None = None

    def accept(self, item: Hit | RetrievalSummary) -> Hit | None:
        """Records an item; returns it when it is a hit (to be yielded), else None."""
        if isinstance(item, RetrievalSummary):
            self.summary = item
            return None
        self.hits.append(item)
        return item


class AskResults:
    """What an Ask stream delivered. `answer` respects retractions: a retraction clears the
    partial answer, and the final event's answer wins once it arrived."""

    def __init__(self) -> None:
        self.sources: list[Source] = []
        self.citations: list[Citation] = []
        self.retractions: list[Retraction] = []
        self.final: Final | None = None
        self._pieces: list[str] = []

    @property
    def answer(self) -> str:
        if self.final is not None and self.final.answer:
            return self.final.answer
        return "".join(self._pieces)

    def accept(self, event: AskEvent) -> AskEvent:
        if isinstance(event, Source):
            self.sources.append(event)
        elif isinstance(event, Token):
            self._pieces.append(event.text)
        elif isinstance(event, Retraction):
            self.retractions.append(event)
            self._pieces.clear()
        elif isinstance(event, Citation):
            self.citations.append(event)
        elif isinstance(event, Final):
            self.final = event
        return event


class IngestResults:
    """What an IngestDocuments stream delivered: the job id, the last progress of every
    document (by batch index) and, once exhausted, the summary."""

    def __init__(self, on_token: Callable[[str], None] | None = None) -> None:
        self.job_id = ""
        self.documents: dict[int, Progress] = {}
        self.summary: BatchSummary | None = None
        self._on_token = on_token  # a ReadYourWrites session's record

    def accept(self, event: IngestEvent) -> IngestEvent:
        self.job_id = event.job_id or self.job_id
        if isinstance(event, Progress):
            self.documents[event.index] = event
        else:
            self.summary = event
            if self._on_token is not None:
                self._on_token(event.consistency_token)
        return event
