"""RetrieveService servicer: protobuf in, one domain call, protobuf out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import grpc

from query_service import convert
from query_service.answering import AnswerFinished, AnswerService, CitationFound, SourcesReady
from query_service.generation.base import RetractionEvent, TokenEvent
from query_service.retrieval import RetrievalPipeline
from query_service.retrieval_types import RetrievalQuery
from ragrpc import errors
from ragrpc.consistency import ConsistencyToken
from ragrpc.request_context import current_tenant
from ragrpc.v1 import retrieve_pb2, retrieve_pb2_grpc


@dataclass(frozen=True)
class RetrievalLimits:
    max_query_chars: int = 4096
    max_top_k: int = 100
    max_candidates: int = 1000
    default_candidates: int = 100
    default_rrf_k: int = 20
    default_weights: tuple[float, float] = (0.5, 0.5)  # dense, sparse

    def check(self, query: RetrievalQuery) -> None:
        if not query.text.strip():
            raise errors.InvalidInputError("query must not be empty", field="query")
        if len(query.text) > self.max_query_chars:
            raise errors.InvalidInputError(
                f"query is {len(query.text)} characters; the limit is {self.max_query_chars} (RAGRPC_MAX_QUERY_CHARS)",
                field="query",
                reason="QUERY_TOO_LONG",
            )
        if not 1 <= query.top_k <= self.max_top_k:
            raise errors.InvalidInputError(
                f"top_k must be between 1 and {self.max_top_k} (RAGRPC_MAX_TOP_K)", field="options.top_k"
            )
        if not query.top_k <= query.candidates <= self.max_candidates:
            raise errors.InvalidInputError(
                f"candidates must be between top_k and {self.max_candidates} (RAGRPC_MAX_CANDIDATES)",
                field="options.candidates",
            )
        if query.rrf_k < 1:
            raise errors.InvalidInputError("rrf_k must be positive", field="options.rrf_k")
        if query.dense_weight < 0 or query.sparse_weight < 0 or query.dense_weight + query.sparse_weight <= 0:
            raise errors.InvalidInputError("fusion weights must be >= 0 and not both 0", field="options.dense_weight")
        if query.mmr_lambda is not None and not 0.0 <= query.mmr_lambda <= 1.0:
            raise errors.InvalidInputError("mmr_lambda must be between 0 and 1", field="options.mmr_lambda")


class RetrieveServicer(retrieve_pb2_grpc.RetrieveServiceServicer):
    def __init__(self, *, retrieval: RetrievalPipeline, answers: AnswerService, limits: RetrievalLimits) -> None:
        self._retrieval = retrieval
        self._answers = answers
        self._limits = limits

    def _query(
        self, text: str, options: retrieve_pb2.RetrievalOptions, default_top_k: int, consistency_token: str = ""
    ) -> RetrievalQuery:
        query = convert.retrieval_query(
            text,
            options,
            current_tenant(),
            default_top_k=default_top_k,
            default_candidates=self._limits.default_candidates,
            default_rrf_k=self._limits.default_rrf_k,
            default_weights=self._limits.default_weights,
        )
        self._limits.check(query)
        if consistency_token:
            query.consistency = ConsistencyToken.decode(consistency_token)
        return query

    async def Retrieve(
        self, request: retrieve_pb2.RetrieveRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[retrieve_pb2.RetrieveResponse]:
        result = await self._retrieval.retrieve(
            self._query(request.query, request.options, 10, request.consistency_token)
        )
        for rank, hit in enumerate(result.hits, start=1):
            yield retrieve_pb2.RetrieveResponse(chunk=convert.scored_chunk_to_pb(hit, rank, result.score_kind))
        yield retrieve_pb2.RetrieveResponse(summary=convert.summary_to_pb(result))

    async def Ask(
        self, request: retrieve_pb2.AskRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[retrieve_pb2.AskResponse]:
        query = convert.ask_query(request, self._query(request.query, request.options, 5, request.consistency_token))
        async with aclosing(self._answers.ask(query)) as events:
            async for event in events:
                if isinstance(event, SourcesReady):
                    for source in event.sources:
                        yield retrieve_pb2.AskResponse(source=convert.source_to_pb(source, event.score_kind))
                else:
                    yield _ask_response(event)


def _ask_response(event: object) -> retrieve_pb2.AskResponse:
    if isinstance(event, TokenEvent):
        return retrieve_pb2.AskResponse(token=retrieve_pb2.TokenDelta(text=event.text))
    if isinstance(event, RetractionEvent):
        return retrieve_pb2.AskResponse(retraction=retrieve_pb2.Retraction(model=event.model, reason=event.reason))
    if isinstance(event, CitationFound):
        return retrieve_pb2.AskResponse(citation=convert.citation_to_pb(event))
    if isinstance(event, AnswerFinished):
        return retrieve_pb2.AskResponse(final=convert.final_to_pb(event))
    raise TypeError(f"unexpected event {type(event).__name__}")
