"""Tests of the filter builder's string literals (ragrpc.store.filter_literals): every value stays one
literal, read back unchanged by a parser, by milvus-lite's own parser and by a real milvus-lite server."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragrpc.errors import InvalidInputError
from ragrpc.store import schema
from ragrpc.store.filter_literals import quote_string
from ragrpc.store.filters import and_, eq, in_
from ragrpc.store.request_filter import filter_from_request
from tests.support.milvus_server import start_milvus_lite

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


@pytest.fixture()
def milvus_lite_uri(tmp_path: Path):
    server = start_milvus_lite(tmp_path)
    try:
        yield server.uri
    finally:
        server.stop()


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
