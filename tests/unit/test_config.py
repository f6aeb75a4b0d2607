from __future__ import annotations

import dataclasses

import pytest

from ragrpc.config import Settings, settings_table


def test_defaults_without_environment() -> None:
    settings = Settings.from_env({})
    assert settings.milvus_uri == "http://127.0.0.1:19530"
    assert settings.ingest_port == 50051 and settings.query_port == 50052
    assert settings.token_budget == 4000


def test_environment_overrides_with_types() -> None:
    settings = Settings.from_env(
        {"RAGRPC_INGEST_PORT": "6000", "RAGRPC_STORE_TIMEOUT_S": "2.5", "RAGRPC_MILVUS_URI": "http://milvus:19530"}
    )
    assert settings.ingest_port == 6000
    assert settings.store_timeout_s == 2.5
    assert settings.milvus_uri == "http://milvus:19530"


def test_bad_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="RAGRPC_QUERY_PORT"):
        Settings.from_env({"RAGRPC_QUERY_PORT": "eighty"})


def test_table_lists_every_setting() -> None:
    table = settings_table()
    for field in dataclasses.fields(Settings):
        assert f"`{field.metadata['env']}`" in table
