"""The standard query filter of a request: the tenant's retrievable chunks that match its
MetadataFilter (collection, documents, sources, media types, tags, document time, facts), built
with ragrpc.store.filters; an invalid value is an InvalidInputError naming the request field."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ragrpc.errors import InvalidInputError
from ragrpc.models import ChunkKind
from ragrpc.store import schema
from ragrpc.store.filters import DEFAULT_BUILDER, FilterBuilder, FilterExpr, relabel


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
    facts: Mapping[str, Iterable[str]] | None = None,
    builder: FilterBuilder = DEFAULT_BUILDER,
) -> FilterExpr:
    """The standard query filter: the tenant's retrievable chunks matching a MetadataFilter.

    collection "" means every collection of the tenant. time_after/time_before are unix
    seconds (doc_date >= after, doc_date < before); with either set, documents of unknown
    date (doc_date == 0) are excluded. `facts` maps a key of schema.FILTERABLE_METADATA_KEYS to
    the values one of which a chunk's metadata must hold. Errors name the request field
    (options.filter.*).
    """
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
    for key, values in (facts or {}).items():  # organization, ticker, document_type, fiscal_period
        values = list(values)
        if values:
            with relabel(f"options.filter.{key}s"):
                parts.append(builder.metadata_in(key, values))
    parts.extend(_time_conditions(builder, time_after, time_before))
    return builder.and_(*parts)


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
