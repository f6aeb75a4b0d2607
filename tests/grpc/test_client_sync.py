"""The blocking clients against the real services (in-process, fake embedder and stores).

The services run on the test's event loop, so every blocking client call runs in a worker
thread (`asyncio.to_thread`)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from clients import (
    AskStream,
    BatchSummary,
    Cancelled,
    Citation,
    Final,
    IngestClient,
    InvalidArgument,
    NewDocument,
    NotFound,
    Progress,
    Retraction,
    RetrieveClient,
    Source,
    Token,
    convert,
)
from ragrpc.config import Settings
from ragrpc.v1 import retrieve_pb2
from tests.support.chat_server import Behaviour, ChatServer

REPO_ROOT = Path(__file__).resolve().parents[2]

MILVUS_MD = """# Milvus vector database

Milvus stores dense embedding vectors and searches them with HNSW indexes. A Milvus collection
holds chunks with their embeddings; hybrid search fuses dense vectors with BM25 keyword scores.

## Consistency

The ingest service writes every chunk of a document before it marks the document active.
"""
BREAD_TXT = (
    "Sourdough bread needs flour, water, salt and a lively starter. Knead the dough, let it rise "
    "overnight, and bake it in a hot oven until the crust is dark brown."
)
PNG_BYTES = b"\x89PNG\r\n\x1a\n" + bytes(range(256))  # a format the server refuses
GARDEN_TXT = (
    "Tomato plants need full sun, regular watering and stakes for support. Prune the suckers and "
    "feed the soil with compost for a better harvest."
)


@contextmanager
def _clients(stack: Any) -> Iterator[tuple[IngestClient, RetrieveClient]]:
    with IngestClient(stack.ingest_address) as ingest, RetrieveClient(stack.query_address) as query:
        yield ingest, query


def _ingest_three(client: IngestClient) -> dict[str, str]:
    ids = {}
    for key, content, name in (
        ("milvus", MILVUS_MD, "milvus.md"),
        ("bread", BREAD_TXT, "bread.txt"),
        ("garden", GARDEN_TXT, "garden.txt"),
    ):
        ids[key] = client.upload(content.encode(), file_name=name, tags=[key]).document_id
    return ids


async def test_upload_get_list_update_delete(fake_stack, tmp_path: Path) -> None:
    path = tmp_path / "milvus.md"
    path.write_text(MILVUS_MD)

    def scenario() -> None:
        with IngestClient(fake_stack.ingest_address) as client:
            assert client.health() == "SERVING"
            doc = client.upload(path, tags=["db"], metadata={"team": "search"}, chunk_bytes=64)
            assert doc.state == 3 and doc.chunk_count > 0  # ACTIVE
            assert doc.media_type == "text/markdown" and doc.source == "milvus.md"
            assert list(doc.tags) == ["db"] and doc.metadata["team"] == "search"
            client.upload(BREAD_TXT.encode(), file_name="bread.txt", document_id="bread-1")
            client.upload(GARDEN_TXT.encode(), file_name="garden.txt", chunking="sentence")
            assert client.get_document(doc.document_id).content_hash == doc.content_hash

            first_page = client.list_documents_page(page_size=1)
            assert len(first_page.documents) == 1 and first_page.next_page_token
            listed = [d.document_id for d in client.list_documents(page_size=1)]
            assert len(listed) == 3 and listed == sorted(listed) and "bread-1" in listed

            updated = client.update_document("bread-1", title="Bread", tags=["kitchen"])
            assert updated.title == "Bread" and list(updated.tags) == ["kitchen"]
            assert client.delete_document("bread-1") > 0
            with pytest.raises(NotFound):
                client.get_document("bread-1")
            assert len(list(client.list_documents())) == 2

    await asyncio.to_thread(scenario)


async def test_ingest_batch_streams_progress_then_summary(fake_stack) -> None:
    documents = [
        NewDocument(MILVUS_MD, file_name="milvus.md"),
        {"content": BREAD_TXT, "file_name": "bread.txt", "tags": ("kitchen",)},
        NewDocument(PNG_BYTES, file_name="image.png"),
    ]

    def scenario() -> None:
        with IngestClient(fake_stack.ingest_address) as client:
            stream = client.ingest(documents)
            events = list(stream)
            assert all(isinstance(e, Progress) for e in events[:-1]) and isinstance(events[-1], BatchSummary)
            assert stream.summary == events[-1] and stream.job_id
            assert (stream.summary.succeeded, stream.summary.failed) == (2, 1)
            assert {stream.documents[0].state, stream.documents[1].state} == {"active"}
            failed = stream.documents[2]
            assert failed.state == "failed" and failed.error_code == "INVALID_ARGUMENT"
            assert "PNG" in failed.error_message
            job = client.get_job(stream.job_id)
            assert job.done and job.summary.failed == 1 and len(job.documents) == 3
            final = client.ingest(documents, final_only=True)  # each document's final event only
            events = list(final)
            assert [e.stage for e in events[:-1]] == ["done"] * 3 and final.summary is not None
            assert final.documents[2].state == "failed" and final.summary.unchanged == 2

    await asyncio.to_thread(scenario)


async def test_retrieve_ranks_the_relevant_document_first(fake_stack) -> None:
    def scenario() -> None:
        with _clients(fake_stack) as (ingest, query):
            ids = _ingest_three(ingest)
            fake_stack.caught_up()
            stream = query.retrieve("Milvus vector database embeddings", top_k=3)
            hits = list(stream)
            assert hits[0].document_id == ids["milvus"]
            assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
            assert hits[0].score_kind == "rrf" and "fused" in hits[0].stage_scores
            assert stream.summary is not None and stream.summary.returned == len(hits)
            dense, _ = query.search("sourdough bread starter", mode="dense", top_k=1)
            assert dense[0].document_id == ids["bread"] and dense[0].score_kind == "cosine"
            tagged, summary = query.search("plants and bread", tags=["garden"], mode="sparse")
            assert [h.document_id for h in tagged] == [ids["garden"]] and tagged[0].score_kind == "bm25"
            assert summary is not None and summary.sparse_backend == "rank_bm25"

    await asyncio.to_thread(scenario)


def _kinds(events: list[object]) -> list[str]:
    kinds: list[str] = []
    for event in events:
        kind = event.kind  # type: ignore[attr-defined]
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
    return kinds


async def test_ask_streams_sources_tokens_citations_final(fake_stack) -> None:
    def scenario() -> None:
        with _clients(fake_stack) as (ingest, query):
            ids = _ingest_three(ingest)
            stream: AskStream = query.ask("What does Milvus store?", top_k=2)
            events = list(stream)
            assert _kinds(events) in (["source", "token", "citation", "final"], ["source", "token", "final"])
            assert isinstance(events[0], Source) and isinstance(events[-1], Final)
            assert [s.number for s in stream.sources] == list(range(1, len(stream.sources) + 1))
            assert stream.sources[0].hit.document_id == ids["milvus"]
            assert stream.final is not None and stream.final.model == "extractive"
            tokens = "".join(e.text for e in events if isinstance(e, Token))
            assert stream.answer == stream.final.answer == tokens and "Milvus" in stream.answer
            assert all(
                isinstance(c, Citation) and 1 <= c.source_number <= len(stream.sources) for c in stream.citations
            )

    await asyncio.to_thread(scenario)


async def test_closing_the_ask_stream_cancels_the_call(fake_stack) -> None:
    def scenario() -> None:
        with _clients(fake_stack) as (ingest, query):
            _ingest_three(ingest)
            with query.ask("What does Milvus store?") as stream:
                assert isinstance(next(stream), Source)
            with pytest.raises(Cancelled):
                next(stream)

    await asyncio.to_thread(scenario)


async def test_errors_are_typed_with_details(fake_stack) -> None:
    def scenario() -> None:
        with _clients(fake_stack) as (ingest, query):
            with pytest.raises(NotFound) as missing:
                ingest.get_document("no-such-document")
            assert missing.value.code == grpc.StatusCode.NOT_FOUND and missing.value.domain == "ragrpc.v1"
            assert missing.value.metadata == {"document_id": "no-such-document"}
            with pytest.raises(InvalidArgument) as empty:
                list(query.retrieve("   "))
            assert [v.field for v in empty.value.field_violations] == ["query"]
            with pytest.raises(InvalidArgument) as bad_id:
                ingest.get_document("bad id!")
            assert [v.field for v in bad_id.value.field_violations] == ["document_id"]
            with pytest.raises(InvalidArgument) as unsupported:
                ingest.upload(b"plain words", file_name="notes.xyz", media_type="application/x-unknown")
            assert unsupported.value.reason == "UNSUPPORTED_MEDIA_TYPE"
            with pytest.raises(InvalidArgument) as too_many:
                list(query.retrieve("milvus", top_k=100_000))
            assert too_many.value.field_violations[0].field == "options.top_k"
            with pytest.raises(ValueError, match="unknown mode"):
                query.retrieve("milvus", mode="semantic")

    await asyncio.to_thread(scenario)


def test_importing_clients_does_not_load_the_service_dependencies() -> None:
    heavy = ("torch", "pymilvus", "numpy", "sentence_transformers")
    code = (
        "import sys, clients, clients.cli, clients.examples.sse_relay; "
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "", f"clients imported {result.stdout.strip()}"


class TestRetraction:
    """A real LLM endpoint (tests.support.chat_server) that dies after 3 tokens: the query
    service retracts the partial answer and the extractive generator starts over."""

    @pytest.fixture
    def chat_server(self) -> Iterator[ChatServer]:
        with ChatServer(default=Behaviour.die(after_tokens=3)) as server:
            yield server

    @pytest.fixture
    def settings(self, settings: Settings, chat_server: ChatServer) -> Settings:
        return dataclasses.replace(settings, llm_endpoints=f"{chat_server.url}|flaky-model")

    async def test_a_retraction_clears_the_partial_answer(self, fake_stack) -> None:
        def scenario() -> None:
            with _clients(fake_stack) as (ingest, query):
                _ingest_three(ingest)
                stream = query.ask("What does Milvus store?", top_k=2)
                partial = []
                for event in stream:
                    if isinstance(event, Retraction):
                        assert stream.answer == "" and "".join(partial)
                        break
                    if isinstance(event, Token):
                        partial.append(event.text)
                        assert stream.answer == "".join(partial)
                rest = list(stream)
                assert stream.retractions[0].model == "flaky-model" and stream.retractions[0].reason
                assert stream.final is not None and stream.final.model == "extractive"
                fresh = "".join(e.text for e in rest if isinstance(e, Token))
                assert stream.answer == stream.final.answer == fresh

        await asyncio.to_thread(scenario)


def test_options_convert_to_request_protos() -> None:
    request = convert.ask_request(
        "q",
        top_k=3,
        mode="dense",
        fusion="weighted",
        dense_weight=0.6,
        sparse_weight=0.0,
        rerank=False,
        mmr_lambda=0.5,
        min_score=0.1,
        include_parent=True,
        collection="c",
        tags="t",
        sources=["a", "b"],
        after=dt.datetime(2024, 1, 2),
        before=dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
        template="analytical",
        history=[("user", "hi"), {"role": "assistant", "content": "hello"}],
        max_answer_tokens=64,
        token_budget=900,
        temperature=0.0,
    )
    options = request.options
    assert (options.top_k, options.mode, options.fusion) == (
        3,
        retrieve_pb2.RETRIEVAL_MODE_DENSE,
        retrieve_pb2.FUSION_METHOD_WEIGHTED,
    )
    assert options.HasField("sparse_weight") and options.sparse_weight == 0.0 and options.rerank is False
    assert options.HasField("rerank") and options.mmr_lambda == 0.5 and options.include_parent
    assert list(options.filter.tags) == ["t"] and list(options.filter.sources) == ["a", "b"]
    assert options.filter.document_time_after.ToDatetime() == dt.datetime(2024, 1, 2)
    assert [t.role for t in request.history] == [1, 2] and request.HasField("temperature")
    unset = convert.retrieval_options()
    assert not unset.HasField("rerank") and not unset.HasField("mmr_lambda")
    assert not unset.filter.HasField("document_time_after")
    with pytest.raises(TypeError, match="top_kk"):
        convert.retrieval_options(top_kk=3)
    chunking = convert.chunking_options({"strategy": "fixed_tokens", "chunk_size_tokens": 128})
    assert chunking is not None and chunking.chunk_size_tokens == 128
