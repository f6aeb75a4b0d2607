"""Which pymilvus options a Milvus URI gets: keepalive pings off towards a loopback server
(milvus-lite answers pymilvus' 10 s pings during long calls with GOAWAY too_many_pings),
pymilvus' defaults over a network."""

from __future__ import annotations

import pytest

from ragrpc.store.milvus_connection import client_options


@pytest.mark.parametrize(
    "uri", ["http://127.0.0.1:19530", "http://localhost:19530", "http://[::1]:19530", "https://127.0.0.2:443"]
)
def test_loopback_servers_get_no_keepalive_pings(uri: str) -> None:
    keepalive = client_options(uri)["grpc_options"]["grpc.keepalive_time_ms"]
    assert keepalive == 2**31 - 1  # gRPC's "never"


@pytest.mark.parametrize("uri", ["http://10.0.0.2:19530", "https://milvus.example.com:19530", "http://milvus:19530"])
def test_remote_servers_keep_the_pymilvus_defaults(uri: str) -> None:
    assert client_options(uri) == {}
