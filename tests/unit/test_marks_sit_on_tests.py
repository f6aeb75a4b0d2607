"""A pytest mark on a function that is not a test does nothing, silently: a helper once inserted
between a test and its @slow / @timeout marks took them, and the test ran unmarked. Every
`@pytest.mark...` in tests/ must decorate a test function or a test class."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _misplaced_marks(path: Path, root: Path = TESTS) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("test"):
            names = [ast.unparse(d) for d in node.decorator_list]
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("Test"):
            names = [ast.unparse(d) for d in node.decorator_list]
        else:
            continue
        found += [
            f"{path.relative_to(root)}:{node.lineno} {node.name}: @{n}" for n in names if n.startswith("pytest.mark.")
        ]
    return found


def test_every_mark_decorates_a_test() -> None:
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 100  # the tree was found
    misplaced = [entry for path in files for entry in _misplaced_marks(path)]
    assert not misplaced, "pytest marks on functions that are not tests:\n" + "\n".join(misplaced)


def test_the_check_finds_a_mark_on_a_helper(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import pytest\n\n@pytest.mark.slow\nasync def _helper():\n    pass\n\n"
        "@pytest.mark.slow\ndef test_real():\n    pass\n"
    )
    assert _misplaced_marks(sample, tmp_path) == ["test_sample.py:4 _helper: @pytest.mark.slow"]
