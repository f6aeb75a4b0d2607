"""The facts users filter filings and reports by: organisation, document type, fiscal period, period end.

Pure and deterministic: reads the text of a document's first pages (and its title, when that is a real title,
see `meaningful_title`) and returns `FilingFacts`, whose `sources` say which rule and which text gave each value.
A fact that no rule finds is "", never a guess from body text. Only the first 8,000 characters are read, and
nothing from text that looks like a paper (an Abstract or Keywords line, arXiv, a DOI): papers quote filings.

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
- fiscal_period: "FY<year>", the year of the fiscal year's end less 7 days (a 52/53-week year ending January 1,
  2017 is FY2016), or "<year>-Q<n>". A quarter the text states ("first quarter of fiscal 2019", "Q1 FY19", "fourth
  quarter and full year 2017 results") is used as stated; "<n>th quarter ended <date>" (or a headline's "Third
  Quarter Results" with "quarter ended <date>") belongs to the fiscal year ending (4 - n) quarters after the date.
  A bare "quarterly period ended <date>" gets CALENDAR-quarter naming: the calendar quarter holding the middle of
  the three months ending that date (April 1 -> Q1, December 30 -> Q4), whatever the company's fiscal calendar,
  unless the document's text names a quarter that ends on that date for some fiscal calendar, at least twice and
  more often than any other ("second quarter of fiscal 2024", read from `body`, beyond the cover), or else the
  file name states the quarter ("BESTBUY_2024Q2_10Q.pdf", "bby-q2fy24.pdf", "3Q24") and it can end on that date:
  the company and the file's namer knew the fiscal calendar. A text that states no period takes the file name's
  quarter, "FY<year>", or for an annual report (10-K, 20-F) its one year ("3M_2018_10K.pdf" -> FY2018).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta

DOCUMENT_TYPES = frozenset(
    {"10-K", "10-Q", "8-K", "20-F", "annual report", "quarterly report", "earnings release", "proxy statement"}
    | {"prospectus", "bank statement", "invoice"}
)
_COVER_CHARS, _HEADLINE_CHARS, _TOP_CHARS = 8_000, 2_000, 1_500


@dataclass(frozen=True)
class FilingFacts:
    organization: str = ""
    document_type: str = ""  # one of DOCUMENT_TYPES, or ""
    fiscal_period: str = ""  # "FY2017" or "2018-Q2", or ""
    period_end: str = ""  # ISO date, or ""
    sources: dict[str, str] = field(default_factory=dict, hash=False)  # field name -> "rule: 'text'"
    ticker: str = ""  # trading symbol, e.g. "AMD", or ""


def _rx(pattern: str, flags: int = re.A | re.I) -> re.Pattern[str]:  # ASCII folding: no Kelvin sign for "k"
    return re.compile(pattern, flags)


_MONTHS = {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), start=1)}
_MONTH = (  # "Dec.", "DECEMBER", "Sept."
    r"\b(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?"
    r"|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_DATE = (
    rf"(?:{_MONTH}\.?\s*\d{{1,2}}\s*,?\s*\d{{4}}|\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTH}\.?,?\s+\d{{4}}|\d{{4}}-\d\d-\d\d)"
)
_ORD = r"(?:first|second|third|fourth|1st|2nd|3rd|4th)"
_Q_NUMBER = {"first": 1, "1st": 1, "second": 2, "2nd": 2, "third": 3, "3rd": 3, "fourth": 4, "4th": 4}
_YEAR, _ENDED = r"(?:19|20)\d\d", rf"(?:\s+ended:?\s+(?P<date>{_DATE}))?"

# --- document type -------------------------------------------------------------------------------------------
_FORM = r"(10-?K|10-?Q|8-?K|20-?F)(?:/A)?"
_FORM_LINE = _rx(rf"^[ \t]*form[ \t]*{_FORM}[ \t]*$", re.I | re.M)  # "Form 10-Q" alone on its line
_FORM_CAPS = _rx(rf"\bFORM\s*{_FORM}\b", 0)  # "FORM 10-K" in capitals, anywhere near the top
_SECTION_13 = _rx(r"(?<![☐□¨] )(?<![☐□¨])\b(ANNUAL|QUARTERLY)\s+REPORT\s+PURSUANT\s+TO\s+SECTION\s+13")
_NAMED_FORM = _rx(r"(?:(?<![a-z0-9])|(?<=\dx))(?:form[-_\s]*)?(10-?k|10-?q|8-?k|20-?f)(?![a-z0-9])")  # title, file
_EARNINGS = _rx(  # "Apple Reports Fourth Quarter Results", "announced financial results for the quarter ended"
    r"\b(?:report|announce|post|deliver|release)(?:s|d|ed)?\b[^.]{0,80}?\b(?:quarter(?:ly)?|q[1-4]|full[- ]year"
    r"|fiscal[- ]year|year[- ]end)\b[^.]{0,60}?\b(?:results|earnings|sales|revenues?)\b"
    r"|\bresults\s+for\s+the\s+(?:\w+\s+){0,2}(?:quarter|three\s+months)\b"
)
_KINDS = (  # a short line or the title naming the kind of document; the first kind found in a line wins
    (
        "earnings release",
        _rx(
            r"\bearnings\s+(?:press\s+)?release\b|\b(?:q[1-4]|first|second|third|fourth|quarter"
            r"(?:ly)?|full[- ]year)\b.*\b(?:results|earnings)\b"
        ),
    ),
    ("quarterly report", _rx(r"\bquarterly\s+report\b")),
    ("proxy statement", _rx(r"\bproxy\s+statement\b|\bschedule\s+14a\b")),
    ("annual report", _rx(r"\bannual\s+report\b(?!\s+on\s+form)")),
    ("prospectus", _rx(r"\bprospectus\b|\brule\s+424\s*\(b\)")),
    ("bank statement", _rx(r"\bstatement\s+(?:of\s+account|period)\b|\b(?:account|bank)\s+statement\b")),
    ("invoice", _rx(r"\binvoice\b")),
)
_PAPER = _rx(r"^\s*abstract\b|\barxiv\b|\bdoi:?\s*10\.\d|^\s*keywords?\s*:", re.A | re.I | re.M)

# --- organisation --------------------------------------------------------------------------------------------
_SUFFIX = (  # legal suffixes that end a company name
    r"(?:Inc|Incorporated|Corp(?:oration)?|Co(?:mpany)?|Ltd|Limited|plc|N\.\s?V|N\.\s?A|S\.\s?A|AG|SE|GmbH|LLC|L\.L\.C"
    r"|LLP|L\.\s?P|LP|Group|Holdings|Bancorp)\.?"
)
_ENDS_WITH_SUFFIX = _rx(rf"(?:^|[\s,]){_SUFFIX}$", re.I)
_ONLY_SUFFIXES = _rx(rf"(?:[\s,]*{_SUFFIX})+", re.I)  # "GROUP, INC." continues the line above
_ABBREVIATION_END = _rx(r"(?:^|[\s,.])(?:Inc|Corp|Co|Ltd|Bros|Cos|[VAPCB])\.$", re.I)  # keeps "Inc.", "N.V."
_REGISTRANT = _rx(r"\(?\s*exact\s+name\s+of\s+(?:the\s+)?registrant", re.I)
_COVER_NOISE = _rx(  # what sits between a registrant's name and its label on real covers
    r"\b\d{2}-\d{7}\b|commission\s+file|file\s+number|transition\s+period|pursuant\s+to|exchange\s+act|jurisdiction"
    r"|(?:year|period)\s+ended|identification|incorporation|\(mark\s+one\)|^\(.*\)$|^or$|^form\s|[☐☒☑□■¨]",
    re.I,
)
_TICKER = _rx(r"\((?:NASDAQ|Nasdaq|NYSE|AMEX|TSX|LSE|OTC\w*)[^():]{0,20}:\s*[A-Z.]{1,6}(?:,\s*[A-Z.]{1,6})*\)", 0)
_NAME_WORD = _rx(r"(?:[A-Z0-9][\w.&'’-]*|[a-z]+[A-Z][\w.&'’-]*|&|and|of|the|de|du|des|la|le|y),?", 0)
_CONNECTORS = frozenset({"AND", "OF", "THE", "DE", "DU", "DES", "LA", "LE", "Y", "FOR", "&"})
_COMMON_SHORT = frozenset({"NEW", "ONE", "TWO", "OIL", "GAS", "AIR", "CAR", "BIG", "RED", "SUN", "SEA", "BAY", "TOP"})
_SUFFIX_CASE = {"INC": "Inc", "CORP": "Corp", "CO": "Co", "LTD": "Ltd", "PLC": "plc", "GMBH": "GmbH", "COS": "Cos"}

# --- periods -------------------------------------------------------------------------------------------------
_FISCAL_QUARTER = (  # the text names a fiscal quarter ("first quarter of fiscal 2019", "Q1 FY19"): it wins
    _rx(
        rf"\b(?P<q>{_ORD})[\s-]+(?:fiscal\s+quarter\s+(?:of\s+)?(?:fiscal\s+)?|quarter\s+(?:of\s+)?fiscal\s+)"
        rf"(?:year\s+)?(?P<y>{_YEAR}|\d\d)\b{_ENDED}"
    ),
    _rx(rf"\bfiscal\s+(?:year\s+)?(?P<y>{_YEAR}|\d\d)\s+(?P<q>{_ORD})[\s-]+quarter\b{_ENDED}"),
    _rx(rf"\bQ(?P<q>[1-4])\s*F(?:Y)?\s*'?(?P<y>{_YEAR}|\d\d)\b"),
    _rx(rf"\bFY\s*'?(?P<y>{_YEAR}|\d\d)\s*Q(?P<q>[1-4])\b"),
)
_STATED_QUARTER = (  # "Fourth Quarter and Full Year 2017 Results", "second quarter of 2018", "Q2 2018", "Q4'17"
    _rx(
        rf"\b(?P<q>{_ORD})[\s-]+quarter(?:\s+(?:and|&)\s+(?:full|fiscal)[\s-]+year)?\s+(?:of\s+)?(?:fiscal\s+)?"
        rf"(?:year\s+)?(?P<y>{_YEAR})\b{_ENDED}"
    ),
    _rx(rf"\bQ(?P<q>[1-4])\s*(?:(?:and|&)\s+full[\s-]+year\s+)?(?P<y>{_YEAR}|'\d\d)\b"),
)
_ORDINAL_QUARTER_ENDED = _rx(rf"\b(?P<q>{_ORD})[\s-]+(?:fiscal\s+)?quarter\s+ended:?\s+(?P<date>{_DATE})")
_HEADLINE_QUARTER = _rx(rf"\b(?P<q>{_ORD})[\s-]+quarter\b")  # "Microsoft ... Fuels Third Quarter Results"
_QUARTER_ENDED = _rx(rf"\b(?:quarterly\s+period|quarter|three\s+months)\s+ended:?\s+(?P<date>{_DATE})")
_YEAR_ENDED = _rx(rf"\b(?:fiscal\s+)?year\s+ended:?\s+(?P<date>{_DATE})")
_ANNUAL_TITLE = _rx(rf"\b(?P<y>{_YEAR})\s+annual\s+report\b|\bannual\s+report\s+(?P<y2>{_YEAR})\b(?![/-]\d)")
_STATEMENT_PERIOD = _rx(  # "Statement Period: January 1, 2018 to January 31, 2018", "May 1, 2018 through May 31, 2018"
    r"\b(?:statement\s+(?:period|date)|period\s+(?:covered|ending)|closing\s+date)\b.{0,60}"
    rf"|{_DATE}\s*(?:-|to|through|thru)\s*{_DATE}"
)
_ANNUAL_RULES = ("year ended", "annual title")
_CALENDAR_SOURCE = "calendar quarter of period end"
_RULES_BY_TYPE: dict[str, tuple[str, ...]] = {  # period rules tried in order; other types: _OTHER_RULES
    **dict.fromkeys(("10-K", "20-F", "annual report", "proxy statement"), _ANNUAL_RULES),
    "10-Q": ("fiscal quarter", "quarter ended", "calendar quarter"),
    "bank statement": ("statement period",),
    "invoice": (),
}
_OTHER_RULES = (
    "fiscal quarter",
    "stated quarter",
    "quarter ended",
    "headline quarter",
    "calendar quarter",
    *_ANNUAL_RULES,
)


def _normalize(text: str) -> str:
    """Unify dashes and spaces, drop soft hyphens and marks, rejoin words hyphenated across lines."""
    text = text.translate({0x2010: "-", 0x2011: "-", 0x2012: "-", 0x2013: "-", 0xAD: None, 0xAE: None, 0x2122: None})
    text = re.sub(r"([a-z])-[ \t]*\r?\n[ \t]*([a-z])|([A-Z])-[ \t]*\r?\n[ \t]*([A-Z])", r"\1\3\2\4", text)
    text = re.sub(r"(\w)-[ \t]*\r?\n[ \t]*(?=\w)", r"\1-", text)  # "10-" / "K" -> "10-K"
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


def _to_date(text: str) -> date | None:
    """A date matched by _DATE: ISO, or a month name with the day before the year (either order)."""
    month = re.search(_MONTH, text, re.A | re.I)
    numbers = [int(n) for n in re.findall(r"\d+", text, re.A)]
    try:
        found = date.fromisoformat(text) if not month else date(numbers[-1], _MONTHS[month[0][:3].lower()], numbers[-2])
    except (IndexError, KeyError, ValueError):
        return None
    return found if 1900 <= found.year <= 2100 else None  # far from date.min/max: the rules add and subtract days


def _first(patterns: tuple[re.Pattern[str], ...], text: str) -> re.Match[str] | None:
    return min((m for p in patterns if (m := p.search(text))), key=lambda m: m.start(), default=None)


def _form(token: str) -> str:
    return re.sub(r"^(\d+)-?", r"\1-", token.upper())


def _kind_of(line: str) -> str:
    return next((kind for kind, pattern in _KINDS if pattern.search(line)), "")


def _document_type(head: str, flat: str, title: str, file_name: str) -> tuple[str, str]:
    if marker := _first((_FORM_LINE, _FORM_CAPS), head):
        return _form(marker[1]), f"form marker: {marker[0].strip()!r}"
    if m := _SECTION_13.search(flat):
        return ("10-K" if m[1].lower() == "annual" else "10-Q"), f"cover: {m[0]!r}"
    if m := _NAMED_FORM.search(title):
        return _form(m[1]), f"title: {title!r}"
    if kind := _kind_of(title):
        return kind, f"title: {title!r}"
    if m := _EARNINGS.search(flat[:_HEADLINE_CHARS]):
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
_SYMBOL_HEADER = _rx(r"\btrading\s+symbols?\b|\bticker\s+symbols?\b|\bsymbol\(s\)")
_SYMBOL = _rx(r"[A-Z]{1,5}(?:[.-][A-Z]{1,2})?", 0)  # AMD, GOOGL, BRK.B, BF-B
_SYMBOL_SECTION_END = _rx(r"section\s+12\s*\(g\)|indicate\s+by\s+check|^none$", re.I)
_NOT_SYMBOLS = frozenset(  # capitals on a cover's securities line that are not a trading symbol
    "NYSE NASDAQ AMEX LLC INC CORP USD EUR GBP ADS ADR ETF PLC SA NV AG SE LP NA II III IV VI I V X N A".split()
)
_CLASS_OR_EXCHANGE = _rx(r"\bclass\b|\bexchange\b")
_CLASS_WORD = _rx(r"(?:class|series|par|no\.?)$", re.I)


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


_Found = tuple[str, str, str]  # (fiscal_period, period_end, source)


def _fiscal_year(end: date) -> int:
    return (end - timedelta(days=7)).year  # a 52/53-week year ending January 1, 2017 is fiscal 2016


def _calendar_quarter(end: date) -> str:
    middle = end - timedelta(days=45)
    return f"{middle.year}-Q{(middle.month - 1) // 3 + 1}"


def _quarter(m: re.Match[str] | None, rule: str, ended: re.Match[str] | None = None) -> _Found | None:
    """A stated quarter; without a stated year, the fiscal year that ends (4 - n) quarters after the end date."""
    if not m:
        return None
    end = _to_date((ended or m).groupdict().get("date") or "")
    q, year = _Q_NUMBER.get(m["q"].lower()) or int(m["q"]), (m.groupdict().get("y") or "").lstrip("'")
    if year:
        label = f"{year if len(year) == 4 else 2000 + int(year)}-Q{q}"
    elif end:
        label = f"{_fiscal_year(end + timedelta(days=91 * (4 - q)))}-Q{q}"
    else:
        return None
    return label, end.isoformat() if end else "", f"{rule}: {m[0]!r}" + (f" + {ended[0]!r}" if ended else "")


def _dated(m: re.Match[str] | None, label: Callable[[date], str], rule: str) -> _Found | None:
    end = _to_date(m["date"]) if m else None
    return (label(end), end.isoformat(), f"{rule}: {m[0]!r}") if m and end else None


def _statement_end(text: str) -> _Found | None:
    m = _STATEMENT_PERIOD.search(text)
    ends = [end for found in re.findall(_DATE, m[0], re.A | re.I) if (end := _to_date(found))] if m else []
    return ("", ends[-1].isoformat(), f"statement period: {m[0]!r}") if m and ends else None


_NUMBERED_QUARTER = _rx(r"q[1-4]")
_FOUR_DIGITS = _rx(r"\d{4}")


def _period_rules(text: str) -> dict[str, _Found | None]:
    # Each pattern is searched only when the text holds the words it cannot match without (lower-cased
    # substrings, a superset of what the ASCII case-insensitive patterns match): most documents are not
    # filings, and a dozen searches of these patterns cost them a third of a millisecond each.
    lower = text.lower()
    quarter, ended_word, fiscal = "quarter" in lower, "ended" in lower, "fiscal" in lower
    numbered = _NUMBERED_QUARTER.search(lower) is not None
    fy, year = "fy" in lower, "year" in lower
    annual = _ANNUAL_TITLE.search(text) if "annual" in lower else None
    ended = _QUARTER_ENDED.search(text) if ended_word and (quarter or "three" in lower) else None
    year_ended = _YEAR_ENDED.search(text) if year and ended_word else None
    headline = _HEADLINE_QUARTER.search(text[:_HEADLINE_CHARS]) if ended and quarter else None
    fiscal_patterns = (
        ((_FISCAL_QUARTER[0], _FISCAL_QUARTER[1]) if fiscal and quarter else ())
        + ((_FISCAL_QUARTER[2],) if numbered else ())
        + ((_FISCAL_QUARTER[3],) if fy else ())
    )
    stated_patterns = ((_STATED_QUARTER[0],) if quarter else ()) + ((_STATED_QUARTER[1],) if numbered else ())
    statement = any(word in lower for word in ("statement", "period", "closing")) or _FOUR_DIGITS.search(text)
    return {
        "fiscal quarter": _quarter(_first(fiscal_patterns, text), "fiscal quarter stated"),
        "stated quarter": _quarter(_first(stated_patterns, text), "quarter stated"),
        "quarter ended": (
            _quarter(_ORDINAL_QUARTER_ENDED.search(text), "quarter ended") if quarter and ended_word else None
        ),
        "headline quarter": _quarter(headline, "headline quarter", ended),
        "calendar quarter": _dated(ended, _calendar_quarter, _CALENDAR_SOURCE),
        "year ended": _dated(year_ended, lambda end: f"FY{_fiscal_year(end)}", "fiscal year ended"),
        "annual title": (f"FY{annual['y'] or annual['y2']}", "", f"annual report: {annual[0]!r}") if annual else None,
        "statement period": _statement_end(text) if statement else None,
    }


_YEAR_OR_YY = r"(?P<y>(?:19|20)\d\d|\d\d)"
_FILE_QUARTERS = (  # in a file name: 2024Q2, 2024-Q2, Q2_2024, Q2FY24, 3Q24, FY24Q2 (letters and digits apart)
    _rx(r"(?<![a-z0-9])(?P<y>(?:19|20)\d\d)[-_ ]?q(?P<q>[1-4])(?![a-z0-9])"),
    _rx(rf"(?<![a-z0-9])q(?P<q>[1-4])[-_ ]?(?:fy[-_ ]?)?{_YEAR_OR_YY}(?![a-z0-9])"),
    _rx(rf"(?<![a-z0-9])(?P<q>[1-4])q[-_ ]?{_YEAR_OR_YY}(?![a-z0-9])"),
    _rx(rf"(?<![a-z0-9])fy[-_ ]?{_YEAR_OR_YY}[-_ ]?q(?P<q>[1-4])(?![a-z0-9])"),
)
_FILE_FISCAL_YEAR = _rx(rf"(?<![a-z0-9])fy[-_ ]?{_YEAR_OR_YY}(?![a-z0-9])")
_FILE_YEAR = _rx(r"(?<![0-9])(?:19|20)\d\d(?![0-9])")
_ANNUAL_TYPES = frozenset({"10-K", "20-F", "annual report"})


def _file_name_period(file_name: str, doc_type: str) -> str:
    """The fiscal period a file name states ("BESTBUY_2024Q2_10Q.pdf" -> "2024-Q2", "acme_FY2019.pdf" ->
    "FY2019"; for an annual report, its one year: "3M_2018_10K.pdf" -> "FY2018"), or "". Used when the text
    states none, or only a quarter's end date (whose calendar-quarter naming is a guess at a fiscal calendar
    the file's namer knew)."""
    stem = re.split(r"[\\/]", file_name)[-1].rsplit(".", 1)[0]
    if not stem:
        return ""
    if m := _first(_FILE_QUARTERS, stem):
        return f"{_year(m['y'])}-Q{m['q']}"
    if doc_type not in _ANNUAL_TYPES and doc_type != "proxy statement":
        return ""
    if m := _FILE_FISCAL_YEAR.search(stem):
        return f"FY{_year(m['y'])}"
    years = set(_FILE_YEAR.findall(stem))
    return f"FY{years.pop()}" if len(years) == 1 and doc_type in _ANNUAL_TYPES else ""


