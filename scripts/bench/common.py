"""What every bench section shares: the run configuration, result records, latency
statistics, /proc readings and the SciFact data (whole, or a small judged subset)."""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragrpc.evaluation import BeirDataset, load_beir
from scripts.processes import REPO

BENCH_DIR = REPO / ".bench"
SHARED_EVAL = REPO.parent / "shared" / "eval"
SCIFACT_DIR = SHARED_EVAL / "ir" / "scifact"
PDF_DIR = SHARED_EVAL / "docs" / "pdf"
DOCS_DIR = SHARED_EVAL / "docs"


@dataclass(frozen=True)
class BenchConfig:
    """Sizes of one run; `quick` shrinks every section to a smoke test."""

    quick: bool = False
    bench_dir: Path = BENCH_DIR
    query_sizes_override: tuple[int, ...] = ()
    ingest_docs_override: int = 0
    ingest_base_size: int = 0  # one-chunk documents bulk-loaded before the ingest section sends SciFact
    peer_docs_override: int = 0
    ndcg_docs_override: int = 0

    @property
    def ingest_docs(self) -> int:
        return self.ingest_docs_override or (120 if self.quick else 5183)

    @property
    def embed_sample(self) -> int:
        return 64 if self.quick else 256

    @property
    def embed_rounds(self) -> int:
        return 1 if self.quick else 3

    @property
    def ndcg_docs(self) -> int:
        """Corpus size for nDCG: the whole corpus (0) or a judged subset in quick mode."""
        return self.ndcg_docs_override or (300 if self.quick else 0)

    @property
    def query_sizes(self) -> tuple[int, ...]:
        return self.query_sizes_override or ((1_000,) if self.quick else (10_000, 100_000))

    @property
    def pool_size(self) -> int:
        """Length of the cached text pool; every collection size is a prefix of it."""
        return 1_000 if self.quick else 100_000

    @property
    def latency_queries(self) -> int:
        return 20 if self.quick else 150

    @property
    def concurrency_seconds(self) -> float:
        return 3.0 if self.quick else 12.0

    @property
    def concurrency_levels(self) -> tuple[int, ...]:
        return (1, 4) if self.quick else (1, 4, 16)

    @property
    def peer_docs(self) -> int:
        return self.peer_docs_override or (200 if self.quick else 0)

    @property
    def onnx_cache(self) -> Path:
        return self.bench_dir / "onnx-cache"


@dataclass
class Figure:
    name: str
    value: float | None
    unit: str
    ratio: float | None = None  # against the reference named in `versus`
    versus: str = ""
    note: str = ""


@dataclass
class SectionResult:
    name: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)  # raw numbers for the JSON
    seconds: float = 0.0
    error: str = ""

    def add(
        self,
        name: str,
        value: float | None,
        unit: str,
        *,
        ratio: float | None = None,
        versus: str = "",
        note: str = "",
    ) -> Figure:
        figure = Figure(name, None if value is None else float(value), unit, ratio, versus, note)
        self.figures.append(figure)
        return figure


def percentile(values: Sequence[float], q: float) -> float:
    """q-th percentile (0-100) by linear interpolation; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/mean in milliseconds of latencies given in seconds."""
    ms = [s * 1000.0 for s in samples_s]
    return {
        "n": float(len(ms)),
        "p50": percentile(ms, 50),
        "p95": percentile(ms, 95),
        "p99": percentile(ms, 99),
        "mean": statistics.fmean(ms) if ms else float("nan"),
    }


def time_each(fn: Callable[[Any], Any], items: Sequence[Any], warmup: int = 2) -> list[float]:
    """Seconds of fn(item) for each item, after `warmup` untimed calls."""
    for item in list(items)[:warmup]:
        fn(item)
    out = []
    for item in items:
        started = time.perf_counter()
        fn(item)
        out.append(time.perf_counter() - started)
    return out


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


@contextmanager
def stopwatch() -> Iterator[Callable[[], float]]:
    started = time.perf_counter()
    yield lambda: time.perf_counter() - started


def proc_status_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process in kB, from /proc/PID/status."""
    out: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (all threads), from /proc/PID/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def load_scifact(docs: int = 0, seed: int = 13) -> BeirDataset:
    """SciFact train; with docs > 0 a subset of about that many documents that still holds
    every relevant document of the queries it keeps (so nDCG stays meaningful, not comparable)."""
    dataset = load_beir(SCIFACT_DIR, "train")
    if docs <= 0 or docs >= len(dataset.corpus):
        return dataset
    keep: dict[str, None] = {}
    qrels: dict[str, dict[str, int]] = {}
    for qid in sorted(dataset.qrels):
        judged = [d for d in dataset.qrels[qid] if d in dataset.corpus]
        if len(keep) + len(judged) > docs // 2:
            break
        keep.update(dict.fromkeys(judged))
        qrels[qid] = dataset.qrels[qid]
    others = [d for d in dataset.corpus if d not in keep]
    random.Random(seed).shuffle(others)
    for doc_id in others[: max(0, docs - len(keep))]:
        keep[doc_id] = None
    corpus = {d: dataset.corpus[d] for d in dataset.corpus if d in keep}
    queries = {q: t for q, t in dataset.queries.items() if q in qrels}
    return BeirDataset(corpus=corpus, queries=queries, qrels=qrels)


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None or value != value:  # None or nan
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:.2f}"


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (the supervisor's workers and their helpers), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    tree, pending = [], [pid]
    while pending:
        current = pending.pop()
        tree.append(current)
        pending += children.get(current, [])
    return tree
