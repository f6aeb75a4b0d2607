"""extract_filing_facts' ticker: the trading symbol on a filing's cover (its securities table, as lines of text
or as a table block) or in a release's "(NASDAQ: PEP)"."""

from __future__ import annotations

import pytest

from ragrpc.enrich.filings.facts import extract_filing_facts

_COVER_TOP = """UNITED STATES
SECURITIES AND EXCHANGE COMMISSION
FORM 10-K
For the fiscal year ended December 31, 2022
ADVANCED MICRO DEVICES, INC.
(Exact name of registrant as specified in its charter)
Securities registered pursuant to Section 12(b) of the Act:
"""


@pytest.mark.parametrize(
    ("securities", "ticker"),
    [
        (  # the table as lines of text, the symbol between the class and the exchange
            "Title of each class Trading Symbol Name of each exchange on which registered\n"
            "Common Stock per share $0.01 par value AMD The NASDAQ Global Select Market\n",
            "AMD",
        ),
        (  # notes listed after the common stock carry symbols with digits
            "Title of each class Trading Symbol(s) Name of each exchange on which registered\n"
            "0.650% Notes Due May 2024 JNJ24C New York Stock Exchange\n"
            "Common Stock, Par Value $1.00 JNJ New York Stock Exchange\n",
            "JNJ",
        ),
        (  # "Class A" is not a symbol; the exchange in capitals beside the symbol is left out
            "Title of each class Trading Symbol(s) Name of each exchange on which registered\n"
            "Class A Common Stock, $0.001 par value GOOGL NASDAQ\n",
            "GOOGL",
        ),
        (  # the class title wraps onto a second line
            "Title of each class Trading Symbol(s) Name of each exchange on which registered\n"
            "Common Stock, par value $0.01\nper share AMZN Nasdaq Global Select Market\n",
            "AMZN",
        ),
        ("Title of each class Trading Symbols Exchange\nClass B Common Stock BRK.B New York Stock Exchange\n", "BRK.B"),
        (  # the header split over two lines by the PDF's layout
            "Trading\nTitle of each class Symbol(s) Name of each exchange on which registered\n"
            "Common Stock, $.01 par value BBY New York Stock Exchange\n",
            "BBY",
        ),
        (  # a table block: the symbol column
            "| Title of each class | Trading Symbol(s) | Name of each exchange on which registered |\n"
            "| --- | --- | --- |\n| 1.500% Notes due 2026 | MMM26 | New York Stock Exchange |\n"
            "| Common Stock, par value $.01 per share | MMM | New York Stock Exchange |\n",
            "MMM",
        ),
        (  # all capitals: a symbol can't be told from the words around it, so none
            "TITLE OF EACH CLASS TRADING SYMBOL NAME OF EACH EXCHANGE ON WHICH REGISTERED\n"
            "COMMON STOCK, $0.01 PAR VALUE AMD THE NASDAQ GLOBAL SELECT MARKET\n",
            "",
        ),
        (  # covers before 2019 have no symbol column
            "Title of each class Name of each exchange on which registered\n"
            "Common Stock, Par Value $.01 Per Share New York Stock Exchange, Inc.\n",
            "",
        ),
        ("Title of each class Trading Symbol(s) Exchange\nNone\nCommon Stock XYZ NYSE\n", ""),
    ],
)
def test_ticker_from_the_cover_securities_table(securities: str, ticker: str) -> None:
    facts = extract_filing_facts(_COVER_TOP + securities)
    assert facts.ticker == ticker
    assert ("ticker" in facts.sources) == bool(ticker)
    assert facts.organization == "Advanced Micro Devices, Inc." and facts.fiscal_period == "FY2022"


def test_ticker_of_an_earnings_release_and_none_without_a_document_type() -> None:
    release = (
        "PepsiCo Reports Third Quarter 2022 Results\n"
        "PURCHASE, N.Y., Oct. 12, 2022 -- PepsiCo, Inc. (NASDAQ: PEP) today reported results for the quarter.\n"
    )
    facts = extract_filing_facts(release)
    assert (facts.document_type, facts.ticker, facts.organization) == ("earnings release", "PEP", "PepsiCo, Inc.")
    # a page that is no filing or report quotes a symbol: no facts at all
    assert extract_filing_facts("Shares of Acme Corp. (NYSE: ACME) rose 3% on Monday.\n").ticker == ""


def test_the_symbol_is_looked_for_in_the_8_lines_after_the_table_header() -> None:
    header = "Title of each class Trading Symbol(s) Name of each exchange on which registered\n"
    notes = "".join(f"{n}.000% Notes due 20{30 + n} ACME{30 + n} New York Stock Exchange\n" for n in range(8))
    within = extract_filing_facts(_COVER_TOP + header + notes[: notes.index("\n7.")] + "\nCommon Stock ACME NYSE\n")
    beyond = extract_filing_facts(_COVER_TOP + header + notes + "Common Stock ACME NYSE\n")
    assert (within.ticker, beyond.ticker) == ("ACME", "")
