"""Deterministic fakes shipped for tests: a hashing embedder and in-memory stores that honour
the same contracts as the real ones (filters are evaluated with FilterExpr.matches)."""

from ragrpc.testing.fake_embedder import HashingEmbedder
from ragrpc.testing.memory_store import InMemoryChunkStore, InMemoryDocumentRegistry, all_keys, all_records

__all__ = ["HashingEmbedder", "InMemoryChunkStore", "InMemoryDocumentRegistry", "all_keys", "all_records"]
