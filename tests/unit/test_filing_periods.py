"""extract_filing_facts on the phrases that name a filing's period and type: stated quarters,
quarter and fiscal-year end dates (calendar naming for shifted fiscal years), forms and document
kinds, dates broken by PDF extraction."""

from __future__ import annotations

import pytest

from ingest_service.filing_facts import extract_filing_facts


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
