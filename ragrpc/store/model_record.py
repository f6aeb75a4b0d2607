"""The embedding identity recorded on a collection, and the check that a service matches it.

The registry holds one record (under schema.MODEL_INFO_KEY in Milvus):

    {"provider": "local" | "openai", "model_id": str, "dimension": int, "metadata_keys": [str, ...]}

("metadata_keys": the filterable metadata keys of the chunks collection, ragrpc.store.metadata_fields;
absent from collections created before keys could be declared; not part of the identity checked here.)

The first writer records its identity; every later service start compares its own with it and is
refused with ModelMismatchError (FAILED_PRECONDITION) when the provider, the model or the dimension
differs: vectors of another model, or of the same model at another (Matryoshka) dimension, do not
compare. Collections written before providers existed record only model_id and dimension; a missing
provider reads as "local" (sentence-transformers, the only provider then).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ragrpc import errors

LOCAL_PROVIDER = "local"


@dataclass(frozen=True)
class EmbeddingIdentity:
    """What makes two services' vectors comparable."""

    model_id: str
    dimension: int
    provider: str = LOCAL_PROVIDER

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> EmbeddingIdentity:
        return cls(
            model_id=str(record.get("model_id", "")),
            dimension=int(record.get("dimension", -1)),
            provider=str(record.get("provider") or LOCAL_PROVIDER),
        )

    def to_record(self) -> dict[str, Any]:
        return {"provider": self.provider, "model_id": self.model_id, "dimension": self.dimension}

    def describe(self) -> str:
        return f"{self.model_id!r} ({self.dimension} dimensions, provider {self.provider})"


def check_recorded(recorded: Mapping[str, Any], service: EmbeddingIdentity) -> None:
    """Raises ModelMismatchError when the collection's recorded identity is not the service's."""
    collection = EmbeddingIdentity.from_record(recorded)
    if collection == service:
        return
    raise errors.ModelMismatchError(
        f"the collection was built with embedding model {collection.describe()} but this service runs "
        f"{service.describe()}; configure the same model (RAGRPC_EMBEDDING_PROVIDER, RAGRPC_EMBEDDING_MODEL, "
        "RAGRPC_EMBEDDING_DIMENSIONS) or use another RAGRPC_COLLECTION_PREFIX",
        metadata={
            "collection_provider": collection.provider,
            "collection_model": collection.model_id,
            "collection_dimension": str(collection.dimension),
            "service_provider": service.provider,
            "service_model": service.model_id,
            "service_dimension": str(service.dimension),
        },
    )


def ensure_recorded(
    read: Callable[[], Mapping[str, Any] | None],
    write: Callable[[dict[str, Any]], None],
    service: EmbeddingIdentity,
    *,
    create: bool,
) -> None:
    """Records `service` when nothing is recorded yet (only a writer, `create`), else checks it."""
    recorded = read()
    if recorded is None:
        if not create:
            raise errors.PreconditionError("the collection has no model record yet; start the ingest service")
        write(service.to_record())
        return
    check_recorded(recorded, service)