def _fits_end(period: str, end: str) -> bool:
    """Whether a quarter "2024-Q2" can end on `end` (ISO; "" fits): its fiscal year, which ends (4 - n) quarters
    after it, ends in the year it is named for or one year either side."""
    if "-Q" not in period or not end:
        return True
    year, quarter = int(period[:4]), int(period[-1])
    return abs(_fiscal_year(date.fromisoformat(end) + timedelta(days=91 * (4 - quarter))) - year) <= 1


def _ends_on(period: str, end: str) -> bool:
    """Whether quarter n of fiscal year Y ("2024-Q2") ends on `end` (ISO) for some fiscal calendar: the fiscal year
    ending (4 - n) quarters after `end` is Y. "Second quarter of fiscal 2023" in a 10-Q of the quarter ended July 29,
    2023 is last year's comparison, not this quarter (it would end in 2022)."""
    year, quarter = int(period[:4]), int(period[-1])
    return _fiscal_year(date.fromisoformat(end) + timedelta(days=91 * (4 - quarter))) == year


_BODY_QUARTERS = (*_FISCAL_QUARTER, *_STATED_QUARTER)


def _body_quarter(body: str, end: str) -> tuple[str, str] | None:
    """(label, source) of the quarter a filing's text names most often among those that can end on `end` (at least
    twice, and more often than any other), or None. A 10-Q names its own quarter again and again ("second quarter
    of fiscal 2024", "Q2 FY24"); its comparisons with last year's quarter cannot end on its date."""
    if not body or not end:
        return None
    counts: Counter[str] = Counter()
    first: dict[str, str] = {}
    seen: set[int] = set()  # "second quarter of fiscal 2024" is a fiscal and a stated quarter: counted once
    for pattern in _BODY_QUARTERS:
        for m in pattern.finditer(body):
            found = None if m.start() in seen else _quarter(m, "named")
            seen.add(m.start())
            if found and _ends_on(found[0], end):
                counts[found[0]] += 1
                first.setdefault(found[0], " ".join(m[0].split()))
    ranked = counts.most_common(2)
    if not ranked or ranked[0][1] < 2 or (len(ranked) == 2 and ranked[1][1] == ranked[0][1]):
        return None
    label, times = ranked[0]
    return label, f"quarter the text names ({times} times): {first[label]!r}"


