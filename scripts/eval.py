"""make eval: retrieval quality on BEIR-layout datasets and on look-alike documents, through the
real services over gRPC.

    python -m scripts.eval ../shared/eval/ir/scifact:train ../shared/eval/ir/cisi:test [--json out.json]
    python -m scripts.eval --lookalike-only [--lookalike-max-questions N]
    python -m scripts.eval --enrichers ""        (the services without enrichers; default: filings)

For each dataset: start milvus-lite, the ingest service and two query services (sparse
backend milvus_bm25 and rank_bm25), ingest the corpus through IngestDocuments (skipped when
a previous run already ingested it: the data lives in .eval/<name>/), then Retrieve every
judged query under each configuration and score documents ranked by their best chunk:
nDCG@10, Recall@100, MRR@10. Then the look-alike step (scripts/lookalike_eval.py; skip it with
--no-lookalike): shared PDFs of a few families with questions generated from their page text,
each answered on one page, scored as document@k and page@k over the returned chunks. Prints the
tables and writes JSON ({"beir": [...], "lookalike": {...}}).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc

from ragrpc.evaluation import BeirDataset, evaluate, load_beir
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from scripts.bench.peers import bm25_peer
from scripts.lookalike_eval import evaluate_lookalike, print_lookalike_table
from scripts.processes import REPO, Stack

_ID_OK = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
BATCH = 64


@dataclass(frozen=True)
class Config:
    name: str
    backend: str  # which query service answers: milvus_bm25 | rank_bm25
    mode: retrieve_pb2.RetrievalMode
    fusion: retrieve_pb2.FusionMethod = retrieve_pb2.FUSION_METHOD_UNSPECIFIED
    mmr: float | None = None


def configs(include_milvus_bm25: bool) -> list[Config]:
    hybrid, dense, sparse = (
        retrieve_pb2.RETRIEVAL_MODE_HYBRID,
        retrieve_pb2.RETRIEVAL_MODE_DENSE,
        retrieve_pb2.RETRIEVAL_MODE_SPARSE,
    )
    rrf, weighted = retrieve_pb2.FUSION_METHOD_RRF, retrieve_pb2.FUSION_METHOD_WEIGHTED
    out = [
        Config("dense", "rank_bm25", dense),
        Config("sparse rank_bm25", "rank_bm25", sparse),
        Config("hybrid rrf", "rank_bm25", hybrid, rrf),
        Config("hybrid weighted", "rank_bm25", hybrid, weighted),
        Config("dense +mmr", "rank_bm25", dense, mmr=0.7),
        Config("sparse rank_bm25 +mmr", "rank_bm25", sparse, mmr=0.7),
        Config("hybrid rrf +mmr", "rank_bm25", hybrid, rrf, 0.7),
        Config("hybrid weighted +mmr", "rank_bm25", hybrid, weighted, 0.7),
    ]
    if include_milvus_bm25:
        out += [
            Config("sparse milvus_bm25", "milvus_bm25", sparse),
            Config("hybrid rrf (milvus_bm25)", "milvus_bm25", hybrid, rrf),
        ]
    return out


def lookalike_configs() -> list[Config]:
    """The look-alike step's configurations: the BEIR tables' rank_bm25 ones without MMR."""
    return [config for config in configs(include_milvus_bm25=False) if config.mmr is None]


def document_id(beir_id: str) -> str:
    # A digest, not hash(): str hashes are salted per process, and the id must be the same on every run.
    return beir_id if _ID_OK.match(beir_id) else "h-" + hashlib.sha256(beir_id.encode()).hexdigest()[:24]


def _batches(
    dataset: BeirDataset, collection: str, progress_detail: int = ingest_pb2.PROGRESS_DETAIL_FINAL
) -> Iterator[ingest_pb2.IngestDocumentsRequest]:
    """The corpus as IngestDocuments requests of BATCH documents; the stream carries each document's
    final event only unless progress_detail says otherwise (the loader reads the summaries)."""
    docs = list(dataset.corpus.values())
    for start in range(0, len(docs), BATCH):
        items = [
            ingest_pb2.InlineDocument(
                spec=ingest_pb2.DocumentSpec(
                    document_id=document_id(d.doc_id),
                    file_name=f"{d.doc_id}.txt",
                    media_type="text/plain",
                    collection=collection,
                    title=d.title,
                    metadata={"beir_id": d.doc_id},
                ),
                content=(f"{d.title}\n\n{d.text}" if d.title else d.text).encode(),
            )
            for d in docs[start : start + BATCH]
        ]
        yield ingest_pb2.IngestDocumentsRequest(documents=items, progress_detail=progress_detail)


IN_FLIGHT = 2  # IngestDocuments requests open at once


def ingest(address: str, dataset: BeirDataset, collection: str) -> dict[str, float]:
    """Sends the corpus in IngestDocuments batches of BATCH documents, IN_FLIGHT requests open at
    once: the service starts the next batch's documents in the slots the last ones of the
    previous batch free, so the model is not left idle while a batch drains."""
    totals = {"chunks": 0, "failed": 0, "unchanged": 0}
    lock = threading.Lock()

    def send(request: ingest_pb2.IngestDocumentsRequest) -> None:
        for event in stub.IngestDocuments(request, timeout=3600):
            if event.HasField("summary"):
                with lock:
                    totals["chunks"] += event.summary.chunks_written
                    totals["failed"] += event.summary.failed
                    totals["unchanged"] += event.summary.unchanged

    with grpc.insecure_channel(address) as channel, ThreadPoolExecutor(max_workers=IN_FLIGHT) as pool:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        started, done = time.perf_counter(), 0
        open_requests: deque[tuple[Future[None], int]] = deque()
        for request in _batches(dataset, collection):
            if len(open_requests) == IN_FLIGHT:
                done += _finish(open_requests.popleft(), done, len(dataset.corpus))
            open_requests.append((pool.submit(send, request), len(request.documents)))
        while open_requests:
            done += _finish(open_requests.popleft(), done, len(dataset.corpus))
        elapsed = time.perf_counter() - started
    return {
        "documents": len(dataset.corpus),
        "chunks_written": totals["chunks"],
        "failed": totals["failed"],
        "unchanged": totals["unchanged"],
        "seconds": round(elapsed, 1),
    }


def _finish(item: tuple[Future[None], int], done: int, total: int) -> int:
    """Waits for one request (its errors surface here); prints progress every ten batches."""
    future, size = item
    future.result()
    if (done // BATCH) % 10 == 0:
        print(f"  ingested {done + size}/{total}", file=sys.stderr, flush=True)
    return size


def ranked_documents(
    stub: retrieve_pb2_grpc.RetrieveServiceStub, request: retrieve_pb2.RetrieveRequest, reverse: dict[str, str]
) -> list[str]:
    """The dataset's document ids in the order of their best chunk among the Retrieve hits (`reverse`: the
    service's document id -> the dataset's)."""
    ranking: list[str] = []
    for response in stub.Retrieve(request, timeout=120):
        if response.HasField("chunk"):
            doc = reverse.get(response.chunk.chunk.document_id, response.chunk.chunk.document_id)
            if doc not in ranking:
                ranking.append(doc)
    return ranking


def run_config(address: str, dataset: BeirDataset, collection: str, config: Config) -> tuple[dict, float]:
    reverse = {document_id(k): k for k in dataset.corpus}
    queries = dataset.judged_queries()

    def one(item: tuple[str, str]) -> tuple[str, list[str], float]:
        qid, text = item
        options = retrieve_pb2.RetrievalOptions(
            top_k=100, candidates=200, mode=config.mode, fusion=config.fusion, collection=collection
        )
        if config.mmr is not None:
            options.mmr_lambda = config.mmr
        started = time.perf_counter()
        ranking = ranked_documents(stub, retrieve_pb2.RetrieveRequest(query=text, options=options), reverse)
        return qid, ranking, time.perf_counter() - started

    with grpc.insecure_channel(address) as channel:
        stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(one, queries.items()))
    run = {qid: ranking for qid, ranking, _ in results}
    latencies = sorted(seconds for _, _, seconds in results)
    qrels = {qid: dataset.qrels[qid] for qid in queries}
    metrics = evaluate(run, qrels, k_values=(10, 100))
    return metrics, latencies[len(latencies) // 2] * 1000.0


BASELINE = "plain rank-bm25 (in-process)"


def baseline_row(dataset: BeirDataset, baseline: dict) -> dict[str, float]:
    """The plain rank-bm25 baseline (lowercase \\w+ tokens, no stemming, whole documents), scored alike."""
    metrics = evaluate(baseline["run"], {q: dataset.qrels[q] for q in dataset.judged_queries()}, k_values=(10, 100))
    return {
        "ndcg@10": metrics["ndcg@10"],
        "recall@100": metrics["recall@100"],
        "mrr@10": metrics["mrr@10"],
        "p50_ms": baseline["latency_ms"]["p50"],
    }


def evaluate_dataset(
    spec: str, include_milvus_bm25: bool, only: tuple[str, ...] = (), enrichers: str = "filings"
) -> dict:
    """Ingests one dataset and runs every configuration (or those named in `only`) over it, the services
    running `enrichers` (RAGRPC_ENRICHERS)."""
    path_text, _, split = spec.partition(":")
    path = Path(path_text).resolve()
    dataset = load_beir(path, split or "test")
    name = path.name
    baseline = bm25_peer(dataset)
    print(f"  {name:10s} {'plain rank-bm25 baseline':28s} nDCG@10 {baseline['ndcg@10']:.4f}", file=sys.stderr)
    with Stack(REPO / ".eval" / name) as stack:
        stack.start_milvus()
        env = {"RAGRPC_COLLECTION_PREFIX": f"eval_{name}", "RAGRPC_ENRICHERS": enrichers}
        ingest_address = stack.start_ingest(env)
        ingestion = ingest(ingest_address, dataset, name)
        chosen = [c for c in configs(include_milvus_bm25) if not only or c.name in only]
        backends = sorted({c.backend for c in chosen})
        addresses = {b: stack.start_query(f"query-{b}", {**env, "RAGRPC_SPARSE_BACKEND": b}) for b in backends}
        rows = {BASELINE: baseline_row(dataset, baseline)}
        for config in chosen:
            metrics, p50 = run_config(addresses[config.backend], dataset, name, config)
            rows[config.name] = {
                "ndcg@10": metrics["ndcg@10"],
                "recall@100": metrics["recall@100"],
                "mrr@10": metrics["mrr@10"],
                "p50_ms": p50,
            }
            print(f"  {name:10s} {config.name:28s} nDCG@10 {metrics['ndcg@10']:.4f}", file=sys.stderr, flush=True)
    return {
        "dataset": name,
        "enrichers": enrichers,
        "split": split or "test",
        "queries": len(dataset.judged_queries()),
        "ingestion": ingestion,
        "results": rows,
    }


def print_table(reports: list[dict]) -> None:
    print(f"{'dataset':10s} {'configuration':28s} {'nDCG@10':>8s} {'R@100':>7s} {'MRR@10':>7s} {'p50 ms':>7s}")
    for report in reports:
        for config, row in report["results"].items():
            print(
                f"{report['dataset']:10s} {config:28s} {row['ndcg@10']:8.4f} {row['recall@100']:7.4f} "
                f"{row['mrr@10']:7.4f} {row['p50_ms']:7.1f}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "datasets",
        nargs="*",
        help="DIR[:SPLIT] of a BEIR-layout dataset (split default: test)",
        default=[
            f"{REPO.parent}/shared/eval/ir/scifact:train",
            f"{REPO.parent}/shared/eval/ir/cisi:test",
            f"{REPO.parent}/shared/eval/ir/cranfield:test",
        ],
    )
    parser.add_argument("--json", default=str(REPO / ".eval" / "results.json"), help="where to write the JSON")
    parser.add_argument("--no-milvus-bm25", action="store_true", help="skip the milvus_bm25 sparse backend")
    steps = parser.add_mutually_exclusive_group()
    steps.add_argument("--no-lookalike", action="store_true", help="skip the look-alike document step")
    steps.add_argument("--lookalike-only", action="store_true", help="run only the look-alike document step")
    parser.add_argument(
        "--lookalike-max-questions", type=int, default=None, help="ask at most N look-alike questions (spread evenly)"
    )
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        help='run only this configuration of the BEIR tables (repeatable), e.g. --config "sparse milvus_bm25"',
    )
    parser.add_argument(
        "--enrichers",
        default="filings",
        help="RAGRPC_ENRICHERS of the services (default filings, as the look-alike set's filings and the figures "
        'in docs/eval.md were measured; "" for none). A collection ingested under other enrichers keeps its '
        "chunks: use an empty .eval/ (or --json elsewhere and another tree) to compare",
    )
    args = parser.parse_args(argv)
    known = {c.name for c in configs(include_milvus_bm25=True)}
    if unknown := [name for name in args.config if name not in known]:
        parser.error(f"unknown configuration(s) {unknown}; choose from {sorted(known)}")
    only = tuple(args.config)
    reports = (
        []
        if args.lookalike_only
        else [evaluate_dataset(s, not args.no_milvus_bm25, only, args.enrichers) for s in args.datasets]
    )
    lookalike = None
    if not args.no_lookalike:
        lookalike = evaluate_lookalike(
            lookalike_configs(), max_questions=args.lookalike_max_questions, enrichers=args.enrichers
        )
    if reports:
        print_table(reports)
    if lookalike:
        print_lookalike_table(lookalike)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"beir": reports, "lookalike": lookalike}, indent=2))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
