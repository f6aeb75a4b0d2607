"""make bench: the benchmark suite of ragrpc (python -m scripts.bench [--quick] [--sections ...]).

Sections: ingest, embed, query, concurrency, peers; see each module's docstring. Data and
caches live under .bench/ (gitignored); tables go to stdout, every number to JSON."""
