"""make bench: the benchmark suite of ragrpc (python -m scripts.bench [--quick] [--sections ...]).

Sections (scripts/bench/__main__.py SECTIONS): ingest, embed, query, wal, concurrency, peers, startup,
scale, uploads, index_memory, bm25_scale; see each module's docstring. Data and caches live under .bench/
(gitignored); tables go to stdout, every number to JSON, and the figures worth keeping to
docs/benchmarks.md."""
