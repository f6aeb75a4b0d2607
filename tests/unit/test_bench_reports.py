"""The concurrency and startup_snapshots bench sections' report writers: a table per store between their
markers in docs/benchmarks.md (the rest of the file kept, a second run replacing the first), and the plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scripts.bench import concurrency_report, startup_report


def _level(callers: int, per_s: float, **codes: int) -> dict[str, Any]:
    return {
        "callers": callers,
        "ok": int(per_s * 12),
        "codes": {"OK": int(per_s * 12), **codes},
        "seconds": 12.0,
        "per_s": per_s,
        "p50": 1000 * callers / per_s,
        "p99": 2000 * callers / per_s,
        "refused_p50": None,
        "refused_p99": None,
        "client_cpu_s": 1.2,
        "service_cpu_s": 20.0,
        "store_cpu_s": 3.0,
    }


def _store(name: str) -> dict[str, Any]:
    runs = [
        {
            "processes": processes,
            "serving_s": 5.0 * processes,
            "levels": {
                call: [_level(c, 50.0 * processes * (1 if call == "Retrieve" else 0.5)) for c in (1, 4, 16, 64)]
                for call in ("Retrieve", "Ask")
            },
        }
        for processes in (1, 2)
    ]
    runs[0]["levels"]["Retrieve"][3]["codes"]["RESOURCE_EXHAUSTED"] = 3
    runs[0]["levels"]["Retrieve"][2]["connected"] = [16]  # one process: nothing to split
    runs[1]["levels"]["Retrieve"][2]["connected"] = [10, 6]
    limit = {
        **_level(64, 40.0, RESOURCE_EXHAUSTED=900),
        "limit": 8,
        "deadline_s": 2.0,
        "refused_p50": 0.8,
        "refused_p99": 2.5,
    }
    return {"store": name, "size": 100_000, "runs": runs, "limit": limit}


def test_the_concurrency_report_writes_a_table_per_store_and_the_plot(tmp_path: Path) -> None:
    (tmp_path / "benchmarks.md").write_text(
        f"# Benchmarks\n\nbefore\n\n{concurrency_report.BEGIN}\nold figures\n{concurrency_report.END}\n\nafter\n"
    )
    stores = [_store("milvus-lite"), _store("milvus-2.3.5")]
    concurrency_report.write_report(stores, tmp_path)
    concurrency_report.write_report(stores, tmp_path)  # the latest run replaces the previous one
    text = (tmp_path / "benchmarks.md").read_text()
    assert "old figures" not in text and text.count(concurrency_report.BEGIN) == 1
    assert text.startswith("# Benchmarks\n\nbefore\n") and text.rstrip().endswith("after")
    assert "**milvus-lite, 100,000 chunks**" in text and "**milvus-2.3.5, 100,000 chunks**" in text
    assert "| 16 | 50.0/s, 320 / 640 ms | 25.0/s, 640 / 1280 ms | 100.0/s, 160 / 320 ms (10+6 connections) |" in text
    assert "1 proc Retrieve: RESOURCE_EXHAUSTED 3" in text
    assert "900 refused with RESOURCE_EXHAUSTED in p50 0.8 ms / p99 2.5 ms, 0 DEADLINE_EXCEEDED" in text
    assert (tmp_path / "concurrency.png").read_bytes()[:4] == b"\x89PNG"


def test_the_startup_report_writes_its_table(tmp_path: Path) -> None:
    memory = {"VmRSS": 900.0, "VmHWM": 950.0, "RssAnon": 500.0, "RssFile": 400.0, "Pss": 700.0}
    row = {
        "backend": "milvus-2.3.5",
        "size": 1_000_000,
        "full": {"serving_s": 290.0, "memory": {"1": memory}, "build_peak_mib": 2600.0},
        "snapshot": {"serving_s": 12.5, "memory": {"2": memory}},
        "snapshot_2proc": {"serving_s": 20.0, "memory": {"3": memory, "4": memory}},
        "snapshot_mib": 393.0,
        "retrieve_hybrid": {"first_ms": 80.0, "p50": 21.5, "p99": 60.0, "stages": {"embed_query": 4.0}},
        "freshness": {"ingest_to_searchable_s": 0.6, "delete_to_gone_s": 0.004},
        "store_dense_ms": {"p50": 12.3, "p99": 20.0},
        "exact_numpy_ms": {"p50": 82.0, "p99": 90.0},
    }
    startup_report.write_report([row], tmp_path)
    text = (tmp_path / "benchmarks.md").read_text()
    assert "| milvus-2.3.5 | 1,000,000 | 290.0 s, 900 MiB (500 private / 400 file) (2,600 MiB) | 393 MiB |" in text
    del row["full"]["build_peak_mib"]  # a full load in the service itself (RAGRPC_INDEX_BUILD_IN_CHILD=false)
    startup_report.write_report([row], tmp_path)
    text = (tmp_path / "benchmarks.md").read_text()
    assert "| 290.0 s, 900 MiB (500 private / 400 file) (in the service itself) | 393 MiB |" in text
    assert "**12.5 s**" in text and "Pss sum 1,400 MiB" in text and "**21.5** / 60.0 ms (80 ms)" in text
    assert "| milvus-2.3.5 | 1,000,000 | 4.0 |" in text


def test_the_build_process_peak_is_read_from_the_service_log() -> None:
    from scripts.bench.startup import build_peak_mib

    line = (
        "2026-12-07 06:16:37,790 INFO query [-] query_service.snapshot_builder: the index build process wrote the "
        "snapshot in 32.0s (its peak RSS 670 MiB)\n"
    )
    assert build_peak_mib("other line\n" + line) == 670.0
    assert build_peak_mib("a start from a snapshot: no build process\n") is None
