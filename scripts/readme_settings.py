"""Rewrites the configuration table of README.md from ragrpc.config (python -m scripts.readme_settings)."""

from __future__ import annotations

from pathlib import Path

from ragrpc.config import settings_table

START, END = "<!-- settings:start -->", "<!-- settings:end -->"
README = Path(__file__).resolve().parents[1] / "README.md"


def main() -> None:
    text = README.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{settings_table()}\n{END}{tail}")


if __name__ == "__main__":
    main()
