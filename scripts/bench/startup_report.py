"""Writes the startup_snapshots section's rows into docs/benchmarks.md (between its markers; the rest of
the file is kept): the query service's start in full and from its index snapshot, its memory, hybrid
Retrieve over gRPC next to the store's and numpy's floors, and freshness with snapshots on."""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path
from typing import Any

from scripts.bench.report import write_docs_section

BEGIN = "<!-- startup_snapshots:begin (written by scripts/bench/startup_report.py) -->"
END = "<!-- startup_snapshots:end -->"


def _memory(start: dict[str, Any]) -> str:
    """RSS (private / file-backed) of the one process, or the workers' summed Pss and each one's private part."""
    memory = list(start["memory"].values())
    if len(memory) == 1:
        m = memory[0]
        return f"{m['VmRSS']:,.0f} MiB ({m.get('RssAnon', 0):,.0f} private / {m.get('RssFile', 0):,.0f} file)"
    pss = sum(m.get("Pss", 0) for m in memory)
    private = " + ".join(f"{m.get('RssAnon', 0):,.0f}" for m in memory)
    rss = " + ".join(f"{m['VmRSS']:,.0f}" for m in memory)
    return f"RSS {rss} MiB; private {private}; Pss sum {pss:,.0f} MiB"


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| store | chunks | full load: start to SERVING, RSS (build process peak) | snapshot "
        "| from the snapshot: start to SERVING, RSS "
        "| 2 processes from it: all SERVING, memory | Retrieve hybrid top-10 p50 / p99 (first call) | floors: store "
        "dense top-100 p50, exact numpy p50 | dense Retrieve recall@10 vs exact | ingest -> searchable, delete -> gone "
        "(median of 5) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        retrieve, fresh = row["retrieve_hybrid"], row["freshness"]
        lines.append(
            f"| {row['backend']} | {row['size']:,} | {row['full']['serving_s']:.1f} s, {_memory(row['full'])}"
            f"{_build_peak(row['full'])} | "
            f"{row['snapshot_mib']:,.0f} MiB | **{row['snapshot']['serving_s']:.1f} s**, {_memory(row['snapshot'])} | "
            f"{row['snapshot_2proc']['serving_s']:.1f} s, {_memory(row['snapshot_2proc'])} | "
            f"**{retrieve['p50']:.1f}** / {retrieve['p99']:.1f} ms ({retrieve['first_ms']:.0f} ms) | "
            f"{row['store_dense_ms']['p50']:.1f} ms, {row['exact_numpy_ms']['p50']:.1f} ms | "
            f"{_recall(row)} | "
            f"{fresh['ingest_to_searchable_s']:.2f} s, {fresh['delete_to_gone_s']:.3f} s |"
        )
    return lines


def _build_peak(start: dict[str, Any]) -> str:
    peak = start.get("build_peak_mib")
    return " (in the service itself)" if peak is None else f" ({peak:,.0f} MiB)"


def _recall(row: dict[str, Any]) -> str:
    recall = row.get("dense_recall_at_10")
    return "not measured (a run before this column)" if recall is None else f"{recall:.3f}"


def _stages(rows: list[dict[str, Any]]) -> list[str]:
    names = list(dict.fromkeys(name for row in rows for name in row["retrieve_hybrid"]["stages"]))
    lines = ["| store | chunks | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    for row in rows:
        stages = row["retrieve_hybrid"]["stages"]
        cells = " | ".join(f"{stages[name]:.1f}" if name in stages else "" for name in names)
        lines.append(f"| {row['backend']} | {row['size']:,} | {cells} |")
    return lines


def _command() -> str:
    return " ".join(["python -m scripts.bench", *sys.argv[1:]]) if sys.argv[1:] else "python -m scripts.bench"


def section(rows: list[dict[str, Any]], command: str = "") -> list[str]:
    today = datetime.date.today().isoformat()
    runs = command or f"one run (`{_command()}`)"
    return [
        "## The query service's start from its index snapshot "
        '(`make bench BENCH_ARGS="--sections startup_snapshots"`)',
        "",
        f"Measured {today} on this project's {os.cpu_count()}-core machine, {runs}: the scale "
        "section's collections (one-chunk documents of real text, bulk-loaded), the real `python -m query_service` "
        "with the default settings and `RAGRPC_INDEX_SNAPSHOT_DIR`, started three times: on an empty snapshot "
        "directory (a full load, run by a child process that writes the snapshot and exits; the service then "
        "loads that snapshot before it says SERVING, `RAGRPC_INDEX_BUILD_IN_CHILD`), from that snapshot, and as two "
        "processes (`RAGRPC_QUERY_PROCESSES=2`) from it. Start to SERVING: spawn to health SERVING (all workers' "
        "SERVING for two), model load included. Memory right after SERVING, from /proc: RSS with its private "
        "(RssAnon) and file-backed (RssFile: the memory-mapped snapshot, shared) parts; for two processes each "
        "one's and the sum of their Pss (shared pages counted once). `Retrieve` over gRPC, one call at a time, 100 "
        "SciFact claims, on the second start; freshness on the second start too: this process ingests a one-chunk "
        "document (the ingest pipeline in-process) and asks the service for it over gRPC (sparse) every 10 ms.",
        "",
        *_table(rows),
        "",
        "Median milliseconds per stage of those `Retrieve` calls, as the service reports them:",
        "",
        *_stages(rows),
    ]


def write_report(rows: list[dict[str, Any]], docs: Path, command: str = "") -> None:
    write_docs_section(docs, BEGIN, END, section(rows, command))


def main(argv: list[str]) -> None:
    """python -m scripts.bench.startup_report RUN.json [RUN.json ...]: the section from the rows of several
    runs (one per store, say), each named by the command recorded in its JSON."""
    import json

    rows, commands = [], []
    for name in argv:
        run = json.loads(Path(name).read_text())
        rows += run["sections"]["startup_snapshots"]["data"]["rows"]
        commands.append(f"`{run['machine'].get('command', name)}` at {run['machine'].get('commit', '?')}")
    runs = "one run" if len(argv) == 1 else f"{len(argv)} runs"
    write_report(rows, Path("docs"), command=f"{runs} ({'; '.join(commands)})")


if __name__ == "__main__":
    main(sys.argv[1:])
