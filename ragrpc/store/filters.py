"""The one builder of Milvus boolean filter expressions.

Every filter that reaches Milvus is built here, from immutable `FilterExpr` trees:

    expr = and_(eq("tenant", "acme"), in_("source", ["a.pdf", "b.pdf"]), gte("doc_date", 0))
    expr.render()               -> 'tenant == "acme" and source in ["a.pdf", "b.pdf"] and doc_date >= 0'
    expr.render_with_params()   -> ('tenant == {p0} and source in {p1} and doc_date >= {p2}', {...})
    expr.matches(row)           -> the same condition evaluated in-process (for the sparse index)

Safety rules (a value can never change the structure of the expression):
  * fields must be in the builder's allow-list (default `schema.FILTERABLE_FIELDS`) and be
    plain identifiers; values must have the declared type (bool is not int; floats finite;
    ints within int64);
  * literals are rendered by ragrpc.store.filter_literals (strings double-quoted and escaped,
    control characters and lone surrogates rejected).

`render()` inlines literals (milvus-lite rejects templates); `render_with_params()` gives a
`{name}` template plus params for servers that support expression templates (Milvus >= 2.5).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ragrpc.errors import InvalidInputError
from ragrpc.store import schema
from ragrpc.store.filter_literals import INT64_MAX, INT64_MIN, quote_string, render_literal

DEFAULT_MAX_VALUES = 1024  # values in one `in` / `array_contains_any` list

DEFAULT_MAX_LENGTHS: Mapping[str, int] = MappingProxyType({**schema.VARCHAR_LIMITS, schema.TAGS: schema.MAX_TAG_LENGTH})

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_COMPARISONS: Mapping[str, Callable[[Any, Any], Any]] = MappingProxyType(
    {
        "==": operator.eq,
        "!=": operator.ne,
        ">": operator.gt,
        ">=": operator.ge,
        "<": operator.lt,
        "<=": operator.le,
    }
)


def _checked_field(name: str) -> str:
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise InvalidInputError(f"invalid field name {name!r}", field=str(name))
    return name


class _RenderContext:
    """Per-render state: inline literals, or collect them as named template params."""

    def __init__(self, templated: bool) -> None:
        self.templated = templated
        self.params: dict[str, Any] = {}

    def literal(self, value: Any) -> str:
        rendered = render_literal(value)  # validates even when templated
        if not self.templated:
            return rendered
        name = f"p{len(self.params)}"
        self.params[name] = list(value) if isinstance(value, tuple) else value
        return "{" + name + "}"


class FilterExpr:
    """An immutable boolean condition over chunk fields."""

    def render(self) -> str:
        """The Milvus expression with inlined literals."""
        return self._render(_RenderContext(templated=False))

    def render_with_params(self) -> tuple[str, dict[str, Any]]:
        """(template with `{p0}`-style placeholders, params) for Milvus expression templates."""
        context = _RenderContext(templated=True)
        return self._render(context), context.params

    def matches(self, row: Mapping[str, Any]) -> bool:
        """Evaluate the condition on a row (field name -> value); a missing field never matches."""
        raise NotImplementedError

    def fields(self) -> frozenset[str]:
        """The fields the condition reads (what a row needs for `matches`)."""
        raise NotImplementedError

    def _render(self, context: _RenderContext) -> str:
        raise NotImplementedError

    def __str__(self) -> str:
        return self.render()


@dataclass(frozen=True)
class Comparison(FilterExpr):
    field: str
    op: str
    value: Any

    def _render(self, context: _RenderContext) -> str:
        if self.op not in _COMPARISONS:
            raise ValueError(f"unknown operator {self.op!r}")
        return f"{_checked_field(self.field)} {self.op} {context.literal(self.value)}"

    def fields(self) -> frozenset[str]:
        return frozenset((self.field,))

    def matches(self, row: Mapping[str, Any]) -> bool:
        actual = row.get(self.field)
        if actual is None or isinstance(actual, bool) != isinstance(self.value, bool):
            return False
        try:
            return bool(_COMPARISONS[self.op](actual, self.value))
        except TypeError:
            return False


@dataclass(frozen=True)
class InList(FilterExpr):
    field: str
    values: tuple[Any, ...]

    def _render(self, context: _RenderContext) -> str:
        return f"{_checked_field(self.field)} in {context.literal(self.values)}"

    def fields(self) -> frozenset[str]:
        return frozenset((self.field,))

    def matches(self, row: Mapping[str, Any]) -> bool:
        actual = row.get(self.field)
        return actual is not None and actual in self.values


@dataclass(frozen=True)
class ContainsAny(FilterExpr):
    field: str
    values: tuple[str, ...]

    def _render(self, context: _RenderContext) -> str:
        return f"array_contains_any({_checked_field(self.field)}, {context.literal(self.values)})"

    def fields(self) -> frozenset[str]:
        return frozenset((self.field,))

    def matches(self, row: Mapping[str, Any]) -> bool:
        actual = row.get(self.field)
        if actual is None or isinstance(actual, str):
            return False
        return any(value in self.values for value in actual)


@dataclass(frozen=True)
class JsonKeyIn(FilterExpr):
    """`field["key"]` is one of `values`, on a JSON field (the metadata of collections created before
    metadata keys could be declared; ragrpc.store.metadata_fields). Where a row has no such JSON field,
    `matches` reads the key's plain attribute instead (`schema.metadata_field(key)`), as the query
    service's in-process indexes keep a chunk's metadata."""

    field: str
    key: str
    values: tuple[str, ...]

    def _render(self, context: _RenderContext) -> str:
        if not _IDENTIFIER.match(self.key):
            raise ValueError(f"JSON key {self.key!r} is not an identifier")
        # milvus-lite's parser takes no `in` on a JSON path: one `==` per value
        path = f'{_checked_field(self.field)}["{self.key}"]'
        alternatives = " or ".join(f"{path} == {context.literal(value)}" for value in self.values)
        return f"({alternatives})" if len(self.values) > 1 else alternatives

    def fields(self) -> frozenset[str]:
        return frozenset((self.field,))

    def matches(self, row: Mapping[str, Any]) -> bool:
        document = row.get(self.field)
        if isinstance(document, Mapping):
            return document.get(self.key) in self.values
        return row.get(schema.metadata_field(self.key)) in self.values


@dataclass(frozen=True)
class Conjunction(FilterExpr):
    """`and` (all parts hold) or `or` (any part holds) of at least one part."""

    operator: str
    parts: tuple[FilterExpr, ...] = ()

    def _render(self, context: _RenderContext) -> str:
        if self.operator not in ("and", "or") or not self.parts:
            raise ValueError("a conjunction needs 'and'/'or' and at least one part")
        if len(self.parts) == 1:
            return self.parts[0]._render(context)
        return f" {self.operator} ".join(_parenthesised(p, context) for p in self.parts)

    def fields(self) -> frozenset[str]:
        return frozenset().union(*(part.fields() for part in self.parts))

    def matches(self, row: Mapping[str, Any]) -> bool:
        wanted = self.operator == "or"  # the result that decides early
        for part in self.parts:
            if part.matches(row) == wanted:
                return wanted
        return not wanted


def _parenthesised(part: FilterExpr, context: _RenderContext) -> str:
    text = part._render(context)
    needs_parens = isinstance(part, Conjunction) and len(part.parts) > 1
    return f"({text})" if needs_parens else text


class FilterBuilder:
    """Builds `FilterExpr`s for an allow-list of fields (name -> value type).

    Value types: str, int, float, bool, or list (an ARRAY<VARCHAR> field, filtered with
    `contains_any`). Violations raise InvalidInputError with `field=` the field name.
    """

    def __init__(
        self,
        fields: Mapping[str, type] = schema.FILTERABLE_FIELDS,
        *,
        max_lengths: Mapping[str, int] = DEFAULT_MAX_LENGTHS,
        max_values: int = DEFAULT_MAX_VALUES,
    ) -> None:
        for name in fields:
            _checked_field(name)
        self._fields = MappingProxyType(dict(fields))
        self._max_lengths = MappingProxyType(dict(max_lengths))
        self._max_values = max_values

    @property
    def fields(self) -> Mapping[str, type]:
        return self._fields

    def eq(self, field_name: str, value: Any) -> FilterExpr:
        return Comparison(field_name, "==", self._scalar(field_name, value))

    def ne(self, field_name: str, value: Any) -> FilterExpr:
        return Comparison(field_name, "!=", self._scalar(field_name, value))

    def gt(self, field_name: str, value: int | float | str) -> FilterExpr:
        """`field > value`; on a string field, byte-wise (UTF-8) order, as keyset pagination needs."""
        return Comparison(field_name, ">", self._scalar(field_name, value))

    def gte(self, field_name: str, value: int | float) -> FilterExpr:
        return Comparison(field_name, ">=", self._number(field_name, value))

    def lt(self, field_name: str, value: int | float) -> FilterExpr:
        return Comparison(field_name, "<", self._number(field_name, value))

    def lte(self, field_name: str, value: int | float) -> FilterExpr:
        return Comparison(field_name, "<=", self._number(field_name, value))

    def in_(self, field_name: str, values: Iterable[Any]) -> FilterExpr:
        checked = self._values(field_name, values, lambda v: self._scalar(field_name, v))
        return InList(field_name, checked)

    def contains_any(self, field_name: str, values: Iterable[str]) -> FilterExpr:
        if self._declared_type(field_name) is not list:
            raise InvalidInputError(f"{field_name} is not an array field", field=field_name)
        checked = self._values(field_name, values, lambda v: self._string(field_name, v))
        return ContainsAny(field_name, checked)

    def json_key_in(self, key: str, values: Iterable[str]) -> FilterExpr:
        """Chunks whose metadata JSON holds one of `values` under `key` (an identifier): the filter of the
        deprecated MetadataFilter fields on collections created before metadata keys could be declared.
        Collections that declare a key filter on its own field (`in_` on `schema.metadata_field(key)`)."""
        if not isinstance(key, str) or not _IDENTIFIER.match(key):
            raise InvalidInputError(f"metadata key {key!r} cannot be filtered on", field=str(key))
        field_path = f"{schema.METADATA}.{key}"

        def check(value: Any) -> str:
            if not isinstance(value, str) or not value or len(value) > schema.MAX_METADATA_VALUE_CHARS:
                raise InvalidInputError(
                    f"{key} values must be 1-{schema.MAX_METADATA_VALUE_CHARS} characters", field=field_path
                )
            with relabel(field_path):
                quote_string(value)
            return value

        return JsonKeyIn(schema.METADATA, key, self._values(field_path, values, check))

    def and_(self, *exprs: FilterExpr) -> FilterExpr:
        return _conjunction("and", exprs)

    def or_(self, *exprs: FilterExpr) -> FilterExpr:
        return _conjunction("or", exprs)

    def _declared_type(self, field_name: str) -> type:
        declared = self._fields.get(field_name) if isinstance(field_name, str) else None
        if declared is None:
            raise InvalidInputError(f"field {field_name!r} cannot be filtered on", field=str(field_name))
        return declared

    def _scalar(self, field_name: str, value: Any) -> Any:
        declared = self._declared_type(field_name)
        if declared is str:
            return self._string(field_name, value)
        if declared is bool:
            if not isinstance(value, bool):
                raise InvalidInputError(f"{field_name} needs a bool", field=field_name)
            return value
        if declared in (int, float):
            return self._number(field_name, value)
        raise InvalidInputError(f"{field_name} supports only contains_any", field=field_name)

    def _number(self, field_name: str, value: Any) -> int | float:
        declared = self._declared_type(field_name)
        if declared not in (int, float):
            raise InvalidInputError(f"{field_name} is not a numeric field", field=field_name)
        if isinstance(value, bool) or not isinstance(value, declared | int):
            raise InvalidInputError(f"{field_name} needs a {declared.__name__}", field=field_name)
        if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
            raise InvalidInputError(f"{field_name} value is outside int64", field=field_name)
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInputError(f"{field_name} needs a finite number", field=field_name)
        return float(value) if declared is float else int(value)

    def _string(self, field_name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise InvalidInputError(f"{field_name} needs a string", field=field_name)
        limit = self._max_lengths.get(field_name)
        if limit is not None and len(value) > limit:
            raise InvalidInputError(f"{field_name} value longer than {limit} characters", field=field_name)
        with relabel(field_name):
            quote_string(value)  # rejects control characters and lone surrogates
        return value

    def _values(self, field_name: str, values: Iterable[Any], check: Callable[[Any], Any]) -> tuple:
        if isinstance(values, str | bytes) or not isinstance(values, Iterable):
            raise InvalidInputError(f"{field_name} needs a list of values", field=field_name)
        checked = tuple(dict.fromkeys(check(v) for v in values))  # dedupe, keep order
        if not checked:
            raise InvalidInputError(f"{field_name} needs at least one value", field=field_name)
        if len(checked) > self._max_values:
            raise InvalidInputError(f"{field_name} takes at most {self._max_values} values", field=field_name)
        return checked


def _conjunction(operator: str, exprs: tuple[FilterExpr, ...]) -> FilterExpr:
    if not exprs:
        raise ValueError(f"{operator}_ needs at least one expression")
    parts: list[FilterExpr] = []
    for expr in exprs:
        if not isinstance(expr, FilterExpr):
            raise TypeError(f"expected FilterExpr, got {type(expr).__name__}")
        same = isinstance(expr, Conjunction) and expr.operator == operator
        parts.extend(expr.parts if same else (expr,))  # type: ignore[attr-defined]
    return parts[0] if len(parts) == 1 else Conjunction(operator, tuple(parts))


@contextmanager
def relabel(field_path: str) -> Iterator[None]:
    """Re-raise InvalidInputError with `field_path` as its field violation."""
    try:
        yield
    except InvalidInputError as error:
        raise InvalidInputError(error.message, field=field_path, reason=error.reason) from error


DEFAULT_BUILDER = FilterBuilder()  # immutable; these functions build for schema.FILTERABLE_FIELDS
eq, ne, gt, gte, lt, lte = (
    DEFAULT_BUILDER.eq,
    DEFAULT_BUILDER.ne,
    DEFAULT_BUILDER.gt,
    DEFAULT_BUILDER.gte,
    DEFAULT_BUILDER.lt,
    DEFAULT_BUILDER.lte,
)
in_, contains_any = DEFAULT_BUILDER.in_, DEFAULT_BUILDER.contains_any
and_, or_ = DEFAULT_BUILDER.and_, DEFAULT_BUILDER.or_


def chunks_of_generation(tenant: str, document_id: str, generation: str) -> FilterExpr:
    """All chunks one ingestion attempt of a document wrote (what the writer deletes of a failed or
    replaced attempt)."""
    return and_(eq(schema.TENANT, tenant), eq(schema.DOCUMENT_ID, document_id), eq(schema.GENERATION, generation))


def chunks_of_document(tenant: str, document_id: str) -> FilterExpr:
    """Every chunk of a document, whatever its generation (what a delete removes)."""
    return and_(eq(schema.TENANT, tenant), eq(schema.DOCUMENT_ID, document_id))
