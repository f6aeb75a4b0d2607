"""extract_filing_facts on the phrases that name a filing's period and type: stated quarters,
quarter and fiscal-year end dates (calendar naming for shifted fiscal years), forms and document
kinds, dates broken by PDF extraction; for a bare quarter end, the quarter the filing's text names
most, or its file name's (ragrpc.enrich.filings.periods)."""

from __future__ import annotations

import pytest

from ragrpc.enrich.filings.facts import extract_filing_facts
from ragrpc.enrich.filings.periods import BODY_CHARS


@pytest.mark.parametrize(
    ("phrase", "period"),
    [
        ("Microsoft reports results for the first quarter of fiscal 2019", "2019-Q1"),
        ("Q1 FY19 earnings", "2019-Q1"),
        ("FY2019 Q3 results", "2019-Q3"),
        ("Cisco Reports fiscal 2019 first quarter results", "2019-Q1"),
        ("Intel reports second-quarter 2018 results", "2018-Q2"),
        ("Walmart reports Q4'18 results", "2018-Q4"),
        ("Company reports results for its second quarter ended July 1, 2018", "2018-Q2"),
        ("Company reports results for its first quarter ended April 1, 2018", "2018-Q1"),
        ("Walmart reports results for its fourth quarter ended January 31, 2018", "2018-Q4"),
        ("Results for its fourth quarter ended January 1, 2017", "2016-Q4"),
    ],
)
def test_stated_quarters(phrase: str, period: str) -> None:
    assert extract_filing_facts(phrase).fiscal_period == period


@pytest.mark.parametrize(
    ("ended", "period", "end"),
    [
        ("March 31, 2018", "2018-Q1", "2018-03-31"),
        ("JUNE 30, 2018", "2018-Q2", "2018-06-30"),
        ("Sep. 29, 2018", "2018-Q3", "2018-09-29"),
        ("December 30, 2017", "2017-Q4", "2017-12-30"),  # Apple's fiscal Q1 2018: calendar naming
        ("April 1, 2018", "2018-Q1", "2018-04-01"),  # a 13-week quarter that ends a day late
        ("January 31, 2018", "2017-Q4", "2018-01-31"),  # November to January is mostly calendar Q4
        ("30 June 2018", "2018-Q2", "2018-06-30"),
        ("2018-06-30", "2018-Q2", "2018-06-30"),
        ("February 30, 2018", "", ""),  # no such date
    ],
)
def test_quarterly_period_dates(ended: str, period: str, end: str) -> None:
    facts = extract_filing_facts(f"FORM 10-Q\nFor the quarterly period ended {ended}\n")
    assert (facts.fiscal_period, facts.period_end) == (period, end)


@pytest.mark.parametrize(
    ("ended", "period"),
    [
        ("Dec. 31, 2017", "FY2017"),
        ("January 1, 2017", "FY2016"),
        ("January 31, 2018", "FY2018"),
        ("2017-12-31", "FY2017"),
    ],
)
def test_fiscal_year_dates(ended: str, period: str) -> None:
    assert extract_filing_facts(f"FORM 10-K\nFor the fiscal year ended {ended}").fiscal_period == period


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("UNITED STATES SECURITIES AND EXCHANGE COMMISSION\nFORM 10-K/A\n(Amendment No. 1)", "10-K"),
        ("Washington, D.C. 20549 FORM 10-Q (Mark One) ☒ QUARTERLY REPORT", "10-Q"),
        ("SECURITIES AND EXCHANGE COMMISSION\nForm 8-K\nCURRENT REPORT", "8-K"),
        ("FORM 10-\nK\nANNUAL REPORT", "10-K"),  # the form number broken over two lines
        ("Dear shareholders,\nplease read our Annual Report on Form 10-K and our Form 10-Q filings.", ""),
        ("Quarterly Report\nfor the three months ended 30 June 2018", "quarterly report"),
        ("PRESS RELEASE\nAcme Corp. Reports Record Second-Quarter Revenue\n", "earnings release"),
        ("Invoice #2018-0042\nDate: 2018-03-05\nTotal due: $1,200.00", "invoice"),
        ("We thank the reviewers. The invoice was paid late, says the annual report of the committee.", ""),
    ],
)
def test_document_types(text: str, kind: str) -> None:
    assert extract_filing_facts(text).document_type == kind


def test_hyphenation_and_spacing_inside_dates() -> None:
    facts = extract_filing_facts("FORM 10-K\nFor the fiscal year ended Decem-\nber  31 ,\n2017\n")
    assert (facts.fiscal_period, facts.period_end) == ("FY2017", "2017-12-31")


_BEST_BUY_10Q = """FORM 10-Q
☒ QUARTERLY REPORT PURSUANT TO SECTION 13 OR 15(d) OF THE SECURITIES EXCHANGE ACT OF 1934
For the quarterly period ended July 29, 2023
BEST BUY CO., INC.
(Exact name of registrant as specified in its charter)
"""


