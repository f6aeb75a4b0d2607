"""Transport security and caller identity from Settings: TLS credentials (mutual TLS
optional), the plaintext-only-on-loopback rule, and the tenant resolver (API keys or a
fixed tenant)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import grpc

from ragrpc.auth import ApiKeyTenantResolver, load_api_keys
from ragrpc.config import Settings
from ragrpc.request_context import FixedTenantResolver, TenantResolver


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials when a certificate is configured; None for plaintext, which is refused
    on a non-loopback address unless RAGRPC_ALLOW_PLAINTEXT_REMOTE is set."""
    if bool(settings.tls_cert_file) != bool(settings.tls_key_file):
        raise ValueError("RAGRPC_TLS_CERT_FILE and RAGRPC_TLS_KEY_FILE must be set together")
    if not settings.tls_cert_file:
        if not is_loopback(settings.host) and not settings.allow_plaintext_remote:
            raise ValueError(
                f"refusing to serve plaintext on {settings.host}: configure RAGRPC_TLS_CERT_FILE/RAGRPC_TLS_KEY_FILE "
                "or set RAGRPC_ALLOW_PLAINTEXT_REMOTE=true (e.g. behind a TLS-terminating proxy or in a pod)"
            )
        return None
    pair = (Path(settings.tls_key_file).read_bytes(), Path(settings.tls_cert_file).read_bytes())
    if settings.tls_client_ca_file:
        return grpc.ssl_server_credentials(
            [pair], root_certificates=Path(settings.tls_client_ca_file).read_bytes(), require_client_auth=True
        )
    return grpc.ssl_server_credentials([pair])


def tenant_resolver(settings: Settings) -> TenantResolver:
    digests = load_api_keys(settings.api_keys, settings.api_keys_file)
    if digests:
        return ApiKeyTenantResolver(digests)
    return FixedTenantResolver(settings.tenant)
