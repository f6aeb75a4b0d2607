"""docs/configuration.md, the reference of every setting, generated from ragrpc/config.py.

    python -m scripts.configuration_doc            rewrite docs/configuration.md
    python -m scripts.configuration_doc --check    exit 1 when it differs from what config.py gives (make lint)

One section a concern (ragrpc.config.GROUPS), one table row a setting: its environment variable, its
default and its meaning, as the Settings field declares them. tests/unit/test_configuration_doc.py
fails when the file and the settings drift apart.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ragrpc.config import GROUPS, settings_table, ungrouped_settings

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"

INTRO = """\
Every setting is an environment variable, read once when a service starts (`Settings.from_env` in
`ragrpc/config.py`); an unset or empty variable keeps the default. Booleans are true for `1`, `true`,
`yes` or `on`. Both services read the same variables, each the ones its work needs, so one environment
(a `.env` file, a Compose `environment:` block, a Helm values file) can serve both."""


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


def render() -> str:
    """The whole of docs/configuration.md. Raises ValueError when a setting names no known group."""
    if missing := ungrouped_settings():
        raise ValueError(f"settings without a known group (add group=... in ragrpc/config.py): {', '.join(missing)}")
    contents = " · ".join(f"[{g.title}](#{anchor(g.title)})" for g in GROUPS)
    parts = [
        "# Configuration reference",
        "<!-- Generated from ragrpc/config.py by `python -m scripts.configuration_doc`: edit the settings there, "
        "not this file (a test fails when the two differ). -->",
        INTRO,
        contents,
    ]
    for group in GROUPS:
        parts += [f"## {group.title}", group.about, settings_table(group.key)]
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when the file is stale")
    args = parser.parse_args(argv)
    expected = render()
    if args.check:
        if not DOC.exists() or DOC.read_text() != expected:
            print(f"{DOC} is stale: run python -m scripts.configuration_doc (or make config-doc)", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(expected)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
