"""Prints one table per bench section and writes every number as JSON."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

from scripts.bench.common import SectionResult, fmt
from scripts.processes import REPO


def machine_facts() -> dict[str, Any]:
    """Core count, load, CPU model and commit: what a reader needs to judge the numbers."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, timeout=10
            ).stdout.strip()
        )
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "commit": commit + ("+dirty" if dirty else ""),
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m scripts.bench", *sys.argv[1:]]),
    }


def render_section(section: SectionResult, cores: int | None) -> str:
    """A fixed-width table: figure, value, unit, ratio (and what it is against), note."""
    lines = [f"== {section.name} ({section.seconds:.0f} s, {cores} cores) =="]
    if section.error:
        lines.append(f"   FAILED: {section.error}")
    if section.figures:
        width = max(28, *(len(f.name) for f in section.figures))
        lines.append(f"   {'figure':{width}s} {'value':>10s} {'unit':10s} {'ratio':>7s}  vs / note")
        for f in section.figures:
            rel = "" if f.ratio is None else fmt(f.ratio)
            tail = "  ".join(x for x in (f.versus and f"vs {f.versus}", f.note) if x)
            lines.append(f"   {f.name:{width}s} {fmt(f.value):>10s} {f.unit:10s} {rel:>7s}  {tail}".rstrip())
    for note in section.notes:
        lines.append(f"   * {note}")
    return "\n".join(lines)


def print_report(sections: list[SectionResult], facts: dict[str, Any], out: TextIO) -> None:
    print(
        f"ragrpc bench: {facts['cpu_count']} cores ({facts['cpu_model']}), load {facts['load_average']} "
        f"at start, commit {facts['commit']}",
        file=out,
    )
    for section in sections:
        print("", file=out)
        print(render_section(section, facts["cpu_count"]), file=out)


def to_json(sections: list[SectionResult], facts: dict[str, Any], *, quick: bool) -> dict[str, Any]:
    return {
        "machine": facts,
        "quick": quick,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "sections": {s.name: dataclasses.asdict(s) for s in sections},
    }


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=_json_default, allow_nan=True))
    tmp.replace(path)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return str(value)


def write_docs_section(docs: Path, begin: str, end: str, lines: list[str]) -> None:
    """Puts `lines` between the markers `begin` and `end` in docs/benchmarks.md (replacing what was there), or
    appends them with the markers where the file has none; the rest of the file is kept as it is."""
    path = docs / "benchmarks.md"
    old = path.read_text() if path.exists() else "# Benchmarks\n\n"
    text = "\n".join([begin, *lines, end])
    if begin in old and end in old:
        head, _, rest = old.partition(begin)
        new = head + text + rest.partition(end)[2]
    else:
        new = old.rstrip() + "\n\n" + text + "\n"
    path.write_text(new)
