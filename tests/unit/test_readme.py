"""The README stays in step with the code: it opens with the two commands, its configuration tables
name real settings with their real defaults (the full reference, docs/configuration.md, is generated
and checked by test_configuration_doc.py), and its API section names every RPC."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ragrpc.config import Settings

README = Path(__file__).resolve().parents[2] / "README.md"
SETTINGS = {f.metadata["env"]: f.default for f in dataclasses.fields(Settings)}


def _section(text: str, heading: str) -> str:
    """The text under `heading` (a line of its own) up to the next heading of the same level."""
    level = heading.split(" ", 1)[0]
    body = text.split(f"\n{heading}", 1)[1]
    return re.split(rf"\n{level} ", body, maxsplit=1)[0]


def _shown(default: object) -> str:
    return "(empty)" if default == "" else str(default)


def test_readme_opens_with_demo_and_test() -> None:
    text = README.read_text()
    first_block = text.split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert commands == ["make demo", "make test"]


def test_configuration_points_to_the_generated_reference() -> None:
    assert "(docs/configuration.md)" in _section(README.read_text(), "## Configuration")


def test_configuration_tables_state_real_settings_and_their_defaults() -> None:
    rows = [line for line in _section(README.read_text(), "## Configuration").splitlines() if "`RAGRPC_" in line]
    assert len(rows) >= 9  # a table a group at least
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        names = re.findall(r"`(RAGRPC_\w+)`", cells[0])
        defaults = [d.strip().strip("`") for d in cells[1].split(" / ")]
        if len(defaults) == 1:  # one default shared by the row's variables
            defaults *= len(names)
        assert len(names) == len(defaults), row
        for name, default in zip(names, defaults, strict=True):
            assert name in SETTINGS, f"README names {name}, which ragrpc/config.py does not declare"
            assert default == _shown(SETTINGS[name]), f"README says {name} defaults to {default!r}"


def test_every_variable_the_readme_names_is_a_setting() -> None:
    """A service setting (ragrpc/config.py) or a variable the CLI reads (clients/)."""
    named = set(re.findall(r"\bRAGRPC_[A-Z0-9_]+\b", README.read_text()))
    cli = {
        name
        for path in (README.parent / "clients").glob("*.py")
        for name in re.findall(r"[\"'](RAGRPC_[A-Z0-9_]+)[\"']", path.read_text())
    }
    known = set(SETTINGS) | cli
    assert named and not named - known, f"not settings: {sorted(named - known)}"


def test_api_section_names_every_rpc() -> None:
    from ragrpc.v1 import ingest_pb2, retrieve_pb2

    text = _section(README.read_text(), "### API")
    for module in (ingest_pb2, retrieve_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            assert service.name in text
            for method in service.methods:
                assert f"`{method.name}`" in text, f"README API section misses {service.name}.{method.name}"
