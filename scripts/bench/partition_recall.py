"""Recall of the held vectors' coarse partitions on real text (query_service.coarse_partitions).

    python -m scripts.bench.partition_recall [--lists 90,180] [--percent 3.3,10,15,20]

The bench's 1M-chunk collection is noisy copies of 2,048 embedded texts, so clustered that any
partitioning finds their neighbours; this probe measures the same search on real passages instead:
SciFact's abstracts, the CISI and Cranfield collections and the shared documents, cut into windows
of three sentences (22,804 distinct passages), embedded once by the bundled model (cached under
.bench/partition-recall/, about 10 minutes on 2 cores the first time). For each number of lists and
share probed it prints recall@10 and recall@100 against exact search for the SciFact, CISI and
Cranfield queries, through the real InProcessDenseIndex (k-means lists, the rows laid out list by
list). A million real passages would be the faithful test; embedding them takes days here.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from query_service.coarse_partitions import EXACT, CoarsePartitions, PartitionPolicy
from query_service.dense_index import InProcessDenseIndex, VectorChunk
from ragrpc.config import Settings
from ragrpc.embeddings import embedder_from_settings
from scripts.bench.common import BENCH_DIR, load_scifact
from scripts.bench.querydata import _sentences, _shared_document_sentences

EVAL = Path(__file__).resolve().parents[2].parent / "shared" / "eval" / "ir"
QUERY_SETS = ("scifact", "cisi", "cranfield")


def passages() -> list[str]:
    sources = [_sentences(d.full_text) for d in load_scifact().corpus.values()] + _shared_document_sentences()
    for name in ("cisi", "cranfield"):
        with open(EVAL / name / "corpus.jsonl") as lines:
            sources += [_sentences(json.loads(line).get("text", "")) for line in lines]
    windows = (" ".join(s[i : i + 3])[:1500] for s in sources for i in range(0, len(s), 3) if s)
    return list(dict.fromkeys(windows))


def _queries(name: str) -> list[str]:
    with open(EVAL / name / "queries.jsonl") as lines:
        rows = [json.loads(line) for line in lines]
    return [row.get("text") or row.get("query") for row in rows][:300]


def embedded() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    cache = BENCH_DIR / "partition-recall"
    cache.mkdir(parents=True, exist_ok=True)
    embedder = embedder_from_settings(Settings())
    tag = embedder.model_id.replace("/", "_")
    vectors_file = cache / f"passages-{tag}.npy"
    if not vectors_file.exists():
        texts = passages()
        print(f"embedding {len(texts):,} passages (once) ...", flush=True)
        np.save(vectors_file, np.asarray(embedder.embed_documents(texts), dtype=np.float32))
    queries = {name: np.asarray([embedder.embed_query(q) for q in _queries(name)], np.float32) for name in QUERY_SETS}
    return np.load(vectors_file), queries


def recall(vectors: np.ndarray, queries: dict[str, np.ndarray], lists: int, percent: float) -> dict[str, tuple]:
    """recall@10 and @100 per query set, through an InProcessDenseIndex laid out with `lists` lists."""
    policy = PartitionPolicy(min_chunks=1, probe_percent=percent, lists_per_sqrt=lists / math.sqrt(len(vectors)))
    index = InProcessDenseIndex(vectors.shape[1], partitions=EXACT, merge_min_chunks=len(vectors) + 1)
    for number, vector in enumerate(vectors):
        index.replace_document("t", f"p{number}", [VectorChunk(f"p{number}", vector, {})])
    index.partition_policy = policy  # held exactly while filling, then laid out once
    index.compact()
    scope = index._scopes["t"]  # noqa: SLF001 - a probe: that the lists are those asked is checked
    assert isinstance(scope.partitions, CoarsePartitions) and abs(scope.partitions.lists - lists) <= 1
    out = {}
    for name, matrix in queries.items():
        at10, at100 = [], []
        for query in matrix:
            exact = np.argsort(-(vectors @ query))[:100]
            found = [int(chunk_id[1:]) for chunk_id, _ in index.search(query, 100, tenant="t")]
            at10.append(len(set(found[:10]) & set(exact[:10].tolist())) / 10)
            at100.append(len(set(found) & set(exact.tolist())) / 100)
        out[name] = (float(np.mean(at10)), float(np.mean(at100)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lists", default="90,180")
    parser.add_argument("--percent", default="3.3,10,15,20")
    args = parser.parse_args()
    vectors, queries = embedded()
    print(f"{len(vectors):,} passages; recall@10 / recall@100 against exact search")
    for lists in (int(n) for n in args.lists.split(",")):
        for percent in (float(p) for p in args.percent.split(",")):
            cells = "  ".join(
                f"{name} {r10:.3f} / {r100:.3f}"
                for name, (r10, r100) in recall(vectors, queries, lists, percent).items()
            )
            print(f"lists {lists:>5}  probed {percent:>5.1f} %  {cells}", flush=True)


if __name__ == "__main__":
    main()
