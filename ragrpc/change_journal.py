"""Whether the registry's change journal is used (RAGRPC_REGISTRY_CHANGE_JOURNAL): both services decide
it alike from the same setting and the same store, the ingest service to write it
(ingest_service.change_journal), the query service to read it (query_service.registry_follower)."""

from __future__ import annotations

from ragrpc import errors
from ragrpc.config import Settings
from ragrpc.store.base import ChunkStore

_CHOICES = ("auto", "on", "off")


def change_journal_enabled(settings: Settings, chunks: ChunkStore) -> bool:
    """auto: on where the store is embedded (milvus-lite: a filter on updated_at scans the registry)."""
    choice = settings.registry_change_journal.strip().lower()
    if choice not in _CHOICES:
        raise errors.PreconditionError(
            f"RAGRPC_REGISTRY_CHANGE_JOURNAL must be one of {', '.join(_CHOICES)}, "
            f"got {settings.registry_change_journal!r}"
        )
    return chunks.embedded if choice == "auto" else choice == "on"
