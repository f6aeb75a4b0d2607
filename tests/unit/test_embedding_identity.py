"""The embedding identity recorded on a collection (provider, model, dimension): collections written
before providers existed read as the local provider, and a service with another provider, model or
(Matryoshka) dimension is refused with FAILED_PRECONDITION, by the record check and by the in-memory
registry alike (tests/integration/test_embedding_identity_milvus.py runs it on milvus-lite)."""

from __future__ import annotations

import pytest

from ragrpc import errors
from ragrpc.store.model_record import EmbeddingIdentity, check_recorded
from ragrpc.testing import InMemoryDocumentRegistry

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
LEGACY = {"model_id": MINILM, "dimension": 384}  # what collections recorded before providers


def test_a_legacy_record_is_the_local_provider() -> None:
    assert EmbeddingIdentity.from_record(LEGACY) == EmbeddingIdentity(MINILM, 384, "local")
    check_recorded(LEGACY, EmbeddingIdentity(MINILM, 384))


@pytest.mark.parametrize(
    "service",
    [
        EmbeddingIdentity(MINILM, 384, "openai"),
        EmbeddingIdentity(MINILM, 256, "local"),
        EmbeddingIdentity("intfloat/e5-small", 384, "local"),
    ],
)
def test_another_provider_model_or_dimension_is_refused(service: EmbeddingIdentity) -> None:
    with pytest.raises(errors.ModelMismatchError) as caught:
        check_recorded(LEGACY, service)
    error = caught.value
    assert errors.status_name(error) == "FAILED_PRECONDITION" and error.reason == "EMBEDDING_MODEL_MISMATCH"
    assert "(384 dimensions, provider local)" in error.message
    assert f"({service.dimension} dimensions, provider {service.provider})" in error.message
    assert error.metadata["service_dimension"] == str(service.dimension)
    assert error.metadata["collection_provider"] == "local" and error.metadata["service_provider"] == service.provider


def test_a_collection_built_at_256_dimensions_refuses_a_service_at_384() -> None:
    registry = InMemoryDocumentRegistry()
    small = EmbeddingIdentity("text-embedding-3-small", 256, "openai")
    registry.ensure_model(small)
    assert registry.model_record == {"provider": "openai", "model_id": "text-embedding-3-small", "dimension": 256}
    registry.ensure_model(small, create=False)  # a reader with the same identity
    with pytest.raises(errors.ModelMismatchError, match="256 dimensions.*384 dimensions"):
        registry.ensure_model(EmbeddingIdentity("text-embedding-3-small", 384, "openai"), create=False)
    assert registry.model_record["dimension"] == 256  # a refused service records nothing


def test_a_reader_before_any_writer_is_told_to_start_the_ingest_service() -> None:
    with pytest.raises(errors.PreconditionError, match="start the ingest service"):
        InMemoryDocumentRegistry().ensure_model(EmbeddingIdentity(MINILM, 384), create=False)
