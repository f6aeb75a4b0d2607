"""The metadata keys a chunks collection filters on, each a typed scalar field of its own.

A collection declares its filterable metadata keys when it is created (RAGRPC_METADATA_FILTER_KEYS, read
by the ingest service that creates it): each key `k` becomes a VARCHAR field `meta_k` of the chunks
collection (at most `MAX_VALUE_BYTES` UTF-8 bytes, "" where a chunk's metadata has no such key), written
from the chunk's metadata with every row, and the keys are recorded next to the embedding identity in
the registry's model record (ragrpc.store.model_record; the fields are what rows must carry, the record
tells a collection created with no keys from one created before keys could be declared). A filter on
such a key is an exact match on that field (`meta_k in [...]`), never a filter on the JSON `metadata`
field (100x slower on milvus-lite).

The keys are fixed with the collection (milvus-lite cannot add a field to a collection): both services
follow the collection's record, and one whose setting names other keys logs a warning at start naming
both (the setting applies to collections created later); to filter on other keys, re-create the
collection (another RAGRPC_COLLECTION_PREFIX) and ingest the documents again. The query service needs
no setting.

Collections created before keys could be declared have no record and no such fields (`legacy`): they
filter only on the keys of the deprecated MetadataFilter fields, in the JSON `metadata` field as
before (ragrpc.store.request_filter).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ragrpc import errors
from ragrpc.store import schema
from ragrpc.store.filters import DEFAULT_MAX_LENGTHS, FilterBuilder

logger = logging.getLogger(__name__)

SETTING = "RAGRPC_METADATA_FILTER_KEYS"
MAX_KEYS = 16  # fields a collection may add for metadata (Milvus allows 64 in all; the chunks have 24)
MAX_VALUE_BYTES = 512  # VARCHAR max_length of each metadata field (UTF-8 bytes, as a Milvus server counts)
RECORD_KEY = "metadata_keys"  # in the registry's model record (ragrpc.store.model_record)
_KEY = re.compile(r"[a-z][a-z0-9_]{0,47}\Z")


def is_valid_key(key: object) -> bool:
    """A key a collection can declare: a lower-case identifier of at most 48 characters."""
    return isinstance(key, str) and _KEY.match(key) is not None


def parse_keys(setting: str) -> tuple[str, ...]:
    """The keys of RAGRPC_METADATA_FILTER_KEYS ("department, product"), in order, each once; PreconditionError
    naming the setting for a key that cannot be a field name, or too many keys."""
    keys = tuple(dict.fromkeys(key.strip() for key in setting.split(",") if key.strip()))
    if bad := [key for key in keys if not is_valid_key(key)]:
        raise errors.PreconditionError(
            f"{SETTING}: {', '.join(map(repr, bad))} cannot be filter keys; use lower-case identifiers "
            "(a-z, 0-9, _; starting with a letter; at most 48 characters)",
            reason="BAD_METADATA_KEYS",
        )
    if len(keys) > MAX_KEYS:
        raise errors.PreconditionError(
            f"{SETTING}: at most {MAX_KEYS} keys, got {len(keys)}", reason="BAD_METADATA_KEYS"
        )
    return keys


@dataclass(frozen=True)
class MetadataFields:
    """The filterable metadata keys of one chunks collection (see the module docstring). `legacy`: created
    before keys could be declared (no fields, no record)."""

    keys: tuple[str, ...] = ()
    legacy: bool = False

    def __post_init__(self) -> None:
        if self.legacy and self.keys:
            raise ValueError("a legacy collection declares no metadata keys")
        if bad := [key for key in self.keys if not is_valid_key(key)]:
            raise ValueError(f"invalid metadata keys {bad}")

    def declares(self, key: str) -> bool:
        return key in self.keys

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(schema.metadata_field(key) for key in self.keys)

    def row_values(self, metadata: Mapping[str, Any]) -> dict[str, str]:
        """The declared fields' values of a chunk with this metadata ("" where it has no such key);
        InvalidInputError naming the key for a value longer than its field (`check_values`)."""
        self.check_values(metadata)
        return {schema.metadata_field(key): _text(metadata.get(key)) for key in self.keys}

    def check_values(self, metadata: Mapping[str, Any]) -> None:
        """InvalidInputError naming the key when a declared key's value is longer than its field holds."""
        for key in self.keys:
            size = schema.utf8_length(_text(metadata.get(key)))
            if size > MAX_VALUE_BYTES:
                raise errors.InvalidInputError(
                    f"metadata {key!r} is {size} bytes (UTF-8); the collection filters on {key!r} and holds at "
                    f"most {MAX_VALUE_BYTES} bytes of it: give a shorter value",
                    field=f"metadata[{key}]",
                    reason="METADATA_VALUE_TOO_LONG",
                )

    def describe(self) -> str:
        if self.legacy:
            return "none (created before metadata keys could be declared)"
        return ", ".join(self.keys) or "none"

    @cached_property
    def builder(self) -> FilterBuilder:
        """The filter builder of this collection: schema.FILTERABLE_FIELDS and the declared fields."""
        declared = {name: str for name in self.field_names}
        lengths = {**DEFAULT_MAX_LENGTHS, **dict.fromkeys(self.field_names, MAX_VALUE_BYTES)}
        return FilterBuilder({**schema.FILTERABLE_FIELDS, **declared}, max_lengths=lengths)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def in_process_attributes(metadata: Mapping[str, Any]) -> dict[str, str]:
    """The attributes an in-process index keeps of a chunk's metadata for filters: every key that a
    collection could declare, under its field name. A filter names only the collection's declared keys
    (the builder admits no other), so the rest are never read."""
    return {
        schema.metadata_field(key): value
        for key, value in metadata.items()
        if isinstance(value, str) and is_valid_key(key)
    }


def follow_recorded(recorded: MetadataFields, configured: Iterable[str], collection: str) -> MetadataFields:
    """The collection's keys, whatever the service's setting says; a setting that names other keys is
    logged (WARNING) with both lists and what to do (an empty setting follows the record quietly: the
    query service needs none)."""
    wanted = tuple(configured)
    if recorded.legacy and wanted:
        logger.warning(
            "%s=%s is not applied: collection %s was created before metadata keys could be declared and has no "
            "fields for them (it filters only on the deprecated MetadataFilter fields); re-create it (another "
            "RAGRPC_COLLECTION_PREFIX) and ingest the documents again to filter on these keys",
            SETTING,
            ",".join(wanted),
            collection,
        )
    elif wanted and not recorded.legacy and set(wanted) != set(recorded.keys):
        logger.warning(
            "%s=%s differs from the keys collection %s was created with (%s); the collection's apply: the keys "
            "are fixed when it is created, re-create it (another RAGRPC_COLLECTION_PREFIX) to change them",
            SETTING,
            ",".join(wanted) or "(none)",
            collection,
            recorded.describe(),
        )
    return recorded
