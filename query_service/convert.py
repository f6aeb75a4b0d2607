"""Protobuf <-> domain conversion for the query service."""

from __future__ import annotations

from query_service.answering import AnswerFinished, AskQuery, CitationFound
from query_service.context import ContextSource
from query_service.generation.base import ChatMessage
from query_service.retrieval_types import RetrievalQuery, RetrievalResult
from ragrpc import errors
from ragrpc.models import ScoredChunk
from ragrpc.store.request_filter import MetadataCondition
from ragrpc.v1 import common_pb2, retrieve_pb2

_SCORE_KINDS: dict[str, int] = {
    "cosine": common_pb2.SCORE_KIND_COSINE,
    "bm25": common_pb2.SCORE_KIND_BM25,
    "rrf": common_pb2.SCORE_KIND_RRF,
    "weighted": common_pb2.SCORE_KIND_WEIGHTED,
    "rerank": common_pb2.SCORE_KIND_RERANK,
}
_MODES = {
    retrieve_pb2.RETRIEVAL_MODE_UNSPECIFIED: "hybrid",
    retrieve_pb2.RETRIEVAL_MODE_HYBRID: "hybrid",
    retrieve_pb2.RETRIEVAL_MODE_DENSE: "dense",
    retrieve_pb2.RETRIEVAL_MODE_SPARSE: "sparse",
}
_FUSIONS = {
    retrieve_pb2.FUSION_METHOD_UNSPECIFIED: "rrf",
    retrieve_pb2.FUSION_METHOD_RRF: "rrf",
    retrieve_pb2.FUSION_METHOD_WEIGHTED: "weighted",
}
_FINISH: dict[str, int] = {
    "stop": retrieve_pb2.FINISH_REASON_STOP,
    "length": retrieve_pb2.FINISH_REASON_LENGTH,
    "no_sources": retrieve_pb2.FINISH_REASON_NO_SOURCES,
}
_ROLES = {retrieve_pb2.ConversationTurn.ROLE_USER: "user", retrieve_pb2.ConversationTurn.ROLE_ASSISTANT: "assistant"}


def retrieval_query(
    query: str,
    options: retrieve_pb2.RetrievalOptions,
    tenant: str,
    *,
    default_top_k: int,
    default_candidates: int,
    default_rrf_k: int = 20,
    default_weights: tuple[float, float] = (0.5, 0.5),
) -> RetrievalQuery:
    """Converts without judging values; `RetrievalLimits.check` validates afterwards."""
    if options.mode not in _MODES:
        raise errors.InvalidInputError(f"unknown retrieval mode {options.mode}", field="options.mode")
    if options.fusion not in _FUSIONS:
        raise errors.InvalidInputError(f"unknown fusion method {options.fusion}", field="options.fusion")
    flt = options.filter
    return RetrievalQuery(
        text=query,
        tenant=tenant,
        top_k=options.top_k or default_top_k,
        mode=_MODES[options.mode],
        fusion=_FUSIONS[options.fusion],
        candidates=options.candidates or default_candidates,
        rrf_k=options.rrf_k or default_rrf_k,
        dense_weight=options.dense_weight if options.HasField("dense_weight") else default_weights[0],
        sparse_weight=options.sparse_weight if options.HasField("sparse_weight") else default_weights[1],
        rerank=options.rerank if options.HasField("rerank") else True,
        mmr_lambda=options.mmr_lambda if options.HasField("mmr_lambda") else None,
        min_score=options.min_score if options.HasField("min_score") else None,
        include_parent=options.include_parent,
        collection=options.collection,
        document_ids=list(flt.document_ids),
        sources=list(flt.sources),
        media_types=list(flt.media_types),
        tags=list(flt.tags),
        time_after=flt.document_time_after.seconds if flt.HasField("document_time_after") else None,
        time_before=flt.document_time_before.seconds if flt.HasField("document_time_before") else None,
        metadata=metadata_conditions(flt),
    )


# The deprecated MetadataFilter fields of the filings enricher's facts: field -> the metadata key it names.
DEPRECATED_METADATA_FIELDS = (
    ("organizations", "organization"),
    ("tickers", "ticker"),
    ("document_types", "document_type"),
    ("fiscal_periods", "fiscal_period"),
)


