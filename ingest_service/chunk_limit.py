"""The per-document chunk limit (RAGRPC_MAX_CHUNKS_PER_DOCUMENT): what one document may cost.

The planner checks it right after chunking, before anything is embedded or written, so a
document over the limit is refused with nothing of it stored (a replacement leaves the previous
version ACTIVE). The count is of stored rows: every draft, retrievable and PARENT alike (a
hierarchical plan stores both; only retrievable ones are embedded, but parents are written too).
"""

from __future__ import annotations

from ragrpc import errors
from ragrpc.models import ChunkDraft, ChunkKind

SETTING = "RAGRPC_MAX_CHUNKS_PER_DOCUMENT"
REASON = "TOO_MANY_CHUNKS"


def checked_chunk_limit(limit: int) -> int:
    """`limit` when it is a usable limit; there is no "unlimited" value, 0 or less is a configuration error."""
    if limit < 1:
        raise ValueError(f"{SETTING} must be at least 1 (got {limit}); there is no unlimited setting")
    return limit


def enforce_chunk_limit(drafts: list[ChunkDraft], limit: int) -> None:
    """Raises LimitExceededError (RESOURCE_EXHAUSTED, reason TOO_MANY_CHUNKS) when `drafts` would
    store more than `limit` chunk rows."""
    count = len(drafts)
    if count <= limit:
        return
    parents = sum(1 for d in drafts if d.kind == ChunkKind.PARENT)
    detail = f" ({count - parents} retrievable + {parents} parent)" if parents else ""
    raise errors.LimitExceededError(
        f"the document would be stored as {count} chunks{detail}, more than the limit of {limit} per document "
        f"({SETTING}); nothing of it was stored: split the document or ingest it with larger chunks",
        reason=REASON,
        metadata={"setting": SETTING, "limit": str(limit), "chunk_count": str(count)},
    )
