"""The standard query filter of a request: the tenant's retrievable chunks that match its
MetadataFilter (collection, documents, sources, media types, tags, document time, metadata), built
with ragrpc.store.filters; an invalid value is an InvalidInputError naming the request field.

Metadata conditions are exact matches on the collection's declared metadata fields
(ragrpc.store.metadata_fields): `meta_<key> in [values]`, one condition per key, the values of one
key OR'ed, the keys AND'ed. A key the collection does not declare is an error naming it and the keys
it declares. On a collection created before keys could be declared (`MetadataFields.legacy`), the
conditions of the deprecated MetadataFilter fields (`MetadataCondition.deprecated_alias`) are matched
in the metadata JSON, as they were before; other keys cannot be filtered there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ragrpc.errors import InvalidInputError
from ragrpc.models import ChunkKind
from ragrpc.store import schema
from ragrpc.store.filters import FilterBuilder, FilterExpr, relabel
from ragrpc.store.metadata_fields import MetadataFields, is_valid_key


@dataclass(frozen=True)
class MetadataCondition:
    """Chunks whose metadata value of `key` is one of `values` (exact match)."""

    key: str
    values: tuple[str, ...]
    request_field: str = ""  # where the request named it, for errors ("options.filter.metadata[department]")
    deprecated_alias: bool = False  # from a deprecated MetadataFilter field (matched in JSON on legacy collections)

    @property
    def field_path(self) -> str:
        return self.request_field or f"options.filter.metadata[{self.key}]"


_NO_FIELDS = MetadataFields()


def filter_from_request(
    tenant: str,
    collection: str = "",
    document_ids: Iterable[str] = (),
    sources: Iterable[str] = (),
    media_types: Iterable[str] = (),
    tags: Iterable[str] = (),
    time_after: int | None = None,
    time_before: int | None = None,
    *,
    metadata: Iterable[MetadataCondition] = (),
    fields: MetadataFields = _NO_FIELDS,
) -> FilterExpr:
    """The standard query filter: the tenant's retrievable chunks matching a MetadataFilter.

    collection "" means every collection of the tenant. time_after/time_before are unix
    seconds (doc_date >= after, doc_date < before); with either set, documents of unknown
    date (doc_date == 0) are excluded. `metadata`: conditions on the metadata keys `fields`
    (the collection's) declares (see the module docstring). Errors name the request field
    (options.filter.*).
    """
    builder = fields.builder
    if not isinstance(tenant, str) or not tenant:
        raise InvalidInputError("tenant is required", field="tenant")
    with relabel("tenant"):
        parts = [builder.eq(schema.TENANT, tenant)]
    parts.append(builder.eq(schema.KIND, int(ChunkKind.RETRIEVABLE)))
    if collection:
        with relabel("options.collection"):
            parts.append(builder.eq(schema.COLLECTION, collection))
    lists = (
        ("document_ids", schema.DOCUMENT_ID, document_ids, builder.in_),
        ("sources", schema.SOURCE, sources, builder.in_),
        ("media_types", schema.MEDIA_TYPE, media_types, builder.in_),
        ("tags", schema.TAGS, tags, builder.contains_any),
    )
    for request_field, field_name, values, make in lists:
        values = list(values)
        if values:
            with relabel(f"options.filter.{request_field}"):
                parts.append(make(field_name, values))
    parts.extend(_metadata_conditions(builder, fields, metadata))
    parts.extend(_time_conditions(builder, time_after, time_before))
    return builder.and_(*parts)


def _metadata_conditions(
    builder: FilterBuilder, fields: MetadataFields, conditions: Iterable[MetadataCondition]
) -> list[FilterExpr]:
    parts: list[FilterExpr] = []
    seen: dict[str, str] = {}
    for condition in conditions:
        key, path = condition.key, condition.field_path
        if not condition.values:
            continue
        if not is_valid_key(key):
            raise InvalidInputError(
                f"{key!r} is not a metadata key a collection can declare (a lower-case identifier)",
                field=path,
                reason="METADATA_KEY_NOT_DECLARED",
            )
        if key in seen:
            raise InvalidInputError(
                f"metadata key {key!r} is filtered twice ({seen[key]} and {path}); give its values once",
                field=path,
            )
        seen[key] = path
        if any(not isinstance(value, str) or not value for value in condition.values):
            raise InvalidInputError(f"values of metadata key {key!r} must be non-empty text", field=path)
        if fields.declares(key):
            with relabel(path):
                parts.append(builder.in_(schema.metadata_field(key), condition.values))
        elif fields.legacy and condition.deprecated_alias:
            with relabel(path):
                parts.append(builder.json_key_in(key, condition.values))
        else:
            raise _undeclared(key, fields, path)
    return parts


def implied_conditions(
    implied: Mapping[str, Sequence[str]], given: Iterable[MetadataCondition], fields: MetadataFields
) -> list[MetadataCondition]:
    """The conditions a question implies (ragrpc.enrich.QueryAnalysis.filters) that apply: those on keys the
    collection declares and the request does not filter (the request's own values win)."""
    asked = {condition.key for condition in given}
    return [
        MetadataCondition(key, tuple(values), request_field=f"implied by the question: metadata[{key}]")
        for key, values in implied.items()
        if values and key not in asked and fields.declares(key)
    ]


def _undeclared(key: str, fields: MetadataFields, path: str) -> InvalidInputError:
    if fields.legacy:
        message = (
            f"metadata key {key!r} cannot be filtered on: this collection was created before metadata keys could be "
            "declared and filters only on the deprecated MetadataFilter fields; re-create it with "
            "RAGRPC_METADATA_FILTER_KEYS naming the key (another RAGRPC_COLLECTION_PREFIX) and ingest the "
            "documents again"
        )
    else:
        message = (
            f"metadata key {key!r} is not declared on this collection (it declares: {fields.describe()}); the keys "
            "are fixed when the collection is created (RAGRPC_METADATA_FILTER_KEYS)"
        )
    return InvalidInputError(
        message, field=path, reason="METADATA_KEY_NOT_DECLARED", metadata={"key": key, "declared": fields.describe()}
    )


def _time_conditions(builder: FilterBuilder, after: int | None, before: int | None) -> list[FilterExpr]:
    if after is None and before is None:
        return []
    if after is not None and before is not None and after >= before:
        raise InvalidInputError(
            "document_time_after must be before document_time_before",
            field="options.filter.document_time_before",
        )
    conditions = [builder.ne(schema.DOC_DATE, 0)]
    if after is not None:
        with relabel("options.filter.document_time_after"):
            conditions.append(builder.gte(schema.DOC_DATE, after))
    if before is not None:
        with relabel("options.filter.document_time_before"):
            conditions.append(builder.lt(schema.DOC_DATE, before))
    return conditions
