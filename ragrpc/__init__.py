"""ragrpc: shared core of the ingest and query services."""
