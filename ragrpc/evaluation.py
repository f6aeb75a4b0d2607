"""Retrieval evaluation: BEIR-layout data sets and ranking metrics.

BEIR layout of a data set directory:

    corpus*.jsonl        {"_id", "title", "text"} per line (several parts are concatenated,
                         in file-name order)
    queries.jsonl        {"_id", "text"} per line
    qrels/<split>.tsv    query-id <TAB> corpus-id <TAB> score, with a header line

Metrics (per query, then averaged over the queries that have judgments in the qrels):
  nDCG@k    gain = graded relevance, discount 1 / log2(rank + 1), ideal from the qrels
  Recall@k  relevant (grade > 0) documents in the top k / all relevant documents
  MRR@k     1 / rank of the first relevant document in the top k, 0 if none
A judged query missing from the run counts with an empty ranking (all metrics 0).
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ragrpc.models import ScoredChunk

logger = logging.getLogger(__name__)

Qrels = Mapping[str, Mapping[str, int]]  # query id -> document id -> grade
Run = Mapping[str, Sequence[str]]  # query id -> ranked document ids, best first


@dataclass(frozen=True)
class BeirDocument:
    doc_id: str
    title: str
    text: str

    @property
    def full_text(self) -> str:
        """Title and text joined by a space (as BEIR baselines index them)."""
        return f"{self.title} {self.text}".strip()


@dataclass(frozen=True)
class BeirDataset:
    corpus: dict[str, BeirDocument]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]

    def judged_queries(self) -> dict[str, str]:
        """Queries that have judgments (the ones metrics are computed over)."""
        return {qid: text for qid, text in self.queries.items() if qid in self.qrels}


def load_beir(directory: str | Path, split: str = "test") -> BeirDataset:
    """Load a BEIR-layout data set; FileNotFoundError when a part is missing."""
    root = Path(directory)
    corpus_files = sorted(root.glob("corpus*.jsonl"))
    if not corpus_files:
        raise FileNotFoundError(f"no corpus*.jsonl in {root}")
    corpus: dict[str, BeirDocument] = {}
    for path in corpus_files:
        for record in _read_jsonl(path):
            doc_id = str(record["_id"])
            corpus[doc_id] = BeirDocument(doc_id, record.get("title") or "", record.get("text") or "")
    queries = {str(r["_id"]): r.get("text") or "" for r in _read_jsonl(root / "queries.jsonl")}
    qrels = load_qrels(root / "qrels" / f"{split}.tsv")
    logger.info("loaded %s: %d documents, %d queries, %d judged", root.name, len(corpus), len(queries), len(qrels))
    return BeirDataset(corpus=corpus, queries=queries, qrels=qrels)


def load_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    """query id -> document id -> grade from a TSV with a header line."""
    qrels: dict[str, dict[str, int]] = {}
    with Path(path).open(newline="", encoding="utf-8") as handle:
        rows = csv.reader(handle, delimiter="\t")
        next(rows, None)  # header
        for row in rows:
            if not row or not row[0].strip():
                continue
            query_id, doc_id, grade = row[0].strip(), row[1].strip(), int(float(row[2]))
            qrels.setdefault(query_id, {})[doc_id] = grade
    return qrels


def _read_jsonl(path: Path) -> Iterable[dict]:
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                yield json.loads(line)


# --- metrics ----------------------------------------------------------------------------


def ndcg_at_k(ranking: Sequence[str], judgments: Mapping[str, int], k: int) -> float:
    ideal = sorted((grade for grade in judgments.values() if grade > 0), reverse=True)[:k]
    ideal_dcg = sum(grade / math.log2(rank + 1) for rank, grade in enumerate(ideal, 1))
    if ideal_dcg <= 0:
        return 0.0
    dcg = sum(
        max(judgments.get(doc_id, 0), 0) / math.log2(rank + 1) for rank, doc_id in enumerate(_dedupe(ranking)[:k], 1)
    )
    return dcg / ideal_dcg


def recall_at_k(ranking: Sequence[str], judgments: Mapping[str, int], k: int) -> float:
    relevant = {doc_id for doc_id, grade in judgments.items() if grade > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(_dedupe(ranking)[:k])) / len(relevant)


def mrr_at_k(ranking: Sequence[str], judgments: Mapping[str, int], k: int) -> float:
    for rank, doc_id in enumerate(_dedupe(ranking)[:k], 1):
        if judgments.get(doc_id, 0) > 0:
            return 1.0 / rank
    return 0.0


def _dedupe(ranking: Sequence[str]) -> list[str]:
    """A document counts at its first position only."""
    return list(dict.fromkeys(ranking))


def evaluate(run: Run, qrels: Qrels, k_values: Sequence[int] = (10,)) -> dict[str, float]:
    """Mean nDCG@k, Recall@k and MRR@k over the judged queries, keyed "ndcg@10", ..."""
    if not qrels:
        raise ValueError("no judged queries")
    metrics = {"ndcg": ndcg_at_k, "recall": recall_at_k, "mrr": mrr_at_k}
    totals = {f"{name}@{k}": 0.0 for k in k_values for name in metrics}
    for query_id, judgments in qrels.items():
        ranking = run.get(query_id, ())
        for k in k_values:
            for name, metric in metrics.items():
                totals[f"{name}@{k}"] += metric(ranking, judgments, k)
    return {key: total / len(qrels) for key, total in totals.items()}


def doc_ranking_from_chunks(chunk_hits: Iterable[ScoredChunk]) -> list[str]:
    """Document ids ranked by their best chunk's score (ties: first seen first)."""
    best: dict[str, float] = {}
    for hit in chunk_hits:
        document_id = hit.chunk.document_id
        if document_id not in best or hit.score > best[document_id]:
            best[document_id] = hit.score
    first_seen = {document_id: position for position, document_id in enumerate(best)}
    return sorted(best, key=lambda document_id: (-best[document_id], first_seen[document_id]))
