"""docs/configuration.md is exactly what ragrpc/config.py generates (scripts/configuration_doc.py), and
every setting belongs to one of the groups the reference is organised by."""

from __future__ import annotations

import dataclasses

import pytest

from ragrpc.config import GROUPS, Settings, ungrouped_settings
from scripts import configuration_doc


def test_reference_matches_the_settings() -> None:
    assert configuration_doc.DOC.read_text() == configuration_doc.render(), (
        "docs/configuration.md is stale: run python -m scripts.configuration_doc (make config-doc)"
    )


def test_every_setting_names_a_known_group_and_every_group_has_settings() -> None:
    assert ungrouped_settings() == []
    used = {f.metadata["group"] for f in dataclasses.fields(Settings)}
    assert used == {g.key for g in GROUPS}


def test_every_setting_appears_once_under_its_group() -> None:
    text = configuration_doc.render()
    sections = {g.title: text.split(f"\n## {g.title}\n", 1)[1].split("\n## ", 1)[0] for g in GROUPS}
    for f in dataclasses.fields(Settings):
        row = f"| `{f.metadata['env']}` |"
        assert text.count(row) == 1
        title = next(g.title for g in GROUPS if g.key == f.metadata["group"])
        assert row in sections[title]


def test_a_pipe_in_a_meaning_does_not_split_the_row() -> None:
    row = next(line for line in configuration_doc.render().splitlines() if "`RAGRPC_LLM_ENDPOINTS`" in line)
    assert row.replace("\\|", "").count("|") == 4


def test_a_setting_without_a_group_fails_the_render(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(configuration_doc, "ungrouped_settings", lambda: ["RAGRPC_NEW_THING"])
    with pytest.raises(ValueError, match="RAGRPC_NEW_THING"):
        configuration_doc.render()


def test_check_mode_reports_a_stale_file(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(configuration_doc.render().replace("| `RAGRPC_HNSW_M` | `16` |", "| `RAGRPC_HNSW_M` | `32` |"))
    monkeypatch.setattr(configuration_doc, "DOC", stale)
    assert configuration_doc.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert configuration_doc.main([]) == 0 and configuration_doc.main(["--check"]) == 0


def test_anchor_follows_github_headings() -> None:
    assert configuration_doc.anchor("Store (Milvus)") == "store-milvus"
    assert configuration_doc.anchor("Logs, metrics and tracing") == "logs-metrics-and-tracing"
