"""Tests of the filter-expression builder (ragrpc.store.filters)."""

from __future__ import annotations

import dataclasses
import math
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragrpc.errors import InvalidInputError
from ragrpc.store import filters, schema
from ragrpc.store.filter_literals import quote_string
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

_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "n": "\n", "r": "\r", "t": "\t"}
# Characters the builder accepts: everything but C0/DEL/C1 controls (tab, LF, CR allowed).
_ALLOWED_CONTROL = "\t\n\r"
safe_text = st.text(
    alphabet=st.characters(
        blacklist_categories=("Cs",),
        blacklist_characters="".join(
            chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)] if chr(c) not in _ALLOWED_CONTROL
        ),
    )
)
hostile_text = st.text(alphabet=st.sampled_from(list("\"\\'%_ ortenant!=()[],\n\r\té€😀")), max_size=30)


def read_literal(expression: str, start: int) -> tuple[str, int]:
    """Read a Milvus double-quoted literal at `start`; return (value, index after it)."""
    assert expression[start] == '"', expression[start:]
    out: list[str] = []
    i = start + 1
    while i < len(expression):
        ch = expression[i]
        if ch == '"':
            return "".join(out), i + 1
        if ch == "\\":
            out.append(_ESCAPES[expression[i + 1]])
            i += 2
            continue
        assert ch not in "\r\n", "raw line break inside a literal"
        out.append(ch)
        i += 1
    raise AssertionError(f"unterminated literal in {expression!r}")


def skeleton(expression: str) -> tuple[list[str], list[str]]:
    """Split an expression into its non-literal tokens and its literal values."""
    structure: list[str] = []
    literals: list[str] = []
    i = 0
    while i < len(expression):
        if expression[i] == '"':
            value, i = read_literal(expression, i)
            literals.append(value)
            structure.append("<str>")
            continue
        match = re.compile(r"\s+|[A-Za-z_][A-Za-z0-9_]*|-?\d+|==|!=|>=|<=|[<>()\[\],]").match(expression, i)
        assert match, f"unexpected character at {i}: {expression[i:]!r}"
        if not match.group().isspace():
            structure.append(match.group())
        i = match.end()
    return structure, literals


# --- literal escaping ---------------------------------------------------------------


@given(safe_text)
@settings(max_examples=500)
def test_quoted_literal_parses_back_to_the_same_value(value: str) -> None:
    literal = quote_string(value)
    parsed, end = read_literal(literal, 0)
    assert parsed == value
    assert end == len(literal)


@given(st.text())
@settings(max_examples=500)
def test_any_text_is_either_rejected_or_round_trips(value: str) -> None:
    try:
        literal = quote_string(value)
    except InvalidInputError:
        assert any(ord(c) < 0x20 and c not in _ALLOWED_CONTROL or 0x7F <= ord(c) < 0xA0 for c in value)
        return
    assert read_literal(literal, 0) == (value, len(literal))


@given(hostile_text)
@settings(max_examples=300)
def test_hostile_value_stays_one_literal(value: str) -> None:
    rendered = and_(eq("tenant", "acme"), eq("source", value)).render()
    structure, literals = skeleton(rendered)
    assert structure == ["tenant", "==", "<str>", "and", "source", "==", "<str>"]
    assert literals == ["acme", value]


@pytest.mark.parametrize(
    "value",
    ['a" or tenant != "x', 'x\\" or 1 == 1 or "', "\\", '"', '\\"', 'a\\\\" or "', "line\nbreak", "100%_like"],
)
def test_injection_attempts_stay_one_literal_in_the_request_filter(value: str) -> None:
    benign = filter_from_request("acme", "c", ["d"], ["s"], ["m"], ["t"], 1, 2).render()
    hostile = filter_from_request(value, value, [value], [value], [value], [value], 1, 2).render()
    assert skeleton(hostile)[0] == skeleton(benign)[0]
    assert skeleton(hostile)[1] == [value, value, value, value, value, value]