@pytest.mark.parametrize(
    ("file_name", "period", "source"),
    [
        # a bare quarter end is named by calendar quarter, unless the file name states a quarter that can end then
        ("bby_10q.pdf", "2023-Q2", "calendar quarter"),
        ("BESTBUY_2024Q2_10Q.pdf", "2024-Q2", "file name"),  # Best Buy's fiscal 2024 ends in February 2024
        ("bby-q2fy24.pdf", "2024-Q2", "file name"),
        ("uploads/BBY 2Q24.pdf", "2024-Q2", "file name"),
        ("bby_FY24-Q2.pdf", "2024-Q2", "file name"),
        ("BESTBUY_2021Q2_10Q.pdf", "2023-Q2", "calendar quarter"),  # a quarter that cannot end in July 2023
        ("bby_2024q22.pdf", "2023-Q2", "calendar quarter"),  # no quarter: digits run on
    ],
)
def test_a_file_name_s_quarter_names_a_bare_quarter_end(file_name: str, period: str, source: str) -> None:
    facts = extract_filing_facts(_BEST_BUY_10Q, file_name=file_name)
    assert (facts.fiscal_period, facts.period_end) == (period, "2023-07-29")
    assert facts.sources["fiscal_period"].startswith(source)


def test_a_file_name_s_period_when_the_text_states_none() -> None:
    cover = "FORM 10-K\nACME INC.\n(Exact name of registrant as specified in its charter)\n"
    assert extract_filing_facts(cover, file_name="3M_2018_10K.pdf").fiscal_period == "FY2018"
    assert extract_filing_facts(cover, file_name="acme_FY19.pdf").fiscal_period == "FY2019"
    assert extract_filing_facts(cover, file_name="acme_2018_2019.pdf").fiscal_period == ""  # which year?
    assert extract_filing_facts(cover, file_name="amzn-20171231x10k.pdf").fiscal_period == ""
    # the text's own period wins over the file name's
    stated = cover + "For the fiscal year ended December 31, 2017\n"
    assert extract_filing_facts(stated, file_name="3M_2018_10K.pdf").fiscal_period == "FY2017"
    # an 8-K's date in its name is no fiscal period; a document of no known type takes nothing from its name
    current = "FORM 8-K\nACME INC.\n(Exact name of registrant as specified in its charter)\n"
    assert extract_filing_facts(current, file_name="PEPSICO_2023_8K_dated-2023-05-30.pdf").fiscal_period == ""
    assert extract_filing_facts("Notes on ducks.", file_name="ducks_2024Q2.txt").fiscal_period == ""


def test_a_bare_quarter_end_takes_the_quarter_the_filing_s_own_text_names_most() -> None:
    body = _BEST_BUY_10Q + (
        "Revenue in the second quarter of fiscal 2024 fell 7.8% from the second quarter of fiscal 2023. " * 3
        + "In the first quarter of fiscal 2024 we closed 6 stores. Q2 FY24 comparable sales fell 6.2%.\n"
    )
    facts = extract_filing_facts(_BEST_BUY_10Q, file_name="bby_10q.pdf", body=body)
    assert (facts.fiscal_period, facts.period_end) == ("2024-Q2", "2023-07-29")
    assert facts.sources["fiscal_period"].startswith("quarter the text names (4 times)")
    # the text's own words win over the file name's
    assert extract_filing_facts(_BEST_BUY_10Q, file_name="BESTBUY_2023Q2.pdf", body=body).fiscal_period == "2024-Q2"
    # Apple's "second quarter of 2023" ended April 1, 2023: the calendar would say Q1
    apple = "FORM 10-Q\nFor the quarterly period ended April 1, 2023\nApple Inc.\n"
    apple += "(Exact name of registrant as specified in its charter)\n"
    named = apple + "Net sales in the second quarter of 2023 ... the second quarter of 2022 ... Q2 2023 gross margin."
    assert extract_filing_facts(apple, body=named).fiscal_period == "2023-Q2"


@pytest.mark.parametrize(
    "text",
    [
        "Sales in the second quarter of fiscal 2024 rose.",  # named once: not enough
        "the second quarter of fiscal 2024 and the first quarter of fiscal 2024, twice: "
        "the second quarter of fiscal 2024 and the first quarter of fiscal 2024",  # a tie
        "the second quarter of fiscal 2023, the second quarter of fiscal 2023",  # last year's: cannot end on the date
        "",
    ],
)
def test_without_a_clear_quarter_in_the_text_a_bare_end_keeps_the_calendar_quarter(text: str) -> None:
    facts = extract_filing_facts(_BEST_BUY_10Q, file_name="bby_10q.pdf", body=_BEST_BUY_10Q + text)
    assert facts.fiscal_period == "2023-Q2"
    assert facts.sources["fiscal_period"].startswith("calendar quarter")


def test_only_the_first_400_000_characters_are_read_for_the_quarters_a_filing_names() -> None:
    named = "the second quarter of fiscal 2024 and the second quarter of fiscal 2024"  # ends at the limit, or 1 past
    filler = "x" * (BODY_CHARS - len(_BEST_BUY_10Q) - len(named))
    within = extract_filing_facts(_BEST_BUY_10Q, body=_BEST_BUY_10Q + filler + named)
    beyond = extract_filing_facts(_BEST_BUY_10Q, body=_BEST_BUY_10Q + filler + "y" + named)
    assert (within.fiscal_period, beyond.fiscal_period) == ("2024-Q2", "2023-Q2")