def _year(text: str) -> int:
    return int(text) if len(text) == 4 else 2000 + int(text)


def _period(text: str, doc_type: str) -> tuple[_Found, str]:
    """(fiscal_period, period_end, source) by the rules that fit the document type, in order; the end's source."""
    rules = _period_rules(text)
    period, end, source = next(
        (found for name in _RULES_BY_TYPE.get(doc_type, _OTHER_RULES) if (found := rules[name])), ("", "", "")
    )
    if period and not end:  # "Q4 2017 results ... fourth quarter ended December 31, 2017": take the date too
        dated = next((found for found in rules.values() if found and found[0] == period and found[1]), None)
        return ((period, dated[1], source), dated[2]) if dated else ((period, "", source), "")
    return (period, end, source), source


# --- titles --------------------------------------------------------------------------------------------------
_PLACEHOLDER_TITLE = _rx(
    r"(?:untitled(?:\s+document)?|document|doc|(?:powerpoint\s+)?presentation|microsoft\s+word\s+document|slide"
    r"|new\s+document|title|no\s+title|none|null|n/?a|unknown|default|book|sheet)\s*\d*",
    re.I,
)
_OFFICE_PREFIX = _rx(r"(?:microsoft\s+)?(?:word|powerpoint|excel)\s+-\s", re.I)  # print-driver titles
_PATH_OR_FILE = _rx(r"^(?:[a-z]:[\\/]|[\\/~]|file:)|\.(?:pdf|docx?|pptx?|xlsx?|txt|md|html?|rtf|odt|csv)$")
_UUID = _rx(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}")
_HEX_HASH = _rx(r"(?:0x)?(?=[a-f]*\d)[0-9a-f]{8,}")
_TIMESTAMP = _rx(r"(?:D:)?[\d\s:/.,+'-]+(?:[TZ][\d\s:/.,+'-]*)*|" + _DATE)  # "2018-02-01T10:00:00Z", "May 1, 2018"


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


