"""Tests of the filter-expression builder (ragrpc.store.filters)."""

from __future__ import annotations

import math

import pytest

from ragrpc.errors import InvalidInputError
from ragrpc.store import filters, schema
from ragrpc.store.filters import (
    FilterBuilder,
    and_,
    contains_any,
    eq,
    gte,
    in_,
    lt,
    ne,
    or_,
)
from ragrpc.store.request_filter import filter_from_request

# --- builder ------------------------------------------------------------------------


def test_renders_each_condition_kind() -> None:
    expr = and_(
        eq("tenant", "acme"),
        ne("doc_date", 0),
        in_("source", ["a.pdf", "b.pdf", "a.pdf"]),
        contains_any("tags", ["x", "y"]),
        gte("created_at", 10),
        lt("page_start", 3),
        or_(eq("kind", 0), eq("kind", 1)),
    )
    assert expr.render() == (
        'tenant == "acme" and doc_date != 0 and source in ["a.pdf", "b.pdf"] and '
        'array_contains_any(tags, ["x", "y"]) and created_at >= 10 and page_start < 3 and '
        "(kind == 0 or kind == 1)"
    )


def test_nested_and_is_flattened_and_single_part_is_unwrapped() -> None:
    assert and_(and_(eq("kind", 0), eq("kind", 1)), eq("tenant", "t")).render() == (
        'kind == 0 and kind == 1 and tenant == "t"'
    )
    assert and_(eq("kind", 0)).render() == "kind == 0"
    with pytest.raises(ValueError):
        and_()


def test_render_with_params_uses_placeholders() -> None:
    expr = and_(eq("tenant", 'a"b'), in_("source", ["x"]), contains_any("tags", ["t"]))
    template, params = expr.render_with_params()
    assert template == "tenant == {p0} and source in {p1} and array_contains_any(tags, {p2})"
    assert params == {"p0": 'a"b', "p1": ["x"], "p2": ["t"]}


@pytest.mark.parametrize(
    "make",
    [
        lambda: eq("metadata", "x"),  # not filterable
        lambda: eq("tenant or 1", "x"),
        lambda: eq("kind", True),  # bool is not int
        lambda: eq("kind", 1.0),
        lambda: eq("kind", "0"),
        lambda: gte("doc_date", 2**63),
        lambda: lt("doc_date", -(2**63) - 1),
        lambda: eq("tenant", 5),
        lambda: eq("tags", "x"),  # array field needs contains_any
        lambda: contains_any("source", ["x"]),
        lambda: contains_any("tags", "x"),  # a string is not a list of values
        lambda: in_("source", []),
        lambda: in_("source", ["ok", None]),
        lambda: gte("source", 1),
        lambda: eq("tenant", "x" * 65),  # longer than the VARCHAR limit
        lambda: contains_any("tags", ["x" * (schema.MAX_TAG_LENGTH + 1)]),
    ],
)
def test_invalid_conditions_raise_invalid_input(make) -> None:
    with pytest.raises(InvalidInputError) as info:
        make()
    assert info.value.field_violations


def test_int64_bounds_are_accepted() -> None:
    assert gte("doc_date", -(2**63)).render() == f"doc_date >= {-(2**63)}"
    assert lt("doc_date", 2**63 - 1).render() == f"doc_date < {2**63 - 1}"


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, True])
def test_float_fields_reject_nan_inf_and_bool(value: float) -> None:
    builder = FilterBuilder({"score": float})
    with pytest.raises(InvalidInputError):
        builder.gte("score", value)
    assert builder.gte("score", 2).render() == "score >= 2.0"


def test_too_many_values_are_rejected() -> None:
    builder = FilterBuilder(max_values=2)
    assert builder.in_("source", ["a", "b", "a"]).render() == 'source in ["a", "b"]'
    with pytest.raises(InvalidInputError):
        builder.in_("source", ["a", "b", "c"])


def test_builder_rejects_a_non_identifier_field_in_its_allow_list() -> None:
    with pytest.raises(InvalidInputError):
        FilterBuilder({"a or b": str})


def test_matches_evaluates_the_same_condition_in_process() -> None:
    expr = filter_from_request("acme", "c1", sources=["s1", "s2"], tags=["x"], time_after=10)
    row = {"tenant": "acme", "kind": 0, "collection": "c1", "source": "s2", "tags": ["y", "x"], "doc_date": 10}
    assert expr.matches(row)
    assert not expr.matches({**row, "tenant": "other"})
    assert not expr.matches({**row, "kind": 1})
    assert not expr.matches({**row, "tags": []})
    assert not expr.matches({**row, "doc_date": 9})
    assert not expr.matches({k: v for k, v in row.items() if k != "source"})
    assert or_(eq("kind", 1), eq("source", "s2")).matches(row)


# --- the request filter -------------------------------------------------------------


def test_request_filter_always_has_tenant_and_retrievable_kind() -> None:
    assert filter_from_request("acme").render() == 'tenant == "acme" and kind == 0'


def test_request_filter_with_every_option() -> None:
    expr = filter_from_request("acme", "docs", ["d1"], ["s1"], ["text/plain"], ["t1", "t2"], 100, 200)
    assert expr.render() == (
        'tenant == "acme" and kind == 0 and collection == "docs" and document_id in ["d1"] and '
        'source in ["s1"] and media_type in ["text/plain"] and array_contains_any(tags, ["t1", "t2"]) and '
        "doc_date != 0 and doc_date >= 100 and doc_date < 200"
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tenant": ""}, "tenant"),
        ({"tenant": "a", "sources": ["x\x00"]}, "options.filter.sources"),
        ({"tenant": "a", "tags": [""] * 2000}, None),  # deduplicated to one value: fine
        ({"tenant": "a", "document_ids": ["d" * 129]}, "options.filter.document_ids"),
        ({"tenant": "a", "time_after": 5, "time_before": 5}, "options.filter.document_time_before"),
        ({"tenant": "a", "time_after": 2**64}, "options.filter.document_time_after"),
        ({"tenant": "a", "collection": 'c"' * 100}, "options.collection"),
    ],
)
def test_request_filter_errors_name_the_request_field(kwargs: dict, field: str | None) -> None:
    if field is None:
        filter_from_request(**kwargs)
        return
    with pytest.raises(InvalidInputError) as info:
        filter_from_request(**kwargs)
    assert info.value.field_violations[0][0] == field


def test_module_exposes_the_default_builder_functions() -> None:
    assert filters.DEFAULT_BUILDER.fields == schema.FILTERABLE_FIELDS


def test_an_expression_names_the_fields_it_reads() -> None:
    expr = and_(
        eq(schema.TENANT, "acme"),
        or_(in_(schema.SOURCE, ["a.pdf"]), contains_any(schema.TAGS, ["x"])),
        gte(schema.DOC_DATE, 0),
    )
    assert expr.fields() == {schema.TENANT, schema.SOURCE, schema.TAGS, schema.DOC_DATE}
    row = {schema.TENANT: "acme", schema.SOURCE: "a.pdf", schema.TAGS: [], schema.DOC_DATE: 3}
    assert expr.matches(row) and not expr.matches({k: v for k, v in row.items() if k != schema.DOC_DATE})