def metadata_conditions(flt: retrieve_pb2.MetadataFilter) -> list[MetadataCondition]:
    """The request's metadata conditions: `metadata[key]`, and the deprecated fields as aliases of their keys."""
    conditions = [
        MetadataCondition(key, tuple(entry.values), request_field=f"options.filter.metadata[{key}]")
        for key, entry in sorted(flt.metadata.items())
    ]
    for name, key in DEPRECATED_METADATA_FIELDS:
        if values := tuple(getattr(flt, name)):
            conditions.append(
                MetadataCondition(key, values, request_field=f"options.filter.{name}", deprecated_alias=True)
            )
    for condition in conditions:
        if not condition.values:
            raise errors.InvalidInputError(
                f"metadata key {condition.key!r} needs at least one value", field=condition.field_path
            )
    return conditions


def ask_query(request: retrieve_pb2.AskRequest, retrieval: RetrievalQuery) -> AskQuery:
    history = []
    for index, turn in enumerate(request.history):
        if turn.role not in _ROLES:
            raise errors.InvalidInputError(
                "each history turn needs role USER or ASSISTANT", field=f"history[{index}].role"
            )
        history.append(ChatMessage(_ROLES[turn.role], turn.content))  # type: ignore[arg-type]
    if request.max_answer_tokens < 0 or request.token_budget < 0:
        raise errors.InvalidInputError("token limits cannot be negative", field="token_budget")
    return AskQuery(
        retrieval=retrieval,
        template=request.template or "default",
        history=history,
        max_answer_tokens=request.max_answer_tokens,
        token_budget=request.token_budget,
        temperature=request.temperature if request.HasField("temperature") else None,
    )


def scored_chunk_to_pb(hit: ScoredChunk, rank: int, score_kind: str) -> common_pb2.ScoredChunk:
    c = hit.chunk
    chunk = common_pb2.Chunk(
        chunk_id=c.chunk_id,
        document_id=c.document_id,
        collection=c.collection,
        text=c.text,
        source=c.source,
        title=c.title,
        media_type=c.media_type,
        page_start=c.page_start,
        page_end=c.page_end,
        section_path=list(c.section_path),
        chunk_index=c.chunk_index,
        chunker=c.chunker,
        parent_id=c.parent_id,
        parent_text=c.parent_text,
        tags=list(c.tags),
        metadata={str(k): str(v) for k, v in c.metadata.items()},
    )
    stage = common_pb2.StageScores()
    for name in ("dense", "sparse", "fused", "rerank"):
        value = getattr(hit.scores, name)
        if value is not None:
            setattr(stage, name, float(value))
    return common_pb2.ScoredChunk(
        chunk=chunk,
        rank=rank,
        score=float(hit.score),
        score_kind=_SCORE_KINDS.get(score_kind, 0),  # type: ignore[arg-type]
        stage_scores=stage,
    )


def source_to_pb(source: ContextSource, score_kind: str) -> common_pb2.ScoredChunk:
    """A context source as a ScoredChunk whose rank is the source number and whose text is
    the text given to the model (merged or compressed)."""
    pb = scored_chunk_to_pb(source.hit, source.number, score_kind)
    pb.chunk.text = source.text
    return pb


def summary_to_pb(result: RetrievalResult) -> retrieve_pb2.RetrievalSummary:
    return retrieve_pb2.RetrievalSummary(
        timings=[common_pb2.StageTiming(stage=n, millis=ms) for n, ms in result.timings],
        returned=len(result.hits),
        dense_candidates=result.dense_candidates,
        sparse_candidates=result.sparse_candidates,
        reranked=result.reranked,
        rerank_skipped_reason=result.rerank_skipped_reason,
        sparse_backend=result.sparse_backend,
    )


def citation_to_pb(event: CitationFound) -> retrieve_pb2.Citation:
    return retrieve_pb2.Citation(
        source_number=event.source.number,
        document_id=event.source.hit.chunk.document_id,
        chunk_id=event.source.hit.chunk.chunk_id,
        title=event.source.title,
        answer_start=event.answer_start,
        answer_end=event.answer_end,
    )


def final_to_pb(event: AnswerFinished) -> retrieve_pb2.AskFinal:
    return retrieve_pb2.AskFinal(
        finish_reason=_FINISH.get(event.finish_reason, 0),  # type: ignore[arg-type]
        model=event.model,  # type: ignore[arg-type]
        usage=retrieve_pb2.TokenUsage(prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens),
        timings=[common_pb2.StageTiming(stage=n, millis=ms) for n, ms in event.timings],
        answer=event.answer,
        retrieval=summary_to_pb(event.retrieval),
    )