def extract_filing_facts(text: str, *, title: str = "", file_name: str = "", body: str = "") -> FilingFacts:
    """Organisation, document type, fiscal period and period end of a filing or report (see the module docstring).
    `text`: the start of the document (its first 8,000 characters are read); `body`: more of it, read only for the
    quarters it names when the cover states no more than a quarter's end date."""
    head = _normalize(text[: 2 * _COVER_CHARS])[:_COVER_CHARS]
    flat = " ".join(head.split())
    if _PAPER.search(head):
        return FilingFacts()
    usable_title = " ".join(title.split()) if meaningful_title(title, file_name=file_name) else ""
    doc_type, type_source = _document_type(head, flat, usable_title, file_name)
    organization, organization_source = _organization(head, flat) if doc_type else ("", "")
    ticker, ticker_source = _ticker(head, flat) if doc_type else ("", "")
    (period, end, period_source), end_source = _period(f"{usable_title} | {flat}", doc_type)
    if doc_type and period_source.startswith(_CALENDAR_SOURCE) and (named_in_text := _body_quarter(body, end)):
        period, period_source = named_in_text
    if doc_type and (not period or period_source.startswith(_CALENDAR_SOURCE)):
        if (named := _file_name_period(file_name, doc_type)) and _fits_end(named, end):
            period, period_source = named, f"file name: {file_name!r}"
    sources = {"document_type": type_source, "organization": organization_source, "ticker": ticker_source}
    sources |= {"fiscal_period": period_source if period else "", "period_end": end_source if end else ""}
    kept = {key: value for key, value in sources.items() if value}
    return FilingFacts(organization, doc_type, period, end, kept, ticker=ticker)