@given(st.lists(safe_text.filter(lambda v: len(v) <= 128), min_size=1, max_size=5))
@settings(deadline=None)  # the first call imports milvus_lite
def test_milvus_lite_parser_reads_the_same_values(values: list[str]) -> None:
    parse_expr = pytest.importorskip("milvus_lite.search.filter").parse_expr
    ast = parse_expr(and_(eq("source", values[0]), in_("document_id", values)).render())
    assert [lit.value for lit in _string_literals(ast)] == [values[0], *dict.fromkeys(values)]


def _string_literals(node: object) -> list:
    if type(node).__name__ == "StringLit":
        return [node]
    found: list = []
    if not dataclasses.is_dataclass(node):
        return found
    for child in (getattr(node, f.name) for f in dataclasses.fields(node)):
        for item in child if isinstance(child, tuple) else (child,):
            found.extend(_string_literals(item))
    return found


@pytest.mark.parametrize("char", ["\x00", "\x01", "\x1b", "\x7f", "\x85", "\ud800"])
def test_control_characters_and_surrogates_are_rejected(char: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        eq("source", f"a{char}b")
    assert info.value.field_violations[0][0] == "source"


def test_tab_newline_and_carriage_return_are_escaped() -> None:
    assert quote_string('a\tb\nc\rd"e\\f') == '"a\\tb\\nc\\rd\\"e\\\\f"'


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


# --- against a real milvus-lite server ----------------------------------------------

HOSTILE_SOURCES = [
    'quote"inside',
    "back\\slash",
    "trailing\\",
    'a" or tenant != "x',
    "100%_like",
    "%",
    "ünïcödé 文字 😀",
    "line\nbreak\r\ttab",
    "it's",
    "plain",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture()
def milvus_lite_uri(tmp_path: Path):
    executable = Path(sys.executable).with_name("milvus-lite")
    port = _free_port()
    process = subprocess.Popen(
        [str(executable), "server", "--data-dir", str(tmp_path / "milvus"), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, "milvus-lite server exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("milvus-lite server did not accept connections within 60 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.slow
def test_hostile_values_round_trip_through_milvus_lite(milvus_lite_uri: str) -> None:
    from pymilvus import DataType, MilvusClient

    client = MilvusClient(uri=milvus_lite_uri)
    collection = "filter_roundtrip"
    fields = client.create_schema(auto_id=False)
    fields.add_field(schema.CHUNK_ID, DataType.VARCHAR, is_primary=True, max_length=64)
    fields.add_field(schema.TENANT, DataType.VARCHAR, max_length=64)
    fields.add_field(schema.KIND, DataType.INT8)
    fields.add_field(schema.SOURCE, DataType.VARCHAR, max_length=2048)
    fields.add_field(schema.TAGS, DataType.ARRAY, element_type=DataType.VARCHAR, max_capacity=8, max_length=128)
    fields.add_field(schema.DOC_DATE, DataType.INT64)
    fields.add_field("vector", DataType.FLOAT_VECTOR, dim=2)
    index = client.prepare_index_params()
    index.add_index("vector", index_type="FLAT", metric_type="COSINE")
    client.create_collection(collection, schema=fields, index_params=index)
    rows = [
        {
            schema.CHUNK_ID: f"c{i}",
            schema.TENANT: "acme",
            schema.KIND: 0,
            schema.SOURCE: value,
            schema.TAGS: [value],
            schema.DOC_DATE: i + 1,
            "vector": [1.0, float(i + 1)],
        }
        for i, value in enumerate(HOSTILE_SOURCES)
    ]
    client.insert(collection, rows)
    try:
        for i, value in enumerate(HOSTILE_SOURCES):
            for expr in (
                eq(schema.SOURCE, value),
                filter_from_request("acme", sources=[value]),
                filter_from_request("acme", tags=[value], time_after=i + 1, time_before=i + 2),
            ):
                found = client.query(collection, filter=expr.render(), output_fields=[schema.SOURCE])
                got = [(row[schema.CHUNK_ID], row[schema.SOURCE]) for row in found]
                assert got == [(f"c{i}", value)], expr.render()
        everything = client.query(collection, filter=filter_from_request("acme").render(), output_fields=[])
        assert len(everything) == len(HOSTILE_SOURCES)
        assert client.query(collection, filter=eq(schema.TENANT, 'acme" or tenant != "x').render()) == []
    finally:
        client.drop_collection(collection)
        client.close()


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
