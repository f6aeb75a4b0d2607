"""Writes the scale section's rows into docs/benchmarks.md (between its `scale` markers; the rest
of the file is kept) and docs/scale.png (Retrieve p50 and p99 against collection size, one line
per backend and mode, with the store's own search as the floor)."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from typing import Any

from scripts.bench.report import write_docs_section

MODES = ("dense", "sparse", "hybrid")


def _pair(row: dict[str, Any], key: str) -> str:
    return f"{row[key]['p50']:.1f} / {row[key]['p99']:.1f} ms"


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| backend | chunks | dense search | Retrieve hybrid p50 / p99 | dense p50 / p99 | sparse p50 / p99 | store "
        "dense top-100 p50 (floor) | exact numpy p50 | recall@10 of Retrieve dense / of the store | query service: "
        "start to SERVING | its RSS (per chunk) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        hybrid, dense, sparse = (_pair(row, f"retrieve_{mode}_ms") for mode in ("hybrid", "dense", "sparse"))
        retrieve_recall = row.get("retrieve_dense_recall_at_10")
        recalls = f"{retrieve_recall:.3f} / " if retrieve_recall is not None else ""
        lines.append(
            f"| {row['backend']} | {row['size']:,} | {row.get('dense_search', 'store')} | {hybrid} | {dense} | "
            f"{sparse} | {row['store_dense_ms']['p50']:.1f} ms | "
            f"{row['exact_numpy_ms']['p50']:.1f} ms | {recalls}{row['dense_recall_at_10']:.3f} | "
            f"{_service(row)} |"
        )
    return lines


def _service(row: dict[str, Any]) -> str:
    """The fresh query service process's start to SERVING | RSS (per chunk) cells."""
    if "service_serving_s" not in row:
        return f"{row['serving_s']:.1f} s (in the bench) | not measured"
    rss = row["service_rss_mib"]
    return f"{row['service_serving_s']:.1f} s | {rss:,.0f} MiB ({rss * 1024 * 1024 / row['size']:,.0f} B)"


def _stages(rows: list[dict[str, Any]]) -> list[str]:
    names = list(dict.fromkeys(name for row in rows for name in row.get("stages_hybrid_ms", {})))
    lines = ["| backend | chunks | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    for row in rows:
        stages = row.get("stages_hybrid_ms", {})
        cells = " | ".join(f"{stages[name]:.1f}" if name in stages else "" for name in names)
        lines.append(f"| {row['backend']} | {row['size']:,} | {cells} |")
    return lines


def write_plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for axis, stat in zip(axes, ("p50", "p99"), strict=True):
        for backend in sorted({r["backend"] for r in rows}):
            mine = sorted((r for r in rows if r["backend"] == backend), key=lambda r: r["size"])
            sizes = [r["size"] for r in mine]
            for mode, style in zip(MODES, ("-o", "-s", "-^"), strict=True):
                axis.plot(sizes, [r[f"retrieve_{mode}_ms"][stat] for r in mine], style, label=f"{backend} {mode}")
            axis.plot(sizes, [r["store_dense_ms"][stat] for r in mine], ":", label=f"{backend} store dense (floor)")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("chunks in the collection")
        axis.set_title(f"Retrieve top-10 {stat} (2 cores)")
        axis.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("milliseconds")
    axes[1].legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


BEGIN, END = "<!-- scale:begin (written by scripts/bench/scale_report.py) -->", "<!-- scale:end -->"


def write_report(rows: list[dict[str, Any]], docs: Path) -> None:
    write_plot(rows, docs / "scale.png")
    write_docs_section(docs, BEGIN, END, _section(rows))


def _command() -> str:
    """The bench command line this run was started with."""
    return " ".join(["python -m scripts.bench", *sys.argv[1:]]) if sys.argv[1:] else "python -m scripts.bench"


def _section(rows: list[dict[str, Any]]) -> list[str]:
    today = datetime.date.today().isoformat()
    return [
        '## Retrieve at collection size (`make bench BENCH_ARGS="--sections scale"`)',
        "",
        f"Measured {today} on this project's 2-core machine, one run (`{_command()}`): "
        "one-chunk documents of real text (SciFact and the shared documents' sentences) with vectors derived from "
        "2,048 embedded texts plus noise (scripts/bench/bulk.py), the default index (HNSW M 16, search ef 192), "
        "rank_bm25 over every chunk, 100 SciFact claims as queries, `Retrieve` top-10 through the retrieval pipeline "
        "in the "
        "bench process (query embedding with the default onnx-int8 backend included), default settings: dense search "
        "`RAGRPC_DENSE_SEARCH=auto` (in_process: exact search over the vectors the query service holds, on "
        "milvus-lite and on a server collection of at most 50k chunks; store: the server's HNSW index above that), "
        "one thread per query embedding (`RAGRPC_QUERY_EMBEDDING_THREADS`). Floors: the store's own dense search "
        "(top-100, tenant filter, ids only) and exact numpy search over the same matrix. Query service: a fresh "
        "`python -m query_service` process with the default settings over the collection, from spawn to health "
        "SERVING (model load, registry and index load included), and its resident memory then.",
        "",
        *_table(rows),
        "",
        "Median milliseconds per stage of `Retrieve` (hybrid):",
        "",
        *_stages(rows),
        "",
        "![Retrieve latency against collection size](scale.png)",
    ]
