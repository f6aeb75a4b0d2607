"""The header forms of the fiscal periods a question names (ragrpc.enrich.filings.questions), and the
filings enricher's query analysis that gives them to the BM25 query."""

from __future__ import annotations

import pytest

from ragrpc.enrich.filings import FilingsEnricher
from ragrpc.enrich.filings.questions import period_terms


@pytest.mark.parametrize(
    ("question", "terms"),
    [
        ("What is the FY17 capital expenditure of 3M?", ["FY2017"]),
        ("What is the FY 2018 operating margin?", ["FY2018"]),
        ("Revenue in FY'19 for Apple", ["FY2019"]),
        ("How did fiscal 2020 free cash flow change?", ["FY2020"]),
        ("net income for fiscal year 2016", ["FY2016"]),
        ("Does AMD have a healthy quick ratio for Q2 of FY23?", ["2023-Q2"]),
        ("Gross margin in Q3 FY2019", ["2019-Q3"]),
        ("2Q18 results of Intel", ["2018-Q2"]),
        ("FY18 Q4 revenue", ["2018-Q4"]),
        ("sales in the second quarter of fiscal 2018", ["2018-Q2"]),
        ("third fiscal quarter of 2019 backlog", ["2019-Q3"]),
        ("compare FY2021 with FY22", ["FY2022"]),  # FY2021 is already written in the header's form
        ("revenue in Q1 2018", []),  # the header's words (q1, 2018) are the question's own
        ("FY1999 results", []),
        ("FY99 results", ["FY1999"]),
        ("what is the capital of France?", []),
        ("FY201 and Q5 2018 and fiscal policy", []),
        ("", []),
    ],
)
def test_period_terms(question: str, terms: list[str]) -> None:
    assert period_terms(question) == terms


def test_each_period_once_in_order_of_appearance() -> None:
    assert period_terms("FY17 vs fiscal 2017 vs Q2 FY16 vs FY17") == ["FY2017", "2016-Q2"]
    assert period_terms("fiscal 2017, then Q2 of FY16, then FY17") == ["FY2017", "2016-Q2"]


def test_the_enrichers_analysis_gives_the_terms_and_implies_no_filter() -> None:
    analysis = FilingsEnricher().analyse("3M FY18 capex vs Q2 of FY23")
    assert analysis.sparse_terms == ("FY2018", "2023-Q2") and not analysis.filters
    assert FilingsEnricher().analyse("no period here").sparse_terms == ()
