"""Sweeps of Retrieve options over datasets `make eval` has already ingested (in .eval/<name>/): how the
fusion defaults were chosen (docs/eval.md, "Fusion defaults").

    python -m scripts.eval_sweep ../shared/eval/ir/scifact:train ../shared/eval/ir/cisi:test \\
        --variant "rrf k20=hybrid,rrf,20" --variant "weighted 0.5=hybrid,weighted,,0.5,0.5" [--env RAGRPC_BM25_K1=1.2]

A variant is `label=mode,fusion,rrf_k,dense_weight,sparse_weight,candidates` (empty fields: the server's
default). One query service (rank_bm25, with the --env settings) answers every variant of a dataset; nDCG@10
and MRR@10 are over the top 40 chunks ranked by document (R@100 would need top_k 100: use make eval for it).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc

from ragrpc.evaluation import BeirDataset, evaluate, load_beir
from ragrpc.v1 import retrieve_pb2, retrieve_pb2_grpc
from scripts.eval import document_id, ranked_documents
from scripts.processes import REPO, Stack

_MODES = {
    "hybrid": retrieve_pb2.RETRIEVAL_MODE_HYBRID,
    "dense": retrieve_pb2.RETRIEVAL_MODE_DENSE,
    "sparse": retrieve_pb2.RETRIEVAL_MODE_SPARSE,
}
_FUSIONS = {
    "": retrieve_pb2.FUSION_METHOD_UNSPECIFIED,
    "rrf": retrieve_pb2.FUSION_METHOD_RRF,
    "weighted": retrieve_pb2.FUSION_METHOD_WEIGHTED,
}
TOP_K = 40


@dataclass(frozen=True)
class Variant:
    label: str
    options: retrieve_pb2.RetrievalOptions

    @classmethod
    def parse(cls, text: str) -> Variant:
        label, _, spec = text.partition("=")
        fields = (spec.split(",") + [""] * 6)[:6]
        mode, fusion, rrf_k, dense_weight, sparse_weight, candidates = (x.strip() for x in fields)
        options = retrieve_pb2.RetrievalOptions(
            top_k=TOP_K,
            mode=_MODES[mode or "hybrid"],
            fusion=_FUSIONS[fusion],
            rrf_k=int(rrf_k or 0),
            candidates=int(candidates or 200),
        )
        if dense_weight:
            options.dense_weight = float(dense_weight)
        if sparse_weight:
            options.sparse_weight = float(sparse_weight)
        return cls(label.strip(), options)


def score(stub: retrieve_pb2_grpc.RetrieveServiceStub, dataset: BeirDataset, collection: str, variant: Variant) -> dict:
    reverse = {document_id(k): k for k in dataset.corpus}
    queries = dataset.judged_queries()
    options = retrieve_pb2.RetrievalOptions()
    options.CopyFrom(variant.options)
    options.collection = collection

    def one(item: tuple[str, str]) -> tuple[str, list[str]]:
        qid, text = item
        request = retrieve_pb2.RetrieveRequest(query=text, options=options)
        return qid, ranked_documents(stub, request, reverse)

    with ThreadPoolExecutor(max_workers=4) as pool:
        run = dict(pool.map(one, queries.items()))
    return evaluate(run, {q: dataset.qrels[q] for q in queries}, k_values=(10,))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("datasets", nargs="+", help="DIR:SPLIT of datasets make eval has ingested")
    parser.add_argument("--variant", action="append", required=True, help="label=mode,fusion,rrf_k,dw,sw,candidates")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the query service")
    args = parser.parse_args(argv)
    variants = [Variant.parse(text) for text in args.variant]
    env = dict(item.split("=", 1) for item in args.env)
    for spec in args.datasets:
        path_text, _, split = spec.partition(":")
        path = Path(path_text).resolve()
        name = path.name
        if not (REPO / ".eval" / name / "milvus").is_dir():
            print(f"{name}: not ingested yet; run make eval first", file=sys.stderr)
            return 2
        dataset = load_beir(path, split or "test")
        with Stack(REPO / ".eval" / name) as stack:
            stack.start_milvus()
            overrides = {
                "RAGRPC_COLLECTION_PREFIX": f"eval_{name}",
                "RAGRPC_SPARSE_BACKEND": "rank_bm25",
                "RAGRPC_ENRICHERS": "filings",  # as make eval ingested and queried them (--env overrides it)
                **env,
            }
            address = stack.start_query("query-sweep", overrides)
            with grpc.insecure_channel(address) as channel:
                stub = retrieve_pb2_grpc.RetrieveServiceStub(channel)
                for variant in variants:
                    metrics = score(stub, dataset, name, variant)
                    ndcg, mrr = metrics["ndcg@10"], metrics["mrr@10"]
                    print(f"{name:10s} {variant.label:28s} nDCG@10 {ndcg:.4f} MRR@10 {mrr:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
