"""Whether a title names its document, and the date pattern that tells a date from a title.

Shared by the ingest service's title choice (`ingest_service.document_facts.choose_title`) and by
enrichers that read a document's stated title (`ragrpc.enrich.filings`). Pure and deterministic.
"""

from __future__ import annotations

import re

MONTH = (  # "Dec.", "DECEMBER", "Sept."
    r"\b(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?"
    r"|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
DATE = (  # "May 1, 2018", "1st May 2018", "2018-05-01"
    rf"(?:{MONTH}\.?\s*\d{{1,2}}\s*,?\s*\d{{4}}|\d{{1,2}}(?:st|nd|rd|th)?\s+{MONTH}\.?,?\s+\d{{4}}|\d{{4}}-\d\d-\d\d)"
)


def _rx(pattern: str, flags: int = re.A | re.I) -> re.Pattern[str]:  # ASCII folding: no Kelvin sign for "k"
    return re.compile(pattern, flags)


_PLACEHOLDER_TITLE = _rx(
    r"(?:untitled(?:\s+document)?|document|doc|(?:powerpoint\s+)?presentation|microsoft\s+word\s+document|slide"
    r"|new\s+document|title|no\s+title|none|null|n/?a|unknown|default|book|sheet)\s*\d*",
    re.I,
)
_OFFICE_PREFIX = _rx(r"(?:microsoft\s+)?(?:word|powerpoint|excel)\s+-\s", re.I)  # print-driver titles
_PATH_OR_FILE = _rx(r"^(?:[a-z]:[\\/]|[\\/~]|file:)|\.(?:pdf|docx?|pptx?|xlsx?|txt|md|html?|rtf|odt|csv)$")
_UUID = _rx(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}")
_HEX_HASH = _rx(r"(?:0x)?(?=[a-f]*\d)[0-9a-f]{8,}")
_TIMESTAMP = _rx(r"(?:D:)?[\d\s:/.,+'-]+(?:[TZ][\d\s:/.,+'-]*)*|" + DATE)  # "2018-02-01T10:00:00Z", "May 1, 2018"


def meaningful_title(title: str, *, file_name: str = "") -> bool:
    """Whether a PDF/DOCX title names the document, rather than being empty, an id, a path or a placeholder."""
    text = " ".join(title.split())
    stem = re.split(r"[\\/]", file_name)[-1].rsplit(".", 1)[0]
    if len(text) < 3 or not any(c.isalpha() for c in text):  # accession numbers, pure numbers and dates
        return False
    if any(p.fullmatch(text) for p in (_PLACEHOLDER_TITLE, _UUID, _HEX_HASH, _TIMESTAMP)):
        return False
    if _OFFICE_PREFIX.match(text) or _PATH_OR_FILE.search(text) or text.lower() == file_name.lower():
        return False
    if " " not in text and ("_" in text or sum(c.isdigit() for c in text) >= sum(c.isalpha() for c in text)):
        return False  # one token like "report_final_v2" or "amzn-20171231x10k"
    return not (" " not in text and text.lower() == stem.lower())
