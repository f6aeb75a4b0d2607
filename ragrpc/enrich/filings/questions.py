"""Fiscal periods a question names, in the form the context headers of chunks carry them.

A chunk of a filing is indexed with its document's facts in its context header (the header terms
of `ragrpc.enrich.filings`): a fiscal year as "FY2017", a quarter as "2018-Q2" (the forms
`ragrpc.enrich.filings.facts` gives). Questions name periods in many other ways ("FY17", "fiscal
2017", "Q2 of FY23", "2Q18", "the second quarter of fiscal 2018"), whose tokens do not match the
header's: `period_terms` returns the header forms of the periods a question names, which the filings
enricher's query analysis gives the BM25 query to add to the question's own words (the dense query
stays the question as asked).

Pure and deterministic. Two-digit years are 20yy (filings of the 1900s do not write FY99 in questions
asked of this service often enough to be worth the ambiguity: "FY99" gives "FY1999" only for 70-99).
"""

from __future__ import annotations

import re

_YY = r"(?P<y>(?:19|20)\d\d|\d\d)(?![\d])"
_QUARTER_WORDS = {"first": 1, "1st": 1, "second": 2, "2nd": 2, "third": 3, "3rd": 3, "fourth": 4, "4th": 4}

_FISCAL_YEAR = (
    re.compile(rf"\bFY\s?'?{_YY}", re.I),  # FY2017, FY 2017, FY17, FY'17
    re.compile(rf"\bfiscal\s+(?:year\s+)?'?{_YY}", re.I),  # fiscal 2017, fiscal year 2017, fiscal '17
)
_QUARTER = (
    # Q2 2018, Q2 of FY23, Q2 FY2018, Q2'18, Q2 of fiscal 2018
    re.compile(rf"\bQ(?P<q>[1-4])\s*(?:of\s+)?(?:FY\s?|fiscal\s+(?:year\s+)?)?'?{_YY}", re.I),
    re.compile(rf"\b(?P<q>[1-4])Q\s?'?{_YY}", re.I),  # 2Q18, 2Q 2018
    re.compile(rf"\bFY\s?'?{_YY}\s*Q(?P<q>[1-4])\b", re.I),  # FY18 Q2
    # the second quarter of 2018, third fiscal quarter of fiscal 2019, fourth quarter 2017
    re.compile(
        r"\b(?P<qw>first|1st|second|2nd|third|3rd|fourth|4th)\s+(?:fiscal\s+)?quarter\s+(?:of\s+)?"
        rf"(?:fiscal\s+)?(?:year\s+)?(?:FY\s?)?'?{_YY}",
        re.I,
    ),
)


def _year(text: str) -> int | None:
    year = int(text)
    if len(text) == 2:
        year += 1900 if year >= 70 else 2000
    return year if 1970 <= year <= 2099 else None


def period_terms(question: str) -> list[str]:
    """The header forms ("FY2017", "2018-Q2") of the periods `question` names that the question does
    not already write that way, in order of appearance, each once."""
    found: list[tuple[int, str]] = []
    quarter_spans: list[tuple[int, int]] = []
    for pattern in _QUARTER:
        for match in pattern.finditer(question):
            year = _year(match.group("y"))
            quarter = int(match.group("q")) if match.groupdict().get("q") else _QUARTER_WORDS[match["qw"].lower()]
            if year is not None:
                found.append((match.start(), f"{year}-Q{quarter}"))
                quarter_spans.append(match.span())
    for pattern in _FISCAL_YEAR:
        for match in pattern.finditer(question):
            if any(start <= match.start() < end for start, end in quarter_spans):
                continue  # the year of a named quarter ("Q2 of FY23") is that quarter's, not a year asked for
            year = _year(match.group("y"))
            if year is not None:
                found.append((match.start(), f"FY{year}"))
    words = set(re.findall(r"[^\W_]+", question.casefold()))
    terms: list[str] = []
    for _, term in sorted(found):
        # already in the question's words: "FY2017" as "fy2017", "2018-Q2" as "q2" and "2018" ("Q2 2018")
        said = {term.casefold()} <= words or set(term.casefold().split("-")) <= words
        if term not in terms and not said:
            terms.append(term)
    return terms
