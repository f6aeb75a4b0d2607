"""Milvus filter literals: a value rendered so that it can never change the structure of the
expression around it (ragrpc.store.filters builds every expression with these).

  * string literals are double-quoted; backslash, `"`, newline, CR and tab are escaped (the
    escapes milvus-lite and Milvus's Go parser share); other control characters (C0, DEL,
    C1) and lone surrogates are rejected (no shared escape; never a legitimate value);
  * bool is not int; floats are finite; ints within int64.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ragrpc.errors import InvalidInputError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_FORBIDDEN_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPE_PATTERN = re.compile(r'[\\"\n\r\t]')


def quote_string(value: str) -> str:
    """A Milvus double-quoted literal whose parsed value is exactly `value`."""
    if not isinstance(value, str):
        raise TypeError(f"expected str, got {type(value).__name__}")
    bad = _FORBIDDEN_CHARS.search(value)
    if bad:
        raise InvalidInputError(f"character U+{ord(bad.group()):04X} is not allowed in a filter value")
    return '"' + _ESCAPE_PATTERN.sub(lambda m: _ESCAPES[m.group()], value) + '"'


def render_literal(value: Any) -> str:
    """Render a validated scalar or list value as a Milvus literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise InvalidInputError(f"integer {value} is outside int64")
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError("NaN and infinite numbers are not allowed in a filter")
        return repr(value)
    if isinstance(value, str):
        return quote_string(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(render_literal(v) for v in value) + "]"
    raise TypeError(f"cannot render {type(value).__name__} as a filter literal")
