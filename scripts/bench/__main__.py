"""python -m scripts.bench [--quick] [--sections ingest,...,startup,scale] [--scale-sizes 10000,1000000]
[--scale-lite-max-size 100000] [--json P]

Runs the chosen sections in order (a failing section is reported and the others still
run), prints one table per section and writes all numbers as JSON (default
.bench/results.json). --quick shrinks every section to a smoke test of a few minutes; the
full run takes 30-60 min on 2 cores the first time (embeddings are cached under .bench/).
On a shared machine compare ratios measured in the same run, not absolute numbers.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scripts.bench import report
from scripts.bench.common import BENCH_DIR, BenchConfig, SectionResult

SECTIONS = (
    "ingest",
    "ingest_ceiling",
    "embed",
    "query",
    "wal",
    "concurrency",
    "peers",
    "startup",
    "startup_snapshots",
    "scale",
    "uploads",
    "index_memory",
    "bm25_scale",
)


def run_section(name: str, config: BenchConfig, context: dict[str, Any]) -> SectionResult:
    runner: Callable[[], SectionResult]
    if name == "ingest":
        from scripts.bench import ingest

        runner = lambda: ingest.run(config)  # noqa: E731
    elif name == "ingest_ceiling":
        from scripts.bench import ingest_ceiling

        runner = lambda: ingest_ceiling.run(config, context.get("ceiling_stores", ()))  # noqa: E731
    elif name == "embed":
        from scripts.bench import embed

        runner = lambda: embed.run(config)  # noqa: E731
    elif name == "query":
        from scripts.bench import query

        runner = lambda: query.run(config, context.get("vector_backend", "onnx-int8"))  # noqa: E731
    elif name == "wal":
        from scripts.bench import wal

        runner = lambda: wal.run(config, context.get("vector_backend", "onnx-int8"))  # noqa: E731
    elif name == "concurrency":
        from scripts.bench import concurrency

        runner = lambda: concurrency.run(  # noqa: E731
            config, context.get("concurrency_stores", ()), context.get("concurrency_size", 0)
        )
    elif name == "peers":
        from scripts.bench import peers

        runner = lambda: peers.run(config, context)  # noqa: E731
    elif name == "startup":
        from scripts.bench import startup

        runner = lambda: startup.run(config, config.query_sizes_override)  # noqa: E731
    elif name == "startup_snapshots":
        from scripts.bench import startup

        runner = lambda: startup.run_from_snapshots(  # noqa: E731
            config, context.get("scale_sizes", ()), context.get("scale_backends", ())
        )
    elif name == "scale":
        from scripts.bench import scale

        runner = lambda: scale.run(  # noqa: E731
            config,
            context.get("scale_sizes", ()),
            context.get("scale_backends", ()),
            context.get("scale_lite_max_size", 0),
        )
    elif name == "uploads":
        from scripts.bench import uploads

        runner = lambda: uploads.run(config)  # noqa: E731
    elif name == "index_memory":
        from scripts.bench import index_memory

        runner = lambda: index_memory.run(config)  # noqa: E731
    elif name == "bm25_scale":
        from scripts.bench import bm25_scale

        runner = lambda: bm25_scale.run(config)  # noqa: E731
    else:
        raise ValueError(f"unknown section {name!r}; use {', '.join(SECTIONS)}")
    started = time.perf_counter()
    try:
        result = runner()
    except Exception as exc:  # noqa: BLE001 - one broken section must not hide the others
        traceback.print_exc()
        result = SectionResult(name, error=f"{type(exc).__name__}: {exc}")
    result.seconds = time.perf_counter() - started
    return result


def update_context(result: SectionResult, context: dict[str, Any]) -> None:
    """Figures later sections use: the fastest backend, ragrpc's ingestion rate."""
    if result.name == "embed" and "fastest" in result.data:
        context["vector_backend"] = result.data["fastest"]
    if result.name == "ingest" and "grpc" in result.data:
        grpc_run = result.data["grpc"]
        if grpc_run.get("seconds"):
            context["ragrpc_docs_per_s"] = grpc_run["documents"] / grpc_run["seconds"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test of a few minutes")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    parser.add_argument("--json", default=str(BENCH_DIR / "results.json"), help="where to write all numbers")
    parser.add_argument("--query-sizes", default="", help="collection sizes of the query section, e.g. 10000")
    parser.add_argument("--ingest-docs", type=int, default=0, help="SciFact documents the ingest section sends")
    parser.add_argument(
        "--ingest-base-size",
        type=int,
        default=0,
        help="ingest section: documents already in the collection (bulk-loaded) when SciFact is sent, e.g. 100000",
    )
    parser.add_argument("--peer-docs", type=int, default=0, help="SciFact subset for peers (0: whole corpus)")
    parser.add_argument("--scale-sizes", default="", help="scale section sizes (default 10000,100000)")
    parser.add_argument("--scale-backends", default="", help="milvus-lite and/or milvus-2.3.5 (default both)")
    parser.add_argument(
        "--scale-lite-max-size", type=int, default=0, help="scale section: milvus-lite only up to this size (0: all)"
    )
    parser.add_argument(
        "--ceiling-stores", default="", help="ingest_ceiling section: milvus-lite and/or milvus-2.3.5 (default both)"
    )
    parser.add_argument("--ndcg-docs", type=int, default=0, help="SciFact subset for embed nDCG (0: whole corpus)")
    parser.add_argument(
        "--concurrency-stores",
        default="",
        help="concurrency section: milvus-lite and/or milvus-2.3.5, each STORE or STORE@CHUNKS (default both)",
    )
    parser.add_argument("--concurrency-size", type=int, default=0, help="concurrency section: chunks (default 100000)")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.sections.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {unknown}; choose from {SECTIONS}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sizes = tuple(int(x) for x in args.query_sizes.split(",") if x.strip())
    config = BenchConfig(
        quick=args.quick,
        query_sizes_override=sizes,
        ingest_docs_override=args.ingest_docs,
        ingest_base_size=args.ingest_base_size,
        peer_docs_override=args.peer_docs,
        ndcg_docs_override=args.ndcg_docs,
    )
    facts = report.machine_facts()
    context: dict[str, Any] = {
        "scale_sizes": tuple(int(x) for x in args.scale_sizes.split(",") if x.strip()),
        "scale_backends": tuple(x.strip() for x in args.scale_backends.split(",") if x.strip()),
        "scale_lite_max_size": args.scale_lite_max_size,
        "ceiling_stores": tuple(x.strip() for x in args.ceiling_stores.split(",") if x.strip()),
        "concurrency_stores": tuple(x.strip() for x in args.concurrency_stores.split(",") if x.strip()),
        "concurrency_size": args.concurrency_size,
    }
    results: list[SectionResult] = []
    for name in names:
        print(f"[bench] {name}{' (quick)' if args.quick else ''} ...", file=sys.stderr, flush=True)
        result = run_section(name, config, context)
        result.data["commit"] = report.machine_facts()["commit"]  # the tree moves under a long run
        update_context(result, context)
        results.append(result)
        print(report.render_section(result, facts["cpu_count"]), file=sys.stderr, flush=True)
        report.write_json(Path(args.json), report.to_json(results, facts, quick=args.quick))  # partial results
    report.print_report(results, facts, sys.stdout)
    report.write_json(Path(args.json), report.to_json(results, facts, quick=args.quick))
    print(f"\nwrote {args.json}")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
