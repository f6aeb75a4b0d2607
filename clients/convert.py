"""Conversion shared by the sync and async clients: Python options -> request protos, and
response protos -> the typed events of clients.events."""

from __future__ import annotations

import datetime as dt
import io
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from google.protobuf import timestamp_pb2
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from clients import events
from ragrpc.v1 import common_pb2, ingest_pb2, retrieve_pb2

RETRIEVAL_OPTION_NAMES = frozenset(
    {
        "top_k",
        "mode",
        "fusion",
        "candidates",
        "rrf_k",
        "dense_weight",
        "sparse_weight",
        "rerank",
        "mmr_lambda",
        "min_score",
        "include_parent",
        "collection",
        "document_ids",
        "sources",
        "media_types",
        "tags",
        "metadata",
        "organizations",  # deprecated: metadata={"organization": ...}
        "tickers",  # deprecated: metadata={"ticker": ...}
        "document_types",  # deprecated: metadata={"document_type": ...}
        "fiscal_periods",  # deprecated: metadata={"fiscal_period": ...}
        "after",
        "before",
    }
)
ASK_OPTION_NAMES = frozenset({"template", "history", "max_answer_tokens", "token_budget", "temperature"})
_OPTIONAL_FLOATS = ("dense_weight", "sparse_weight", "mmr_lambda", "min_score")
_FILTER_LISTS = (
    "document_ids",
    "sources",
    "media_types",
    "tags",
    # deprecated MetadataFilter fields, aliases of metadata keys (organization, ticker, document_type, fiscal_period)
    "organizations",
    "tickers",
    "document_types",
    "fiscal_periods",
)
ChunkingLike = str | Mapping[str, Any] | ingest_pb2.ChunkingOptions | None


def enum_label(enum: EnumTypeWrapper, value: int, prefix: str) -> str:
    """SCORE_KIND_RRF -> "rrf"; unknown values -> their number."""
    try:
        return enum.Name(value).removeprefix(prefix).lower()
    except ValueError:
        return str(value)


def enum_value(enum: EnumTypeWrapper, label: str, prefix: str, what: str) -> Any:
    """ "rrf" -> FUSION_METHOD_RRF; ValueError naming the choices otherwise."""
    name = prefix + label.strip().upper().replace("-", "_")
    if name not in enum.keys():
        choices = [n.removeprefix(prefix).lower() for n in enum.keys() if not n.endswith("UNSPECIFIED")]
        raise ValueError(f"unknown {what} {label!r}; choose one of {', '.join(choices)}")
    return enum.Value(name)


