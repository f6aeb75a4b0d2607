"""The look-alike document step of `make eval`: right document, right page.

Uploads the look-alike PDFs (scripts/lookalike_questions.py: families of similar documents,
questions generated from page text, each with a target document and page) through
UploadDocument, then asks every question through Retrieve (top_k 10) under each configuration,
twice: over the whole collection, and restricted to the target document (MetadataFilter
document_ids), and scores the ranked chunks (ragrpc.evaluation.evaluate_pages): doc@1, doc@5,
page@5, page@10, MRR@10 of the right page, and page@5 within the right document.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import grpc

from ragrpc.evaluation import PageHit, PageTarget, evaluate_pages, page_at_k
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from scripts.lookalike_questions import DOCS, LookalikeDocument, LookalikeSet, Question, load_lookalike_set
from scripts.processes import REPO, Stack


class Config(Protocol):
    """What this step reads of a configuration (scripts.eval.Config has it): the row's name and the
    RetrievalOptions it sets."""

    @property
    def name(self) -> str: ...

    @property
    def mode(self) -> retrieve_pb2.RetrievalMode: ...

    @property
    def fusion(self) -> retrieve_pb2.FusionMethod: ...

    @property
    def mmr(self) -> float | None: ...


COLLECTION = "lookalike"
TOP_K = 10
CANDIDATES = 200  # as the BEIR tables
PIECE_BYTES = 1 << 20
_ID_OK = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")  # DocumentSpec.document_id


def _upload_requests(document: LookalikeDocument, collection: str) -> Iterator[ingest_pb2.UploadDocumentRequest]:
    spec = ingest_pb2.DocumentSpec(
        document_id=document.document_id,
        file_name=document.path.name,
        collection=collection,
        metadata={"family": document.family},
    )
    yield ingest_pb2.UploadDocumentRequest(header=spec)
    with document.path.open("rb") as handle:
        while piece := handle.read(PIECE_BYTES):
            yield ingest_pb2.UploadDocumentRequest(data=piece)


def upload_documents(address: str, documents: Sequence[LookalikeDocument], collection: str) -> dict:
    """Uploads every document (two at once); a document that does not end ACTIVE is an error."""
    for document in documents:
        if not _ID_OK.match(document.document_id):
            raise ValueError(f"{document.path.name}: {document.document_id!r} is not a valid document id")
    started = time.perf_counter()
    with grpc.insecure_channel(address) as channel, ThreadPoolExecutor(max_workers=2) as pool:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)

        def one(document: LookalikeDocument) -> ingest_pb2.UploadDocumentResponse:
            response = stub.UploadDocument(_upload_requests(document, collection), timeout=1800)
            print(f"  uploaded {document.path.name}: {response.document.chunk_count} chunks", file=sys.stderr)
            return response

        responses = list(pool.map(one, documents))
    return {
        "documents": len(documents),
        "pages": sum(r.document.page_count for r in responses),
        "chunks": sum(r.document.chunk_count for r in responses),
        "unchanged": sum(1 for r in responses if r.unchanged),
        "seconds": round(time.perf_counter() - started, 1),
    }


def retrieve_hits(
    address: str, questions: Sequence[Question], collection: str, config: Config, within_document: bool
) -> tuple[dict[str, list[PageHit]], float]:
    """question id -> ranked hits, and the median latency in ms."""

    def one(question: Question) -> tuple[str, list[PageHit], float]:
        options = retrieve_pb2.RetrievalOptions(
            top_k=TOP_K, candidates=CANDIDATES, mode=config.mode, fusion=config.fusion, collection=collection
        )
        if config.mmr is not None:
            options.mmr_lambda = config.mmr
        if within_document:
            options.filter.document_ids.append(question.document_id)
        started = time.perf_counter()
        hits = [
            PageHit(r.chunk.chunk.document_id, r.chunk.chunk.page_start, r.chunk.chunk.page_end)
            for r in stub.Retrieve(retrieve_pb2.RetrieveRequest(query=question.query, options=options), timeout=120)
            if r.HasField("chunk")
        ]
        return question.question_id, hits, time.perf_counter() - started

    with grpc.insecure_channel(address) as channel:
        stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(one, questions))
    latencies = sorted(seconds for _, _, seconds in results)
    return {qid: hits for qid, hits, _ in results}, latencies[len(latencies) // 2] * 1000.0


def score_config(address: str, questions: Sequence[Question], collection: str, config: Config) -> dict:
    targets = {q.question_id: PageTarget(q.document_id, q.page) for q in questions}
    runs, p50 = retrieve_hits(address, questions, collection, config, within_document=False)
    within, _ = retrieve_hits(address, questions, collection, config, within_document=True)
    row: dict[str, Any] = dict(evaluate_pages(runs, targets))
    row["page@5 in doc"] = evaluate_pages(within, targets)["page@5"]
    row["p50_ms"] = p50
    top5 = [hit for hits in runs.values() for hit in hits[:5]]
    row["pages_per_hit"] = sum(max(h.page_end - h.page_start + 1, 0) for h in top5) / max(len(top5), 1)
    row["page@5 misses"] = [
        {
            "question": q.question_id,
            "query": q.query,
            "top": [f"{h.document_id} p{h.page_start}-{h.page_end}" for h in runs[q.question_id][:3]],
        }
        for q in questions
        if not page_at_k(runs[q.question_id], targets[q.question_id], 5)
    ]
    row["page@5 by family"] = {
        family: evaluate_pages(runs, {q.question_id: targets[q.question_id] for q in questions if q.family == family})[
            "page@5"
        ]
        for family in sorted({q.family for q in questions})
    }
    return row


def subset(questions: Sequence[Question], limit: int | None) -> list[Question]:
    """At most `limit` questions, evenly spread over the set (deterministic)."""
    if limit is None or limit >= len(questions):
        return list(questions)
    step = len(questions) / limit
    return [questions[int(i * step)] for i in range(limit)]


def evaluate_lookalike(
    configs: Sequence[Config],
    data_dir: Path = REPO / ".eval" / "lookalike",
    root: Path = DOCS,
    max_questions: int | None = None,
    lookalike: LookalikeSet | None = None,
    enrichers: str = "filings",
) -> dict:
    """Starts milvus-lite, an ingest and a rank_bm25 query service under `data_dir` (running `enrichers`,
    RAGRPC_ENRICHERS: the set holds financial statements), uploads the set and scores every configuration;
    returns the report (JSON-ready)."""
    lookalike = lookalike or load_lookalike_set(root, cache_dir=data_dir)
    questions = subset(lookalike.questions, max_questions)
    print(f"  lookalike: {len(lookalike.documents)} documents, {len(questions)} questions", file=sys.stderr, flush=True)
    env = {"RAGRPC_COLLECTION_PREFIX": "eval_lookalike", "RAGRPC_ENRICHERS": enrichers}
    with Stack(data_dir) as stack:
        stack.start_milvus()
        ingestion = upload_documents(stack.start_ingest(env), lookalike.documents, COLLECTION)
        address = stack.start_query("query-rank_bm25", {**env, "RAGRPC_SPARSE_BACKEND": "rank_bm25"})
        rows = {}
        for config in configs:
            rows[config.name] = score_config(address, questions, COLLECTION, config)
            print(f"  lookalike  {config.name:28s} page@5 {rows[config.name]['page@5']:.4f}", file=sys.stderr)
    return {
        "enrichers": enrichers,
        "documents": [
            {"document_id": d.document_id, "family": d.family, "pages": d.pages} for d in lookalike.documents
        ],
        "skipped": lookalike.skipped,
        "questions": len(questions),
        "questions_file": str(lookalike.source) if lookalike.source else "",
        "question_documents": len({q.document_id for q in questions}),
        "ingestion": ingestion,
        "results": rows,
    }


def print_lookalike_table(report: dict) -> None:
    pages = sum(d["pages"] for d in report["documents"])
    print(
        f"\nlook-alike documents: {len(report['documents'])} PDFs ({pages} pages), {report['questions']} questions "
        f"from {report['question_documents']} of them, answer on one page; top {TOP_K} chunks"
    )
    columns = ("doc@1", "doc@5", "page@5", "page@10", "mrr@10", "page@5 in doc")
    widths = [max(len(c), 7) for c in columns]
    header = " ".join(f"{c.upper() if c.startswith('mrr') else c:>{w}s}" for c, w in zip(columns, widths, strict=True))
    print(f"{'configuration':28s} {header} {'p50 ms':>7s}")
    for config, row in report["results"].items():
        cells = " ".join(f"{row[c]:{w}.4f}" for c, w in zip(columns, widths, strict=True))
        print(f"{config:28s} {cells} {row['p50_ms']:7.1f}")
