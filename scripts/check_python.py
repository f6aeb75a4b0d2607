"""Prints the interpreter that runs it and fails (exit 1) when it is older than pyproject.toml's
`requires-python`, which is read here so the check and the package metadata never drift.

    python3 scripts/check_python.py    # .ci/run does this before `make install`

Meant to run on any interpreter, old ones included, so it keeps to old syntax and falls back to
a plain line match where tomllib (3.11+) is missing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
_LINE = re.compile(r'^\s*requires-python\s*=\s*"([^"]*)"', re.MULTILINE)
_CLAUSE = re.compile(r"^\s*>=\s*(\d+)\.(\d+)(?:\.(\d+))?\s*$")


def requires_python(text: str) -> str:
    """The `requires-python` specifier of a pyproject.toml text."""
    try:
        import tomllib
    except ImportError:  # older than 3.11: the check below will say so
        match = _LINE.search(text)
        if match is None:
            raise ValueError("pyproject.toml has no requires-python") from None
        return match.group(1)
    return str(tomllib.loads(text)["project"]["requires-python"])


def minimum_version(specifier: str) -> tuple[int, ...]:
    """The version of a ">=X.Y[.Z]" specifier; other forms are refused rather than misread."""
    match = _CLAUSE.match(specifier)
    if match is None:
        raise ValueError(f"requires-python {specifier!r}: only '>=X.Y[.Z]' is understood here")
    return tuple(int(part) for part in match.groups() if part is not None)


def check(version: tuple[int, ...], specifier: str) -> tuple[bool, str]:
    """Whether `version` satisfies `specifier`, and a line that says so."""
    minimum = minimum_version(specifier)
    found = ".".join(str(part) for part in version[:3])
    if tuple(version[: len(minimum)]) >= minimum:
        return True, f"Python {found} at {sys.executable} (requires-python {specifier})"
    return False, (
        f"Python {found} at {sys.executable} is older than requires-python {specifier} (pyproject.toml); "
        f"run with a newer interpreter, e.g. PYTHON=python{minimum[0]}.{minimum[1]}"
    )


def main() -> int:
    ok, line = check(tuple(sys.version_info[:3]), requires_python(PYPROJECT.read_text()))
    print(f"ci: {line}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
