"""One supported-Python floor, said the same way everywhere: pyproject's requires-python (what
pip enforces), ruff's target-version and mypy's python_version (what the linters check the
code against), the README's requirement line and .ci/run's interpreter check, which reads
requires-python itself. The code uses 3.11 features (asyncio.timeout in ragrpc/deadlines.py;
TimeoutError caught around asyncio.wait_for), so the floor cannot go below 3.11."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from scripts import check_python

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _minimum() -> tuple[int, ...]:
    return check_python.minimum_version(PYPROJECT["project"]["requires-python"])


def test_the_floor_is_what_the_code_needs() -> None:
    assert _minimum()[:2] >= (3, 11)


def test_the_running_interpreter_satisfies_requires_python() -> None:
    assert sys.version_info[: len(_minimum())] >= _minimum()


def test_linters_target_the_floor() -> None:
    major, minor = _minimum()[:2]
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    assert PYPROJECT["tool"]["mypy"]["python_version"] == f"{major}.{minor}"


def test_readme_states_the_floor() -> None:
    major, minor = _minimum()[:2]
    assert f"Python {major}.{minor}+" in (ROOT / "README.md").read_text()


def test_ci_checks_the_interpreter_before_installing() -> None:
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in commands if line and not line.startswith("#")]
    assert commands.index('"$PYTHON" scripts/check_python.py') < commands.index("make install")


def test_the_check_reads_requires_python_without_tomllib(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "pyproject.toml").read_text()
    with_tomllib = check_python.requires_python(text)
    monkeypatch.setitem(sys.modules, "tomllib", None)  # as on Python < 3.11: import fails
    assert check_python.requires_python(text) == with_tomllib == PYPROJECT["project"]["requires-python"]


def test_the_check_fails_an_older_interpreter_clearly() -> None:
    ok, line = check_python.check((3, 10, 14), ">=3.11")
    assert not ok and "3.10.14" in line and "older than requires-python >=3.11" in line
    assert check_python.check((3, 11, 0), ">=3.11")[0]
    assert check_python.check((3, 12, 1), ">=3.11")[0]
    assert not check_python.check((3, 11, 1), ">=3.11.2")[0]
    with pytest.raises(ValueError, match="only '>=X.Y"):
        check_python.minimum_version(">=3.11,<4")


def test_the_check_passes_here_and_prints_the_version() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_python.py")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}." in done.stdout
