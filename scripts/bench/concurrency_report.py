"""Writes the concurrency section's figures into docs/benchmarks.md (between its `concurrency` markers;
the rest of the file is kept) and docs/concurrency.png (calls/s and p99 against callers, one line per
store, call and process count)."""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path
from typing import Any

from scripts.bench.report import write_docs_section

BEGIN = "<!-- concurrency:begin (written by scripts/bench/concurrency_report.py) -->"
END = "<!-- concurrency:end -->"
CALLS = ("Retrieve", "Ask")


def _cell(row: dict[str, Any]) -> str:
    """Calls/s and p50 / p99; with several processes, how the callers' connections split over them
    (SO_REUSEPORT hashes each connection to one: the busiest process sets the p99)."""
    split = row.get("connected") or []
    spread = f" ({'+'.join(map(str, split))} connections)" if len(split) > 1 else ""
    return f"{row['per_s']:.1f}/s, {row['p50']:.0f} / {row['p99']:.0f} ms{spread}"


def _errors(rows: list[dict[str, Any]]) -> str:
    codes: dict[str, int] = {}
    for row in rows:
        for code, count in row["codes"].items():
            if code != "OK":
                codes[code] = codes.get(code, 0) + count
    return ", ".join(f"{code} {count}" for code, count in sorted(codes.items())) or "none"


def _cpu(row: dict[str, Any]) -> str:
    """CPU cores busy meanwhile: load generator / service / store."""
    seconds = row["seconds"]
    store = row.get("store_cpu_s")
    store_part = f" / {store / seconds:.2f}" if store is not None else ""
    return f"{row['client_cpu_s'] / seconds:.2f} / {row['service_cpu_s'] / seconds:.2f}{store_part}"


def store_table(data: dict[str, Any]) -> list[str]:
    runs = data["runs"]
    header = ["callers"]
    for run in runs:
        for call in CALLS:
            header.append(f"{call}, {run['processes']} proc: calls/s, p50 / p99")
    header += [f"CPU cores busy, Retrieve, {run['processes']} proc: load generator / service / store" for run in runs]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    levels = [row["callers"] for row in runs[0]["levels"]["Retrieve"]]
    for index, callers in enumerate(levels):
        cells = [str(callers)]
        for run in runs:
            for call in CALLS:
                cells.append(_cell(run["levels"][call][index]))
        cells += [_cpu(run["levels"]["Retrieve"][index]) for run in runs]
        lines.append("| " + " | ".join(cells) + " |")
    errors = "; ".join(
        f"{run['processes']} proc {call}: {_errors(run['levels'][call])}" for run in runs for call in CALLS
    )
    starts = ", ".join(f"{run['processes']} proc {run['serving_s']:.1f} s" for run in runs)
    limit = data["limit"]
    refused = limit["codes"].get("RESOURCE_EXHAUSTED", 0)
    lines += [
        "",
        f"Calls that failed: {errors}. Start to SERVING (all workers): {starts}. Past the limit "
        f"(`RAGRPC_MAX_CONCURRENT_RPCS={limit['limit']}`, one process, {limit['callers']} callers of `Retrieve`, "
        f"a {limit['deadline_s']:.0f} s deadline each): {limit['codes'].get('OK', 0)} answered "
        f"({limit['per_s']:.1f}/s, p50 {limit['p50']:.0f} ms, p99 {limit['p99']:.0f} ms), {refused} refused with "
        f"RESOURCE_EXHAUSTED in p50 {_ms(limit['refused_p50'])} / p99 {_ms(limit['refused_p99'])}, "
        f"{limit['codes'].get('DEADLINE_EXCEEDED', 0)} DEADLINE_EXCEEDED.",
    ]
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def write_plot(stores: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    styles = {"milvus-lite": "-", "milvus-2.3.5": "--"}
    markers = {1: "o", 2: "s"}
    for column, call in enumerate(CALLS):
        for data in stores:
            for run in data["runs"]:
                rows = run["levels"][call]
                callers = [row["callers"] for row in rows]
                label = f"{data['store']} {data['size']:,}, {run['processes']} proc"
                style = styles.get(data["store"], "-") + markers.get(run["processes"], "^")
                axes[0][column].plot(callers, [row["per_s"] for row in rows], style, label=label)
                axes[1][column].plot(callers, [row["p99"] for row in rows], style, label=label)
        axes[0][column].set_title(f"{call}: calls/s ({os.cpu_count()} cores)")
        axes[1][column].set_title(f"{call}: p99 latency (ms)")
        axes[1][column].set_yscale("log")
        axes[1][column].set_xlabel("concurrent callers")
        for row_axes in axes:
            row_axes[column].set_xscale("log", base=2)
            row_axes[column].grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _command() -> str:
    return " ".join(["python -m scripts.bench", *sys.argv[1:]]) if sys.argv[1:] else "python -m scripts.bench"


def section(stores: list[dict[str, Any]]) -> list[str]:
    today = datetime.date.today().isoformat()
    lines = [
        '## Many callers at once (`make bench BENCH_ARGS="--sections concurrency"`)',
        "",
        f"Measured {today} on this project's {os.cpu_count()}-core machine, one run (`{_command()}`): the real "
        "`python -m query_service` (default settings, an index snapshot directory) over the scale section's "
        "collections (one-chunk documents of real text, bulk-loaded), as one process and as two "
        "(`RAGRPC_QUERY_PROCESSES=2`); callers in the bench process (grpc.aio), each on its own channel and "
        "connection, calling back to back for 12 s per level: `Retrieve` hybrid top-10 and `Ask` top-5 with the "
        "extractive answerer, over 200 SciFact claims. Latency: call start to status, OK calls only. CPU: cores "
        "busy during the `Retrieve` level, of the load generator (this process), the query service's processes and "
        "the store's. With two processes, a `Retrieve` cell says how the callers' connections split over them "
        "(from /proc): the kernel hashes each connection to one process (SO_REUSEPORT), and the busier one sets "
        "the p99.",
    ]
    for data in stores:
        lines += ["", f"**{data['store']}, {data['size']:,} chunks**", "", *store_table(data)]
    lines += ["", "![Calls/s and p99 against concurrent callers](concurrency.png)"]
    return lines


def write_report(stores: list[dict[str, Any]], docs: Path) -> None:
    write_plot(stores, docs / "concurrency.png")
    write_docs_section(docs, BEGIN, END, section(stores))
