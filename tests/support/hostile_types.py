"""What a generated hostile document is: its bytes, what a caller declares about them, and what the
service may do with it (see tests/support/hostile_inputs.py)."""

from __future__ import annotations

from dataclasses import dataclass

MEDIA_PDF = "application/pdf"
MEDIA_DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
MEDIA_HTML = "text/html"
MEDIA_TEXT = "text/plain"
MEDIA_MARKDOWN = "text/markdown"


@dataclass(frozen=True)
class HostileInput:
    name: str  # short label, also used to build the document id
    content: bytes
    file_name: str
    media_type: str = ""
    expect: str = "either"  # "refuse" | "either"
    password: str = ""

    @property
    def document_id(self) -> str:
        clean = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in self.name)
        return f"hostile-{clean}"[:128]
