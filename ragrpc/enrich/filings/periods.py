"""The fiscal period of a filing or report and its end date (two of the facts of ragrpc.enrich.filings.facts).

Pure and deterministic. Each found value comes with its source: the rule and the text that gave it.

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
from dataclasses import dataclass
from datetime import date, timedelta

from ragrpc.enrich.titles import DATE
from ragrpc.enrich.titles import MONTH as _MONTH

HEADLINE_CHARS = 2_000  # where a document's headline stands: its first characters
BODY_CHARS = 400_000  # what is read of a document for the quarters it names, when its cover states only a quarter's end


def rx(pattern: str, flags: int = re.A | re.I) -> re.Pattern[str]:  # ASCII folding: no Kelvin sign for "k"
    return re.compile(pattern, flags)


def first_match(patterns: tuple[re.Pattern[str], ...], text: str) -> re.Match[str] | None:
    """The earliest match in `text` of any of `patterns`."""
    return min((m for p in patterns if (m := p.search(text))), key=lambda m: m.start(), default=None)


_MONTHS = {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), start=1)}
_ORD = r"(?:first|second|third|fourth|1st|2nd|3rd|4th)"
_Q_NUMBER = {"first": 1, "1st": 1, "second": 2, "2nd": 2, "third": 3, "3rd": 3, "fourth": 4, "4th": 4}
_YEAR, _ENDED = r"(?:19|20)\d\d", rf"(?:\s+ended:?\s+(?P<date>{DATE}))?"

_FISCAL_QUARTER = (  # the text names a fiscal quarter ("first quarter of fiscal 2019", "Q1 FY19"): it wins
    rx(
        rf"\b(?P<q>{_ORD})[\s-]+(?:fiscal\s+quarter\s+(?:of\s+)?(?:fiscal\s+)?|quarter\s+(?:of\s+)?fiscal\s+)"
        rf"(?:year\s+)?(?P<y>{_YEAR}|\d\d)\b{_ENDED}"
    ),
    rx(rf"\bfiscal\s+(?:year\s+)?(?P<y>{_YEAR}|\d\d)\s+(?P<q>{_ORD})[\s-]+quarter\b{_ENDED}"),
    rx(rf"\bQ(?P<q>[1-4])\s*F(?:Y)?\s*'?(?P<y>{_YEAR}|\d\d)\b"),
    rx(rf"\bFY\s*'?(?P<y>{_YEAR}|\d\d)\s*Q(?P<q>[1-4])\b"),
)
_STATED_QUARTER = (  # "Fourth Quarter and Full Year 2017 Results", "second quarter of 2018", "Q2 2018", "Q4'17"
    rx(
        rf"\b(?P<q>{_ORD})[\s-]+quarter(?:\s+(?:and|&)\s+(?:full|fiscal)[\s-]+year)?\s+(?:of\s+)?(?:fiscal\s+)?"
        rf"(?:year\s+)?(?P<y>{_YEAR})\b{_ENDED}"
    ),
    rx(rf"\bQ(?P<q>[1-4])\s*(?:(?:and|&)\s+full[\s-]+year\s+)?(?P<y>{_YEAR}|'\d\d)\b"),
)
_ORDINAL_QUARTER_ENDED = rx(rf"\b(?P<q>{_ORD})[\s-]+(?:fiscal\s+)?quarter\s+ended:?\s+(?P<date>{DATE})")
_HEADLINE_QUARTER = rx(rf"\b(?P<q>{_ORD})[\s-]+quarter\b")  # "Microsoft ... Fuels Third Quarter Results"
_QUARTER_ENDED = rx(rf"\b(?:quarterly\s+period|quarter|three\s+months)\s+ended:?\s+(?P<date>{DATE})")
_YEAR_ENDED = rx(rf"\b(?:fiscal\s+)?year\s+ended:?\s+(?P<date>{DATE})")
_ANNUAL_TITLE = rx(rf"\b(?P<y>{_YEAR})\s+annual\s+report\b|\bannual\s+report\s+(?P<y2>{_YEAR})\b(?![/-]\d)")
_STATEMENT_PERIOD = rx(  # "Statement Period: January 1, 2018 to January 31, 2018", "May 1, 2018 through May 31, 2018"
    r"\b(?:statement\s+(?:period|date)|period\s+(?:covered|ending)|closing\s+date)\b.{0,60}"
    rf"|{DATE}\s*(?:-|to|through|thru)\s*{DATE}"
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


def _to_date(text: str) -> date | None:
    """A date matched by DATE: ISO, or a month name with the day before the year (either order)."""
    month = re.search(_MONTH, text, re.A | re.I)
    numbers = [int(n) for n in re.findall(r"\d+", text, re.A)]
    try:
        found = date.fromisoformat(text) if not month else date(numbers[-1], _MONTHS[month[0][:3].lower()], numbers[-2])
    except (IndexError, KeyError, ValueError):
        return None
    return found if 1900 <= found.year <= 2100 else None  # far from date.min/max: the rules add and subtract days


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
    ends = [end for found in re.findall(DATE, m[0], re.A | re.I) if (end := _to_date(found))] if m else []
    return ("", ends[-1].isoformat(), f"statement period: {m[0]!r}") if m and ends else None


_NUMBERED_QUARTER = rx(r"q[1-4]")
_FOUR_DIGITS = rx(r"\d{4}")


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
    headline = _HEADLINE_QUARTER.search(text[:HEADLINE_CHARS]) if ended and quarter else None
    fiscal_patterns = (
        ((_FISCAL_QUARTER[0], _FISCAL_QUARTER[1]) if fiscal and quarter else ())
        + ((_FISCAL_QUARTER[2],) if numbered else ())
        + ((_FISCAL_QUARTER[3],) if fy else ())
    )
    stated_patterns = ((_STATED_QUARTER[0],) if quarter else ()) + ((_STATED_QUARTER[1],) if numbered else ())
    statement = any(word in lower for word in ("statement", "period", "closing")) or _FOUR_DIGITS.search(text)
    return {
        "fiscal quarter": _quarter(first_match(fiscal_patterns, text), "fiscal quarter stated"),
        "stated quarter": _quarter(first_match(stated_patterns, text), "quarter stated"),
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
    rx(r"(?<![a-z0-9])(?P<y>(?:19|20)\d\d)[-_ ]?q(?P<q>[1-4])(?![a-z0-9])"),
    rx(rf"(?<![a-z0-9])q(?P<q>[1-4])[-_ ]?(?:fy[-_ ]?)?{_YEAR_OR_YY}(?![a-z0-9])"),
    rx(rf"(?<![a-z0-9])(?P<q>[1-4])q[-_ ]?{_YEAR_OR_YY}(?![a-z0-9])"),
    rx(rf"(?<![a-z0-9])fy[-_ ]?{_YEAR_OR_YY}[-_ ]?q(?P<q>[1-4])(?![a-z0-9])"),
)
_FILE_FISCAL_YEAR = rx(rf"(?<![a-z0-9])fy[-_ ]?{_YEAR_OR_YY}(?![a-z0-9])")
_FILE_YEAR = rx(r"(?<![0-9])(?:19|20)\d\d(?![0-9])")
_ANNUAL_TYPES = frozenset({"10-K", "20-F", "annual report"})


def _file_name_period(file_name: str, doc_type: str) -> str:
    """The fiscal period a file name states ("BESTBUY_2024Q2_10Q.pdf" -> "2024-Q2", "acme_FY2019.pdf" ->
    "FY2019"; for an annual report, its one year: "3M_2018_10K.pdf" -> "FY2018"), or "". Used when the text
    states none, or only a quarter's end date (whose calendar-quarter naming is a guess at a fiscal calendar
    the file's namer knew)."""
    stem = re.split(r"[\\/]", file_name)[-1].rsplit(".", 1)[0]
    if not stem:
        return ""
    if m := first_match(_FILE_QUARTERS, stem):
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
    body = body[:BODY_CHARS]  # sliced here: only documents whose cover gives a bare quarter end pay for the copy
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


@dataclass(frozen=True)
class Period:
    label: str = ""  # "FY2017" or "2018-Q2", or ""
    end: str = ""  # ISO date, or ""
    source: str = ""  # "rule: 'text'" of the label
    end_source: str = ""  # of the end date


def find_period(text: str, doc_type: str, *, file_name: str = "", body: str = "") -> Period:
    """The period of a document of `doc_type` ("" when not known) from `text` (its title and cover, flattened),
    then, for a document of a known type whose cover states no more than a quarter's end date or nothing, from the
    quarters its `body` names and from its file name (see the module docstring)."""
    (period, end, source), end_source = _period(text, doc_type)
    if doc_type and source.startswith(_CALENDAR_SOURCE) and (named_in_text := _body_quarter(body, end)):
        period, source = named_in_text
    if doc_type and (not period or source.startswith(_CALENDAR_SOURCE)):
        if (named := _file_name_period(file_name, doc_type)) and _fits_end(named, end):
            period, source = named, f"file name: {file_name!r}"
    return Period(period, end, source if period else "", end_source if end else "")
