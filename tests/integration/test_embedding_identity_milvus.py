"""The embedding identity on a real milvus-lite server: the writer records provider, model and
dimension; a service with another provider or (Matryoshka) dimension is refused; a collection
written before providers existed (model and dimension only) opens as the local provider."""

from __future__ import annotations

import pytest

from ragrpc import errors
from ragrpc.config import Settings
from ragrpc.store import schema as s
from ragrpc.store.collections import CollectionNames, _registry_row_defaults
from ragrpc.store.factory import open_milvus_stores

pytestmark = pytest.mark.slow
MODEL = "test/matryoshka"


def test_provider_and_dimension_are_recorded_and_checked(milvus_settings: Settings) -> None:
    writer = open_milvus_stores(milvus_settings, model_id=MODEL, dimension=256, provider="openai", writer=True)
    documents = CollectionNames.with_prefix(milvus_settings.collection_prefix).documents
    rows = writer.connection.call(lambda c: c.get(documents, ids=[s.MODEL_INFO_KEY], output_fields=[s.RECORD]))
    # the identity, and the metadata keys the chunks collection was created with (ragrpc.store.metadata_fields)
    assert rows[0][s.RECORD] == {"provider": "openai", "model_id": MODEL, "dimension": 256, "metadata_keys": []}
    open_milvus_stores(milvus_settings, model_id=MODEL, dimension=256, provider="openai", writer=False)
    for dimension, provider in ((384, "openai"), (256, "local")):
        with pytest.raises(errors.ModelMismatchError) as caught:
            open_milvus_stores(milvus_settings, model_id=MODEL, dimension=dimension, provider=provider, writer=False)
        assert "256 dimensions, provider openai" in caught.value.message
        assert errors.status_name(caught.value) == "FAILED_PRECONDITION"


def test_a_legacy_record_opens_as_the_local_provider(milvus_settings: Settings) -> None:
    writer = open_milvus_stores(milvus_settings, model_id=MODEL, dimension=8, writer=True)
    documents = CollectionNames.with_prefix(milvus_settings.collection_prefix).documents
    legacy = {**_registry_row_defaults(), s.DOC_KEY: s.MODEL_INFO_KEY, s.RECORD: {"model_id": MODEL, "dimension": 8}}
    writer.connection.call(lambda c: c.upsert(documents, [legacy]))
    open_milvus_stores(milvus_settings, model_id=MODEL, dimension=8, writer=False)
    with pytest.raises(errors.ModelMismatchError, match="provider local"):
        open_milvus_stores(milvus_settings, model_id=MODEL, dimension=8, provider="openai", writer=False)
