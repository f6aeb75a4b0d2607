"""Optional API-key authentication: `authorization: Bearer <key>` -> tenant.

Keys are held only as SHA-256 digests and compared in constant time (every stored digest
is compared, so timing does not reveal which one matched). Sources:

  RAGRPC_API_KEYS       "tenant=key,tenant2=key2" (plain keys in the environment, hashed at load)
  RAGRPC_API_KEYS_FILE  one entry per line: "<tenant> sha256:<hex digest>" (or "<tenant> <key>");
                        blank lines and lines starting with # are ignored

Generate a digest with: python -c "import hashlib,sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())" KEY
"""

from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path

from ragrpc import errors

_TENANT = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class ApiKeyTenantResolver:
    """TenantResolver that requires a valid API key on every call (health stays open)."""

    def __init__(self, digests: dict[bytes, str]) -> None:
        if not digests:
            raise ValueError("authentication is on but no API keys are configured")
        self._entries = list(digests.items())

    def tenant_for(self, metadata: dict[str, str]) -> str:
        header = metadata.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise errors.UnauthenticatedError(
                "missing API key: send metadata 'authorization: Bearer <key>'", reason="API_KEY_MISSING"
            )
        offered = key_digest(key.strip())
        tenant = ""
        for digest, candidate in self._entries:  # compare with all, in constant time each
            if hmac.compare_digest(digest, offered):
                tenant = candidate
        if not tenant:
            raise errors.UnauthenticatedError("the API key is not valid", reason="API_KEY_INVALID")
        return tenant


def _checked_tenant(tenant: str, where: str) -> str:
    if not _TENANT.match(tenant):
        raise ValueError(f"{where}: tenant {tenant!r} must be 1-64 characters of A-Z a-z 0-9 . _ -")
    return tenant


def parse_env_keys(text: str) -> dict[bytes, str]:
    digests: dict[bytes, str] = {}
    for number, entry in enumerate(filter(None, (e.strip() for e in text.split(","))), start=1):
        tenant, sep, key = entry.partition("=")
        if not sep or not key:
            raise ValueError(f"RAGRPC_API_KEYS entry {number}: expected tenant=key")
        digests[key_digest(key)] = _checked_tenant(tenant.strip(), f"RAGRPC_API_KEYS entry {number}")
    return digests


def parse_key_file(path: Path) -> dict[bytes, str]:
    digests: dict[bytes, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}:{number}: expected '<tenant> sha256:<hex>' or '<tenant> <key>'")
        tenant, secret = parts
        if secret.startswith("sha256:"):
            try:
                digest = bytes.fromhex(secret.removeprefix("sha256:"))
            except ValueError:
                raise ValueError(f"{path}:{number}: the sha256 digest is not hex") from None
            if len(digest) != 32:
                raise ValueError(f"{path}:{number}: a sha256 digest has 64 hex characters")
        else:
            digest = key_digest(secret)
        digests[digest] = _checked_tenant(tenant, f"{path}:{number}")
    return digests


def load_api_keys(env_keys: str, key_file: str) -> dict[bytes, str]:
    digests = parse_env_keys(env_keys) if env_keys else {}
    if key_file:
        digests.update(parse_key_file(Path(key_file)))
    return digests