def timestamp(value: dt.datetime) -> timestamp_pb2.Timestamp:
    """A Timestamp; naive datetimes are taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(value)
    return stamp


def metadata_values(metadata: Mapping[str, str | Iterable[str]] | None) -> dict[str, retrieve_pb2.MetadataValues]:
    """MetadataFilter.metadata from {key: value or values}: {"department": ["sales", "legal"], "language": "de"}
    (a chunk matches when its value of every key given is one of that key's values)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise TypeError("metadata must map each key to a value or a list of values")
    return {
        str(key): retrieve_pb2.MetadataValues(values=[values] if isinstance(values, str) else list(values))
        for key, values in metadata.items()
    }


def parse_where(conditions: Iterable[str]) -> dict[str, list[str]]:
    """{key: values} from "key=value" conditions (the CLI's --where); a key given twice takes either value
    (its values are OR'ed, as the keys are AND'ed). ValueError for a condition without "=" or a key."""
    found: dict[str, list[str]] = {}
    for condition in conditions:
        key, sep, value = condition.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--where needs KEY=VALUE, got {condition!r}")
        values = found.setdefault(key.strip(), [])
        if value not in values:
            values.append(value)
    return found


def _metadata_filter(options: Mapping[str, Any]) -> retrieve_pb2.MetadataFilter:
    flt = retrieve_pb2.MetadataFilter()
    for name in _FILTER_LISTS:
        values = options.get(name) or ()
        getattr(flt, name).extend([values] if isinstance(values, str) else values)
    for key, entry in metadata_values(options.get("metadata")).items():
        flt.metadata[key].CopyFrom(entry)
    if options.get("after") is not None:
        flt.document_time_after.CopyFrom(timestamp(options["after"]))
    if options.get("before") is not None:
        flt.document_time_before.CopyFrom(timestamp(options["before"]))
    return flt


def retrieval_options(**options: Any) -> retrieve_pb2.RetrievalOptions:
    """RetrievalOptions from keyword options (see RETRIEVAL_OPTION_NAMES); None means unset."""
    unknown = set(options) - RETRIEVAL_OPTION_NAMES
    if unknown:
        raise TypeError(f"unknown retrieval options: {', '.join(sorted(unknown))}")
    pb = retrieve_pb2.RetrievalOptions(
        top_k=options.get("top_k") or 0,
        candidates=options.get("candidates") or 0,
        rrf_k=options.get("rrf_k") or 0,
        include_parent=bool(options.get("include_parent")),
        collection=options.get("collection") or "",
        filter=_metadata_filter(options),
    )
    if options.get("mode"):
        pb.mode = enum_value(retrieve_pb2.RetrievalMode, options["mode"], "RETRIEVAL_MODE_", "mode")
    if options.get("fusion"):
        pb.fusion = enum_value(retrieve_pb2.FusionMethod, options["fusion"], "FUSION_METHOD_", "fusion")
    for name in _OPTIONAL_FLOATS:
        if options.get(name) is not None:
            setattr(pb, name, float(options[name]))
    if options.get("rerank") is not None:
        pb.rerank = bool(options["rerank"])
    return pb


def retrieve_request(query: str, *, consistency_token: str = "", **options: Any) -> retrieve_pb2.RetrieveRequest:
    return retrieve_pb2.RetrieveRequest(
        query=query, options=retrieval_options(**options), consistency_token=consistency_token
    )


def _history_turn(turn: Any) -> retrieve_pb2.ConversationTurn:
    if isinstance(turn, retrieve_pb2.ConversationTurn):
        return turn
    role, content = (turn["role"], turn["content"]) if isinstance(turn, Mapping) else turn
    role_value = enum_value(retrieve_pb2.ConversationTurn.Role, role, "ROLE_", "history role")
    return retrieve_pb2.ConversationTurn(role=role_value, content=content)  # type: ignore[arg-type]


def ask_request(query: str, *, consistency_token: str = "", **options: Any) -> retrieve_pb2.AskRequest:
    """AskRequest from retrieval options plus template, history ((role, content) pairs or
    {"role", "content"} dicts), max_answer_tokens, token_budget and temperature."""
    ask = {k: options.pop(k) for k in list(options) if k in ASK_OPTION_NAMES}
    request = retrieve_pb2.AskRequest(
        query=query,
        consistency_token=consistency_token,
        options=retrieval_options(**options),
        template=ask.get("template") or "",
        history=[_history_turn(t) for t in ask.get("history") or ()],
        max_answer_tokens=ask.get("max_answer_tokens") or 0,
        token_budget=ask.get("token_budget") or 0,
    )
    if ask.get("temperature") is not None:
        request.temperature = float(ask["temperature"])
    return request


def chunking_options(chunking: ChunkingLike) -> ingest_pb2.ChunkingOptions | None:
    """From a strategy name ("fixed_tokens"), a dict of ChunkingOptions fields, or the proto."""
    if chunking is None or isinstance(chunking, ingest_pb2.ChunkingOptions):
        return chunking
    values = {"strategy": chunking} if isinstance(chunking, str) else dict(chunking)
    strategy = values.get("strategy") or "auto"
    return ingest_pb2.ChunkingOptions(
        strategy=enum_value(ingest_pb2.ChunkingStrategy, str(strategy), "CHUNKING_STRATEGY_", "chunking strategy"),
        chunk_size_tokens=int(values.get("chunk_size_tokens") or 0),
        chunk_overlap_tokens=int(values.get("chunk_overlap_tokens") or 0),
    )


@dataclass(frozen=True)
class NewDocument:
    """A document to ingest inline (IngestDocuments); `content` may be text (UTF-8)."""

    content: bytes | str
    file_name: str = ""
    media_type: str = ""
    collection: str = ""
    document_id: str = ""
    source: str = ""
    title: str = ""
    tags: tuple[str, ...] = ()
    metadata: Mapping[str, str] = field(default_factory=dict)
    password: str = ""
    chunking: ChunkingLike = None

    def spec(self) -> ingest_pb2.DocumentSpec:
        return document_spec(
            file_name=self.file_name,
            media_type=self.media_type,
            collection=self.collection,
            document_id=self.document_id,
            source=self.source,
            title=self.title,
            tags=self.tags,
            metadata=self.metadata,
            password=self.password,
            chunking=self.chunking,
        )

    def to_pb(self) -> ingest_pb2.InlineDocument:
        content = self.content.encode("utf-8") if isinstance(self.content, str) else bytes(self.content)
        return ingest_pb2.InlineDocument(spec=self.spec(), content=content)


def document_spec(
    *,
    file_name: str = "",
    media_type: str = "",
    collection: str = "",
    document_id: str = "",
    source: str = "",
    title: str = "",
    tags: Iterable[str] = (),
    metadata: Mapping[str, str] | None = None,
    password: str = "",
    chunking: ChunkingLike = None,
) -> ingest_pb2.DocumentSpec:
    spec = ingest_pb2.DocumentSpec(
        document_id=document_id,
        file_name=file_name,
        media_type=media_type,
        collection=collection,
        source=source,
        title=title,
        tags=list(tags),
        metadata=dict(metadata or {}),
        password=password,
    )
    options = chunking_options(chunking)
    if options is not None:
        spec.chunking.CopyFrom(options)
    return spec


def inline_document(
    document: NewDocument | ingest_pb2.InlineDocument | Mapping[str, Any],
) -> ingest_pb2.InlineDocument:
    """Accepts a NewDocument, the proto, or a dict of NewDocument fields."""
    if isinstance(document, ingest_pb2.InlineDocument):
        return document
    if isinstance(document, Mapping):
        document = NewDocument(**document)
    return document.to_pb()


def upload_requests(
    spec: ingest_pb2.DocumentSpec,
    reader: BinaryIO,
    chunk_bytes: int,
    on_bytes: Callable[[int], None] | None = None,
) -> Iterator[ingest_pb2.UploadDocumentRequest]:
    """The UploadDocument stream: the header, then pieces of at most `chunk_bytes`."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    yield ingest_pb2.UploadDocumentRequest(header=spec)
    while piece := reader.read(chunk_bytes):
        yield ingest_pb2.UploadDocumentRequest(data=piece)
        if on_bytes is not None:
            on_bytes(len(piece))


def _stage_scores(scores: common_pb2.StageScores) -> dict[str, float]:
    names = ("dense", "sparse", "fused", "rerank")
    return {name: getattr(scores, name) for name in names if scores.HasField(name)}


def hit_from_pb(scored: common_pb2.ScoredChunk) -> events.Hit:
    return events.Hit(
        rank=scored.rank,
        score=scored.score,
        score_kind=enum_label(common_pb2.ScoreKind, scored.score_kind, "SCORE_KIND_"),
        chunk=scored.chunk,
        stage_scores=_stage_scores(scored.stage_scores),
    )


def timings_from_pb(timings: Iterable[common_pb2.StageTiming]) -> dict[str, float]:
    return {t.stage: t.millis for t in timings}


def summary_from_pb(summary: retrieve_pb2.RetrievalSummary) -> events.RetrievalSummary:
    return events.RetrievalSummary(
        timings=timings_from_pb(summary.timings),
        returned=summary.returned,
        dense_candidates=summary.dense_candidates,
        sparse_candidates=summary.sparse_candidates,
        reranked=summary.reranked,
        rerank_skipped_reason=summary.rerank_skipped_reason,
        sparse_backend=summary.sparse_backend,
    )


def retrieve_item(message: retrieve_pb2.RetrieveResponse) -> events.Hit | events.RetrievalSummary:
    if message.HasField("summary"):
        return summary_from_pb(message.summary)
    return hit_from_pb(message.chunk)


def _final_from_pb(final: retrieve_pb2.AskFinal) -> events.Final:
    return events.Final(
        finish_reason=enum_label(retrieve_pb2.FinishReason, final.finish_reason, "FINISH_REASON_"),
        model=final.model,
        answer=final.answer,
        prompt_tokens=final.usage.prompt_tokens,
        completion_tokens=final.usage.completion_tokens,
        timings=timings_from_pb(final.timings),
        retrieval=summary_from_pb(final.retrieval),
    )


def ask_event(message: retrieve_pb2.AskResponse) -> events.AskEvent:
    which = message.WhichOneof("event")
    if which == "source":
        return events.Source(number=message.source.rank, hit=hit_from_pb(message.source))
    if which == "token":
        return events.Token(text=message.token.text)
    if which == "retraction":
        return events.Retraction(model=message.retraction.model, reason=message.retraction.reason)
    if which == "citation":
        c = message.citation
        return events.Citation(
            source_number=c.source_number,
            document_id=c.document_id,
            chunk_id=c.chunk_id,
            title=c.title,
            answer_start=c.answer_start,
            answer_end=c.answer_end,
        )
    if which == "final":
        return _final_from_pb(message.final)
    raise ValueError(f"unexpected Ask event {which!r}")


def progress_from_pb(job_id: str, progress: ingest_pb2.DocumentProgress) -> events.Progress:
    return events.Progress(
        job_id=job_id,
        index=progress.index,
        document_id=progress.document_id,
        stage=enum_label(ingest_pb2.IngestStage, progress.stage, "INGEST_STAGE_"),
        state=enum_label(ingest_pb2.DocumentState, progress.state, "DOCUMENT_STATE_"),
        chunk_count=progress.chunk_count,
        chunks_embedded=progress.chunks_embedded,
        error_message=progress.error_message,
        error_code=progress.error_code,
        unchanged=progress.unchanged,
    )


def ingest_event(message: ingest_pb2.IngestDocumentsResponse) -> events.IngestEvent:
    if message.HasField("summary"):
        s = message.summary
        return events.BatchSummary(
            job_id=message.job_id,
            succeeded=s.succeeded,
            failed=s.failed,
            unchanged=s.unchanged,
            chunks_written=s.chunks_written,
            elapsed_seconds=s.elapsed_seconds,
            consistency_token=s.consistency_token,
        )
    return progress_from_pb(message.job_id, message.progress)


def update_request(
    document_id: str, *, title: str | None, tags: Iterable[str] | None, metadata: Mapping[str, str] | None
) -> ingest_pb2.UpdateDocumentRequest:
    """UpdateDocumentRequest whose mask names exactly the fields given (not None)."""
    request = ingest_pb2.UpdateDocumentRequest(document=ingest_pb2.Document(document_id=document_id))
    if title is not None:
        request.document.title = title
        request.update_mask.paths.append("title")
    if tags is not None:
        request.document.tags.extend(tags)
        request.update_mask.paths.append("tags")
    if metadata is not None:
        request.document.metadata.update(metadata)
        request.update_mask.paths.append("metadata")
    return request


def list_request(
    *, page_size: int = 0, page_token: str = "", state: str | None = None, source: str = "", collection: str = ""
) -> ingest_pb2.ListDocumentsRequest:
    request = ingest_pb2.ListDocumentsRequest(
        page_size=page_size, page_token=page_token, source=source, collection=collection
    )
    if state:
        request.state = enum_value(ingest_pb2.DocumentState, state, "DOCUMENT_STATE_", "document state")
    return request


def state_label(state: int) -> str:
    return enum_label(ingest_pb2.DocumentState, state, "DOCUMENT_STATE_")


def open_upload_source(source: str | os.PathLike[str] | bytes | bytearray | memoryview) -> BinaryIO:
    """A binary reader over the bytes or the file to upload (opened now, so a missing file
    fails before the call starts)."""
    if isinstance(source, bytes | bytearray | memoryview):
        return io.BytesIO(bytes(source))
    return open(source, "rb")  # noqa: SIM115 - the caller closes it


def default_file_name(source: object) -> str:
    """The file name of a path source; "" for bytes."""
    if isinstance(source, str | os.PathLike):
        return os.path.basename(os.fspath(source))
    return ""
