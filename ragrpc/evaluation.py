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

Page-level metrics (look-alike documents: one target page per question), over ranked chunk hits
that carry a document id and a 1-based page range (page_start..page_end, 0..0 when the format
has no pages); every hit counts at its own rank (hits are chunks, not deduplicated documents):
  document@k   1 when a hit of the target document is among the top k hits
  page@k       1 when a hit of the target document whose page range holds the target page is
               among the top k hits
  MRR@k        1 / rank of the first such right-page hit in the top k, 0 if none
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


# --- page-level metrics -------------------------------------------------------------------


@dataclass(frozen=True)
class PageHit:
    """One ranked chunk: its document and the 1-based pages its text comes from (0 when none)."""

    document_id: str
    page_start: int
    page_end: int

    def holds(self, document_id: str, page: int) -> bool:
        return self.document_id == document_id and 0 < self.page_start <= page <= self.page_end


@dataclass(frozen=True)
class PageTarget:
    """Where the answer of a question sits: a document and a 1-based page."""

    document_id: str
    page: int


def document_at_k(hits: Sequence[PageHit], target: PageTarget, k: int) -> float:
    return 1.0 if any(hit.document_id == target.document_id for hit in hits[:k]) else 0.0


def page_at_k(hits: Sequence[PageHit], target: PageTarget, k: int) -> float:
    return 1.0 if any(hit.holds(target.document_id, target.page) for hit in hits[:k]) else 0.0


def page_mrr_at_k(hits: Sequence[PageHit], target: PageTarget, k: int) -> float:
    for rank, hit in enumerate(hits[:k], 1):
        if hit.holds(target.document_id, target.page):
            return 1.0 / rank
    return 0.0


def evaluate_pages(
    runs: Mapping[str, Sequence[PageHit]],
    targets: Mapping[str, PageTarget],
    document_k: Sequence[int] = (1, 5),
    page_k: Sequence[int] = (5, 10),
    mrr_k: int = 10,
) -> dict[str, float]:
    """Means over the questions of `targets` of document@k, page@k and MRR@k of the right page,
    keyed "doc@1", "page@5", "mrr@10", ...; a question missing from `runs` scores 0."""
    if not targets:
        raise ValueError("no questions")
    totals: dict[str, float] = {f"doc@{k}": 0.0 for k in document_k}
    totals.update({f"page@{k}": 0.0 for k in page_k})
    totals[f"mrr@{mrr_k}"] = 0.0
    for question_id, target in targets.items():
        hits = runs.get(question_id, ())
        for k in document_k:
            totals[f"doc@{k}"] += document_at_k(hits, target, k)
        for k in page_k:
            totals[f"page@{k}"] += page_at_k(hits, target, k)
        totals[f"mrr@{mrr_k}"] += page_mrr_at_k(hits, target, mrr_k)
    return {key: total / len(targets) for key, total in totals.items()}
