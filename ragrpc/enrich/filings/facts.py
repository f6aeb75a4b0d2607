"""The facts users filter filings and reports by: organisation, document type, fiscal period, period end.

Pure and deterministic: reads the text of a document's first pages (and its title, when that is a real title,
see `ragrpc.enrich.titles.meaningful_title`) and returns `FilingFacts`, whose `sources` say which rule and which
text gave each value. A fact that no rule finds is "", never a guess from body text. Only the first 8,000
characters are read, and nothing from text that looks like a paper (an Abstract or Keywords line, arXiv, a DOI):
papers quote filings.

- document_type is one of DOCUMENT_TYPES. Precedence: an SEC form line ("Form 10-Q" alone on a line, or "FORM
  10-K" in capitals; the earliest) > "ANNUAL/QUARTERLY REPORT PURSUANT TO SECTION 13" > the title naming a form or
  a kind > an earnings headline in the first 2,000 characters > a short line naming a kind ("2017 Annual Report",
  "INVOICE"; the earliest) > a form in the file name ("amzn-20171231x10k.pdf"). An 8-K filing stays "8-K" even when
  its exhibit is an earnings release.
- organization, only for a document of a known type: the line(s) above "(Exact name of registrant as specified in
  its charter)"; else "Name, Inc. (NASDAQ: TICK)"; else a name-like line ending in a legal suffix among the first
  lines. ALL-CAPS names are title-cased word by word ("AMAZON.COM, INC." -> "Amazon.com, Inc."); words of three
  letters or fewer (IBM, AT&T, 3M, N.V.) stay as written; sources keep the raw text.
- ticker, only for a document of a known type: the trading symbol of the first class of securities in a cover's
  "Trading Symbol(s)" table (as lines of text or as a table; symbols with digits, of notes such as "JNJ24C", are
  skipped), else the first "(NYSE: JNJ)" / "(Nasdaq: AMD)". Questions name companies by ticker ("AMD", "JnJ");
  an all-capitals cover, where a symbol can't be told from the words around it, gives none.
- fiscal_period and period_end: see ragrpc.enrich.filings.periods (the cover's stated period or period end; for a
  bare quarter end, the quarter the document's text names most, or its file name's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ragrpc.enrich.filings.periods import HEADLINE_CHARS, find_period, first_match, rx
from ragrpc.enrich.titles import meaningful_title

DOCUMENT_TYPES = frozenset(
    {"10-K", "10-Q", "8-K", "20-F", "annual report", "quarterly report", "earnings release", "proxy statement"}
    | {"prospectus", "bank statement", "invoice"}
)
_COVER_CHARS, _TOP_CHARS = 8_000, 1_500


@dataclass(frozen=True)
class FilingFacts:
    organization: str = ""
    document_type: str = ""  # one of DOCUMENT_TYPES, or ""
    fiscal_period: str = ""  # "FY2017" or "2018-Q2", or ""
    period_end: str = ""  # ISO date, or ""
    sources: dict[str, str] = field(default_factory=dict, hash=False)  # field name -> "rule: 'text'"
    ticker: str = ""  # trading symbol, e.g. "AMD", or ""


# --- document type -------------------------------------------------------------------------------------------
_FORM = r"(10-?K|10-?Q|8-?K|20-?F)(?:/A)?"
_FORM_LINE = rx(rf"^[ \t]*form[ \t]*{_FORM}[ \t]*$", re.I | re.M)  # "Form 10-Q" alone on its line
_FORM_CAPS = rx(rf"\bFORM\s*{_FORM}\b", 0)  # "FORM 10-K" in capitals, anywhere near the top
_SECTION_13 = rx(r"(?<![☐□¨] )(?<![☐□¨])\b(ANNUAL|QUARTERLY)\s+REPORT\s+PURSUANT\s+TO\s+SECTION\s+13")
_NAMED_FORM = rx(r"(?:(?<![a-z0-9])|(?<=\dx))(?:form[-_\s]*)?(10-?k|10-?q|8-?k|20-?f)(?![a-z0-9])")  # title, file
_EARNINGS = rx(  # "Apple Reports Fourth Quarter Results", "announced financial results for the quarter ended"
    r"\b(?:report|announce|post|deliver|release)(?:s|d|ed)?\b[^.]{0,80}?\b(?:quarter(?:ly)?|q[1-4]|full[- ]year"
    r"|fiscal[- ]year|year[- ]end)\b[^.]{0,60}?\b(?:results|earnings|sales|revenues?)\b"
    r"|\bresults\s+for\s+the\s+(?:\w+\s+){0,2}(?:quarter|three\s+months)\b"
)
_KINDS = (  # a short line or the title naming the kind of document; the first kind found in a line wins
    (
        "earnings release",
        rx(
            r"\bearnings\s+(?:press\s+)?release\b|\b(?:q[1-4]|first|second|third|fourth|quarter"
            r"(?:ly)?|full[- ]year)\b.*\b(?:results|earnings)\b"
        ),
    ),
    ("quarterly report", rx(r"\bquarterly\s+report\b")),
    ("proxy statement", rx(r"\bproxy\s+statement\b|\bschedule\s+14a\b")),
    ("annual report", rx(r"\bannual\s+report\b(?!\s+on\s+form)")),
    ("prospectus", rx(r"\bprospectus\b|\brule\s+424\s*\(b\)")),
    ("bank statement", rx(r"\bstatement\s+(?:of\s+account|period)\b|\b(?:account|bank)\s+statement\b")),
    ("invoice", rx(r"\binvoice\b")),
)
_PAPER = rx(r"^\s*abstract\b|\barxiv\b|\bdoi:?\s*10\.\d|^\s*keywords?\s*:", re.A | re.I | re.M)

# --- organisation --------------------------------------------------------------------------------------------
_SUFFIX = (  # legal suffixes that end a company name
    r"(?:Inc|Incorporated|Corp(?:oration)?|Co(?:mpany)?|Ltd|Limited|plc|N\.\s?V|N\.\s?A|S\.\s?A|AG|SE|GmbH|LLC|L\.L\.C"
    r"|LLP|L\.\s?P|LP|Group|Holdings|Bancorp)\.?"
)
_ENDS_WITH_SUFFIX = rx(rf"(?:^|[\s,]){_SUFFIX}$", re.I)
_ONLY_SUFFIXES = rx(rf"(?:[\s,]*{_SUFFIX})+", re.I)  # "GROUP, INC." continues the line above
_ABBREVIATION_END = rx(r"(?:^|[\s,.])(?:Inc|Corp|Co|Ltd|Bros|Cos|[VAPCB])\.$", re.I)  # keeps "Inc.", "N.V."
_REGISTRANT = rx(r"\(?\s*exact\s+name\s+of\s+(?:the\s+)?registrant", re.I)
_COVER_NOISE = rx(  # what sits between a registrant's name and its label on real covers
    r"\b\d{2}-\d{7}\b|commission\s+file|file\s+number|transition\s+period|pursuant\s+to|exchange\s+act|jurisdiction"
    r"|(?:year|period)\s+ended|identification|incorporation|\(mark\s+one\)|^\(.*\)$|^or$|^form\s|[☐☒☑□■¨]",
    re.I,
)
_TICKER = rx(r"\((?:NASDAQ|Nasdaq|NYSE|AMEX|TSX|LSE|OTC\w*)[^():]{0,20}:\s*[A-Z.]{1,6}(?:,\s*[A-Z.]{1,6})*\)", 0)
_NAME_WORD = rx(r"(?:[A-Z0-9][\w.&'’-]*|[a-z]+[A-Z][\w.&'’-]*|&|and|of|the|de|du|des|la|le|y),?", 0)
_CONNECTORS = frozenset({"AND", "OF", "THE", "DE", "DU", "DES", "LA", "LE", "Y", "FOR", "&"})
_COMMON_SHORT = frozenset({"NEW", "ONE", "TWO", "OIL", "GAS", "AIR", "CAR", "BIG", "RED", "SUN", "SEA", "BAY", "TOP"})
_SUFFIX_CASE = {"INC": "Inc", "CORP": "Corp", "CO": "Co", "LTD": "Ltd", "PLC": "plc", "GMBH": "GmbH", "COS": "Cos"}


def _normalize(text: str) -> str:
    """Unify dashes and spaces, drop soft hyphens and marks, rejoin words hyphenated across lines."""
    text = text.translate({0x2010: "-", 0x2011: "-", 0x2012: "-", 0x2013: "-", 0xAD: None, 0xAE: None, 0x2122: None})
    text = re.sub(r"([a-z])-[ \t]*\r?\n[ \t]*([a-z])|([A-Z])-[ \t]*\r?\n[ \t]*([A-Z])", r"\1\3\2\4", text)
    text = re.sub(r"(\w)-[ \t]*\r?\n[ \t]*(?=\w)", r"\1-", text)  # "10-" / "K" -> "10-K"
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


def _form(token: str) -> str:
    return re.sub(r"^(\d+)-?", r"\1-", token.upper())


def _kind_of(line: str) -> str:
    return next((kind for kind, pattern in _KINDS if pattern.search(line)), "")


def _document_type(head: str, flat: str, title: str, file_name: str) -> tuple[str, str]:
    if marker := first_match((_FORM_LINE, _FORM_CAPS), head):
        return _form(marker[1]), f"form marker: {marker[0].strip()!r}"
    if m := _SECTION_13.search(flat):
        return ("10-K" if m[1].lower() == "annual" else "10-Q"), f"cover: {m[0]!r}"
    if m := _NAMED_FORM.search(title):
        return _form(m[1]), f"title: {title!r}"
    if kind := _kind_of(title):
        return kind, f"title: {title!r}"
    if m := _EARNINGS.search(flat[:HEADLINE_CHARS]):
        return "earnings release", f"earnings headline: {m[0]!r}"
    for line in head.splitlines()[:80]:
        if len(line.split()) <= 12 and (kind := _kind_of(line)):
            return kind, f"heading line: {line!r}"
    if m := _NAMED_FORM.search(re.split(r"[\\/]", file_name)[-1]):
        return _form(m[1]), f"file name: {file_name!r}"
    return "", ""


def _title_case(name: str) -> str:
    """AMAZON.COM, INC. -> Amazon.com, Inc.; short words (IBM, AT&T, 3M, N.V.) stay as written."""
    words = []
    for index, word in enumerate(name.split()):
        core = word.strip(",.")
        if core in _SUFFIX_CASE:
            word = word.replace(core, _SUFFIX_CASE[core])
        elif core in _CONNECTORS:
            word = word.capitalize() if index == 0 else word.lower()
        elif not (re.search(r"[\d&]", core) or (sum(c.isalpha() for c in core) <= 3 and core not in _COMMON_SHORT)):
            word = "-".join(part[:1] + part[1:].lower() for part in word.split("-"))
        words.append(word)
    return " ".join(words)


def _finish_name(raw: str, rule: str) -> tuple[str, str]:
    name = " ".join(re.sub(r"[®™©*†‡]", "", raw).split()).strip(" ,;:·-–—")
    name = name[:-1] if name.endswith(".") and not _ABBREVIATION_END.search(name) else name
    if not 2 <= len(name) <= 120:
        return "", ""
    if name == name.upper() and _title_case(name) != name:
        return _title_case(name), f"{rule} (title-cased from ALL CAPS): {raw!r}"
    return name, f"{rule}: {raw!r}"


def _registrant(head: str) -> str:
    """The line(s) above "(Exact name of registrant ...)", past IRS numbers, file numbers and labels."""
    if not (m := _REGISTRANT.search(head)):
        return ""
    before = [line.strip() for line in head[: m.start()].split("\n")][-8:]
    candidates = [i for i, line in enumerate(before) if line and not _COVER_NOISE.search(line)]
    if named := [i for i in candidates if _ENDS_WITH_SUFFIX.search(before[i].rstrip(" ,;:"))] or candidates:
        i = named[-1]
        above = before[i - 1] if i - 1 in candidates else ""
        if above and (_ONLY_SUFFIXES.fullmatch(before[i]) or re.search(r"(?:[&,-]|\band)$", above)):
            return f"{above} {before[i]}"  # "THE GOLDMAN SACHS" / "GROUP, INC."
        return before[i]
    after = [line.strip() for line in head[m.end() :].split("\n")[1:3]]  # the label printed above the name
    return next((line for line in after if _ENDS_WITH_SUFFIX.search(line)), "")


def _name_before(text: str) -> str:
    """The name-like words ending `text`: "SEATTLE--(BUSINESS WIRE)--Amazon.com, Inc." -> "Amazon.com, Inc."."""
    kept: list[str] = []
    for word in reversed(re.split(r"--|[—–:;()]", text)[-1].split()):
        if not _NAME_WORD.fullmatch(word) or (word.endswith(",") and not (kept and _ONLY_SUFFIXES.fullmatch(kept[0]))):
            break
        kept.insert(0, word)
    while kept and kept[0].upper() in _CONNECTORS:
        kept.pop(0)
    return " ".join(kept) if len(kept) <= 8 else ""


def _organization(head: str, flat: str) -> tuple[str, str]:
    if raw := _registrant(head):
        return _finish_name(raw, "registrant line")
    for m in _TICKER.finditer(flat):
        if _ENDS_WITH_SUFFIX.search(raw := _name_before(flat[max(0, m.start() - 120) : m.start()])):
            return _finish_name(raw, f"name before {m[0]!r}")
    for line in head[:_TOP_CHARS].split("\n")[:15]:
        words = line.split()
        if 0 < len(words) <= 8 and all(_NAME_WORD.fullmatch(w) for w in words) and _ENDS_WITH_SUFFIX.search(line):
            return _finish_name(line, "top line")
    return "", ""


# --- ticker ---------------------------------------------------------------------------------------------------
_SYMBOL_HEADER = rx(r"\btrading\s+symbols?\b|\bticker\s+symbols?\b|\bsymbol\(s\)")
_SYMBOL = rx(r"[A-Z]{1,5}(?:[.-][A-Z]{1,2})?", 0)  # AMD, GOOGL, BRK.B, BF-B
_SYMBOL_SECTION_END = rx(r"section\s+12\s*\(g\)|indicate\s+by\s+check|^none$", re.I)
_NOT_SYMBOLS = frozenset(  # capitals on a cover's securities line that are not a trading symbol
    "NYSE NASDAQ AMEX LLC INC CORP USD EUR GBP ADS ADR ETF PLC SA NV AG SE LP NA II III IV VI I V X N A".split()
)
_CLASS_OR_EXCHANGE = rx(r"\bclass\b|\bexchange\b")
_CLASS_WORD = rx(r"(?:class|series|par|no\.?)$", re.I)


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _symbol_in_words(line: str) -> str:
    """The first word of `line` that can only be a symbol: capitals, not an exchange or legal word, and neither
    word beside it in capitals ("NEW YORK STOCK EXCHANGE" or "COMMON STOCK" are not symbols)."""
    words = line.replace("|", " ").split()
    caps = [w.strip(",;()") for w in words]

    def capital_word(word: str) -> bool:
        return len(word) > 1 and word.isalpha() and word.isupper() and word not in _NOT_SYMBOLS

    for i, word in enumerate(caps):
        if word in _NOT_SYMBOLS or not _SYMBOL.fullmatch(word) or (i and _CLASS_WORD.match(caps[i - 1])):
            continue
        if not (i and capital_word(caps[i - 1])) and not (i + 1 < len(caps) and capital_word(caps[i + 1])):
            return word
    return ""


def _ticker(head: str, flat: str) -> tuple[str, str]:
    lines = head.split("\n")
    for index, line in enumerate(lines):
        if not (_SYMBOL_HEADER.search(line) and _CLASS_OR_EXCHANGE.search(line)):
            continue  # the header of the cover's securities table names the symbol with the class or exchange
        rows = [row for row in lines[index + 1 : index + 9] if row.strip()]
        column = next((i for i, cell in enumerate(_cells(line)) if _SYMBOL_HEADER.search(cell)), -1)
        for row in rows:
            if _SYMBOL_SECTION_END.search(row):
                break
            if column >= 0 and line.lstrip().startswith("|") and row.lstrip().startswith("|"):  # its column
                cells = _cells(row)
                value = cells[column].strip() if column < len(cells) else ""
                if value and set(value) <= set("-: "):
                    continue  # the markdown separator row
                symbol = next((s for s in re.split(r"[,;/\s]+", value) if _SYMBOL.fullmatch(s)), "")
            else:
                symbol = _symbol_in_words(row)
            if symbol and symbol not in _NOT_SYMBOLS:
                return symbol, f"trading symbol: {row!r}"
        break
    for m in _TICKER.finditer(flat):
        if _SYMBOL.fullmatch(symbol := m[0].split(":", 1)[1].strip(" )").split(",")[0].strip().rstrip(".")):
            return symbol, f"exchange and symbol: {m[0]!r}"
    return "", ""


def extract_filing_facts(text: str, *, title: str = "", file_name: str = "", body: str = "") -> FilingFacts:
    """Organisation, document type, fiscal period and period end of a filing or report (see the module docstring).
    `text`: the start of the document (its first 8,000 characters are read); `body`: the whole of it, of which the
    first 400,000 characters are read only for the quarters it names when the cover states no more than a quarter's
    end date."""
    head = _normalize(text[: 2 * _COVER_CHARS])[:_COVER_CHARS]
    flat = " ".join(head.split())
    if _PAPER.search(head):
        return FilingFacts()
    usable_title = " ".join(title.split()) if meaningful_title(title, file_name=file_name) else ""
    doc_type, type_source = _document_type(head, flat, usable_title, file_name)
    organization, organization_source = _organization(head, flat) if doc_type else ("", "")
    ticker, ticker_source = _ticker(head, flat) if doc_type else ("", "")
    found = find_period(f"{usable_title} | {flat}", doc_type, file_name=file_name, body=body)
    sources = {"document_type": type_source, "organization": organization_source, "ticker": ticker_source}
    sources |= {"fiscal_period": found.source, "period_end": found.end_source}
    kept = {key: value for key, value in sources.items() if value}
    return FilingFacts(organization, doc_type, found.label, found.end, kept, ticker=ticker)
