"""The README stays in step with the code: it opens with the two commands, and its
configuration table is exactly what Settings declares."""

from __future__ import annotations

from pathlib import Path

from ragrpc.config import settings_table

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_opens_with_demo_and_test() -> None:
    text = README.read_text()
    first_block = text.split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in first_block.strip().splitlines()]
    assert commands == ["make demo", "make test"]


def test_configuration_table_matches_settings() -> None:
    assert settings_table() in README.read_text(), "README is stale: run python -m scripts.readme_settings"


def test_api_section_names_every_rpc() -> None:
    from ragrpc.v1 import ingest_pb2, retrieve_pb2

    text = README.read_text().split("## API", 1)[1].split("\n## ", 1)[0]
    for module in (ingest_pb2, retrieve_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            assert service.name in text
            for method in service.methods:
                assert f"`{method.name}`" in text, f"README API section misses {service.name}.{method.name}"
