"""Text normalisation applied to extracted blocks before chunking.

Prose blocks: Unicode NFKC, control characters and NUL removed, invisible characters
removed, runs of spaces collapsed, blank-line runs collapsed, boilerplate lines dropped
("Page 3 of 10", lone page numbers, "Click here to ...", "All rights reserved").
TABLE and CODE blocks keep their line structure (code keeps its indentation too).
Blocks left empty are dropped.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
import unicodedata
from collections.abc import Iterable
from typing import Literal

from ragrpc.models import Block, BlockKind

# C0/C1 controls except \t and \n (\r is normalised to \n before this runs).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Zero-width space / word joiner / BOM / soft hyphen; ZWJ and ZWNJ are kept (scripts need them).
_INVISIBLE = re.compile("[\u200b\u2060\ufeff\u00ad]")
_SPACES = re.compile(r"[ \t\f\v\u00a0\u2000-\u200a\u202f\u205f\u3000]+")
_BLANK_LINES = re.compile(r"\n{3,}")

_BOILERPLATE = re.compile(
    r"""^(?:
        (?:page|p\.|seite|página|pagina)\s*\d{1,5}(?:\s*(?:of|/|von|de|di)\s*\d{1,5})?
      | [-–—]?\s*\d{1,4}\s*[-–—]?
      | \d{1,4}\s*/\s*\d{1,4}
      | click\s+here\b.*
      | (?:©|\(c\)|copyright)?[^\n]{0,80}\ball\s+rights\s+reserved\.?
      | back\s+to\s+top
      | skip\s+to\s+(?:main\s+)?content
      | jump\s+to\s+(?:navigation|search|content)
      | (?:print|share)\s+this\s+(?:page|article)
    )$""",
    re.IGNORECASE | re.VERBOSE,
)


def _normalise_chars(text: str, form: Literal["NFC", "NFKC"]) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = unicodedata.normalize(form, text)
    text = _CONTROL.sub("", text)
    return _INVISIBLE.sub("", text)


def is_boilerplate_line(line: str) -> bool:
    """True for a line that carries no content (page counters, legal footers, UI text)."""
    return bool(_BOILERPLATE.match(line.strip()))


def clean_text(text: str) -> str:
    """Normalise prose: NFKC, no controls, collapsed whitespace, no boilerplate lines."""
    text = _normalise_chars(text, "NFKC")
    lines = (_SPACES.sub(" ", line).strip() for line in text.split("\n"))
    kept = [line for line in lines if not is_boilerplate_line(line) or not line]
    return _BLANK_LINES.sub("\n\n", "\n".join(kept)).strip()


def clean_code(text: str) -> str:
    """Normalise source code: NFC only, controls removed, indentation and lines kept."""
    text = _normalise_chars(text, "NFC")
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    return textwrap.dedent("\n".join(lines)).rstrip()


def clean_table(text: str) -> str:
    """Normalise a Markdown table: each line cleaned on its own, line structure kept."""
    text = _normalise_chars(text, "NFKC")
    lines = (_SPACES.sub(" ", line).strip() for line in text.split("\n"))
    return "\n".join(line for line in lines if line)


def clean_block(block: Block) -> Block | None:
    """The cleaned block, or None when nothing is left of it."""
    if block.kind is BlockKind.CODE:
        text = clean_code(block.text)
        return dataclasses.replace(block, text=text) if text.strip() else None
    if block.kind is BlockKind.TABLE:
        text = clean_table(block.text)
        header = clean_table(block.table_header)
        return dataclasses.replace(block, text=text, table_header=header) if text else None
    text = clean_text(block.text)
    if not text:
        return None
    path = tuple(p for p in (clean_text(s) for s in block.section_path) if p)
    return dataclasses.replace(block, text=text, section_path=path)


def clean_blocks(blocks: Iterable[Block]) -> list[Block]:
    """Clean every block; blocks left empty are dropped, order is kept."""
    cleaned = (clean_block(b) for b in blocks)
    return [b for b in cleaned if b is not None]
