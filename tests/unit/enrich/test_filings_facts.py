"""extract_filing_facts / meaningful_title on cover pages written the way PDF extraction renders them."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from ragrpc.enrich.filings.facts import DOCUMENT_TYPES, FilingFacts, extract_filing_facts

AMAZON_10K = """UNITED STATES
SECURITIES AND EXCHANGE COMMISSION
Washington, D.C. 20549
FORM 10-K
(Mark One)
☒ ANNUAL REPORT PURSUANT TO SECTION 13 OR 15(d) OF THE SECURITIES EXCHANGE ACT OF 1934
For the fiscal year ended December 31, 2017
or
☐ TRANSITION REPORT PURSUANT TO SECTION 13 OR 15(d) OF THE SECURITIES EXCHANGE ACT OF 1934
For the transition period from to .
Commission File No. 000-22513
AMAZON.COM, INC.
(Exact name of registrant as specified in its charter)
Delaware 91-1646860
(State or other jurisdiction of
incorporation or organization)
(I.R.S. Employer
Identification No.)
410 Terry Avenue North
Seattle, Washington 98109-5210
(206) 266-1000
(Address and telephone number, including area code, of registrant’s principal executive offices)
Securities registered pursuant to Section 12(b) of the Act:
"""

# Apple's 52/53-week year; the state and IRS number are printed between the name and its label.
APPLE_10K = """UNITED STATES
SECURITIES  AND  EXCHANGE  COMMISSION
Washington, D.C.  20549
FORM 10-K
(Mark One)
x ANNUAL REPORT PURSUANT TO SECTION 13 OR 15(d) OF THE SECURITIES EXCHANGE ACT OF 1934
For the fiscal year ended September 29, 2018
or
o TRANSITION REPORT PURSUANT TO SECTION 13 OR 15(d) OF THE SECURITIES EXCHANGE ACT OF 1934
For the transition period from              to
Commission File Number: 001-36743
Apple Inc.
California 94-2404110
(Exact name of Registrant as
specified in its charter)
(State or other jurisdiction of incorporation or organization) (I.R.S. Employer Identification No.)
One Apple Park Way
Cupertino, California 95014
"""

MICROSOFT_10Q = """UNITED STATES
SECURITIES AND EXCHANGE COMMISSION
WASHINGTON, D.C. 20549
FORM 10-Q
☒ QUARTERLY REPORT PURSUANT TO SECTION 13 OR 15(d) OF THE SECURITIES EXCHANGE ACT OF 1934
For the Quarterly Period Ended March 31, 2018
OR
☐ TRANSITION REPORT PURSUANT TO SECTION 13 OR 15(d) OF THE SECURITIES EXCHANGE ACT OF 1934
For the Transition Period From                to
Commission File Number 001-37845
MICROSOFT CORPORATION
WASHINGTON 91-1144442
(STATE OF INCORPORATION) (I.R.S. ID)
(Exact name of registrant as specified in its charter)
ONE MICROSOFT WAY, REDMOND, WASHINGTON 98052-6399
"""

GOLDMAN_10Q = """UNITED STATES
SECURITIES AND EXCHANGE COMMISSION
Washington, D.C. 20549
Form 10-Q
QUARTERLY REPORT PURSUANT TO SECTION 13 OR 15(d) OF THE SECURITIES EXCHANGE ACT OF 1934
For the quarterly period ended June 30, 2018
Commission File Number: 001-14965
THE GOLDMAN SACHS
GROUP, INC.
(Exact name of registrant as specified in its charter)
Delaware 13-4019460
"""

AMAZON_8K = """UNITED STATES
SECURITIES AND EXCHANGE COMMISSION
Washington, D.C. 20549
FORM 8-K
CURRENT REPORT
Pursuant to Section 13 or 15(d) of The Securities Exchange Act of 1934
Date of Report (Date of earliest event reported): February 1, 2018
AMAZON.COM, INC.
(Exact name of registrant as specified in its charter)
Delaware 000-22513 91-1646860
ITEM 2.02. RESULTS OF OPERATIONS AND FINANCIAL CONDITION.
On February 1, 2018, Amazon.com, Inc. announced its fourth quarter 2017 financial results.
"""

AMAZON_RELEASE = """AMAZON.COM ANNOUNCES FOURTH QUARTER SALES UP 38% TO $60.5 BILLION
SEATTLE--(BUSINESS WIRE)--February 1, 2018--Amazon.com, Inc. (NASDAQ: AMZN) today announced financial
results for its fourth quarter ended December 31, 2017.
Operating cash flow increased 10% to $18.4 billion for the trailing twelve months, compared with
$16.4 billion for the trailing twelve months ended December 31, 2016. Amazon competes with Google LLC.
"""

ALPHABET_RELEASE = """Alphabet Announces Fourth Quarter and Fiscal Year 2017 Results
MOUNTAIN VIEW, Calif. – February 1, 2018 – Alphabet Inc. (NASDAQ: GOOG, GOOGL) today announced financial
results for the quarter and fiscal year ended December 31, 2017.
"""

APPLE_RELEASE = """Apple Reports First Quarter Results
All-time record revenue of $88.3 billion
CUPERTINO, California — February 1, 2018 — Apple® today announced financial results for its fiscal 2018
first quarter ended December 30, 2017. The Company posted quarterly revenue of $88.3 billion.
"""

PAPER = """Attention Is All You Need
Ashish Vaswani∗
Google Brain
avaswani@google.com
NVIDIA Corporation
Abstract
The dominant sequence transduction models are based on complex recurrent or convolutional neural networks.
We compete with Google LLC on the fourth quarter 2017 benchmark; see the annual report of the
challenge. Results for the quarter ended June 30, 2017 are in Form 10-K filings.
"""


def test_amazon_10k_cover() -> None:
    facts = extract_filing_facts(AMAZON_10K)
    assert (facts.organization, facts.document_type) == ("Amazon.com, Inc.", "10-K")
    assert (facts.fiscal_period, facts.period_end) == ("FY2017", "2017-12-31")
    assert facts.sources["organization"] == "registrant line (title-cased from ALL CAPS): 'AMAZON.COM, INC.'"
    assert facts.sources["document_type"] == "form marker: 'FORM 10-K'"
    assert "December 31, 2017" in facts.sources["fiscal_period"]


def test_apple_52_53_week_year_and_ids_between_name_and_label() -> None:
    facts = extract_filing_facts(APPLE_10K)
    assert facts == FilingFacts("Apple Inc.", "10-K", "FY2018", "2018-09-29", facts.sources)
    assert facts.sources["organization"] == "registrant line: 'Apple Inc.'"


def test_10q_uses_calendar_quarter_naming() -> None:
    facts = extract_filing_facts(MICROSOFT_10Q)
    assert (facts.organization, facts.document_type) == ("Microsoft Corporation", "10-Q")
    assert (facts.fiscal_period, facts.period_end) == ("2018-Q1", "2018-03-31")  # Microsoft calls it FY18 Q3
    assert facts.sources["fiscal_period"].startswith("calendar quarter of period end")


def test_registrant_name_on_two_lines() -> None:
    facts = extract_filing_facts(GOLDMAN_10Q)
    assert facts.organization == "The Goldman Sachs Group, Inc."
    assert (facts.document_type, facts.fiscal_period, facts.period_end) == ("10-Q", "2018-Q2", "2018-06-30")


def test_8k_stays_8k_and_takes_the_quarter_it_reports() -> None:
    facts = extract_filing_facts(AMAZON_8K)
    assert (facts.organization, facts.document_type, facts.fiscal_period) == ("Amazon.com, Inc.", "8-K", "2017-Q4")


def test_earnings_release_with_ticker() -> None:
    facts = extract_filing_facts(AMAZON_RELEASE)
    assert facts.document_type == "earnings release"
    assert facts.organization == "Amazon.com, Inc."
    assert facts.sources["organization"] == "name before '(NASDAQ: AMZN)': 'Amazon.com, Inc.'"
    assert (facts.fiscal_period, facts.period_end) == ("2017-Q4", "2017-12-31")


def test_earnings_release_quarter_and_full_year() -> None:
    facts = extract_filing_facts(ALPHABET_RELEASE)
    assert (facts.organization, facts.document_type) == ("Alphabet Inc.", "earnings release")
    assert facts.fiscal_period == "2017-Q4"


def test_stated_fiscal_quarter_wins_over_the_calendar() -> None:
    facts = extract_filing_facts(APPLE_RELEASE)
    assert facts.document_type == "earnings release"
    assert (facts.fiscal_period, facts.period_end) == ("2018-Q1", "2017-12-30")  # calendar Q4 2017
    assert facts.organization == ""  # "Apple®" has no legal suffix and no ticker: not guessed


def test_10k_mentioning_form_10q_deep_inside_stays_10k() -> None:
    body = "\n".join(["Item 7. Management's discussion; see our Quarterly Reports on FORM 10-Q."] * 40)
    facts = extract_filing_facts(AMAZON_10K + "x" * 9_000 + "\nFORM 10-Q\n" + body)
    assert facts.document_type == "10-K"
    assert facts.fiscal_period == "FY2017"


def test_10q_mentioning_annual_report_on_form_10k_stays_10q() -> None:
    text = MICROSOFT_10Q + "Refer to our Annual Report on Form 10-K for the fiscal year ended June 30, 2017.\n"
    facts = extract_filing_facts(text)
    assert (facts.document_type, facts.fiscal_period) == ("10-Q", "2018-Q1")


def test_research_paper_gets_nothing() -> None:
    assert extract_filing_facts(PAPER, title="Attention Is All You Need") == FilingFacts()
    about_filings = "Textual Analysis of 10-K Filings\nJane Doe\nAbstract\n" + AMAZON_10K
    assert extract_filing_facts(about_filings, title="Textual Analysis of 10-K Filings") == FilingFacts()


def test_text_of_unknown_kind_gets_no_organization() -> None:
    text = "Notes from the meeting\nAcme Widgets LLC\nAMAZON.COM, INC. (NASDAQ: AMZN)\nWe discussed Q2 2018.\n"
    facts = extract_filing_facts(text)
    assert (facts.document_type, facts.organization, facts.fiscal_period) == ("", "", "2018-Q2")


def test_body_sentence_is_not_an_organization() -> None:
    text = "2017 Annual Report\nWe compete with Google LLC\nand many others, such as Microsoft Corporation today.\n"
    facts = extract_filing_facts(text)
    assert (facts.document_type, facts.organization, facts.fiscal_period) == ("annual report", "", "FY2017")


def test_20f_is_not_read_as_10k() -> None:
    text = """UNITED STATES SECURITIES AND EXCHANGE COMMISSION
FORM 20-F
☐ REGISTRATION STATEMENT PURSUANT TO SECTION 12(b) OR (g) OF THE SECURITIES EXCHANGE ACT OF 1934
OR
☒ ANNUAL REPORT PURSUANT TO SECTION 13 OR 15(d) OF THE SECURITIES EXCHANGE ACT OF 1934
For the fiscal year ended March 31, 2018
Commission file number: 001-14948
TOYOTA JIDOSHA KABUSHIKI KAISHA
(Exact name of Registrant as specified in its charter)
TOYOTA MOTOR CORPORATION
(Translation of Registrant’s name into English)
"""
    facts = extract_filing_facts(text)
    assert (facts.document_type, facts.fiscal_period, facts.period_end) == ("20-F", "FY2018", "2018-03-31")
    assert facts.organization == "Toyota Jidosha Kabushiki Kaisha"


def test_section_13_phrase_without_form_line_and_merged_lines() -> None:
    text = (
        "UNITED STATES SECURITIES AND EXCHANGE COMMISSION Washington, D.C. 20549 ☒ QUARTERLY REPORT PURSU-\n"
        "ANT TO SECTION 13 OR 15(d) OF THE SECURITIES EXCHANGE ACT OF 1934 For the quarterly\nperiod ended "
        "Sept. 30 , 2018 Commission file number 1-4174 THE WALT DISNEY COMPANY (Exact name of registrant as "
        "specified in its charter)"
    )
    facts = extract_filing_facts(text)
    assert (facts.document_type, facts.fiscal_period, facts.period_end) == ("10-Q", "2018-Q3", "2018-09-30")
    assert facts.organization == ""  # the name shares a line with cover noise: not guessed from it


def test_annual_report_uk_style() -> None:
    text = "Unilever PLC\nAnnual Report and Accounts 2017\nStrategic report\nFor the year ended 31 December 2017\n"
    facts = extract_filing_facts(text)
    assert (facts.organization, facts.document_type) == ("Unilever PLC", "annual report")
    assert (facts.fiscal_period, facts.period_end) == ("FY2017", "2017-12-31")


def test_proxy_statement() -> None:
    text = "SCHEDULE 14A\nProxy Statement Pursuant to Section 14(a)\nCisco Systems, Inc.\nyear ended July 28, 2018"
    facts = extract_filing_facts(text)
    assert (facts.document_type, facts.organization, facts.fiscal_period) == (
        "proxy statement",
        "Cisco Systems, Inc.",
        "FY2018",
    )


def test_prospectus_supplement() -> None:
    text = "Filed Pursuant to Rule 424(b)(2)\nPROSPECTUS SUPPLEMENT\n(To Prospectus dated May 1, 2017)\n$1,000,000,000"
    assert extract_filing_facts(text).document_type == "prospectus"


def test_bank_statement_period_end() -> None:
    text = "First National Bank Ltd.\nSTATEMENT OF ACCOUNT\nStatement Period: January 1, 2018 to January 31, 2018\n"
    facts = extract_filing_facts(text)
    assert facts == FilingFacts("First National Bank Ltd.", "bank statement", "", "2018-01-31", facts.sources)


def test_bank_statement_date_range_and_national_association() -> None:
    text = "Chase\nJPMorgan Chase Bank, N.A.\nAccount Statement\nApril 1, 2018 through April 30, 2018\n"
    facts = extract_filing_facts(text)
    assert (facts.organization, facts.document_type, facts.period_end) == (
        "JPMorgan Chase Bank, N.A.",
        "bank statement",
        "2018-04-30",
    )
    numeric = extract_filing_facts("Bank Statement\nStatement Period: 04/01/2018 - 04/30/2018\n")
    assert (numeric.document_type, numeric.period_end) == ("bank statement", "")  # 04/01 is ambiguous: not read


def test_headline_ordinal_with_quarter_end_is_a_fiscal_quarter() -> None:
    text = (
        "Microsoft Cloud Strength Fuels Third Quarter Results\nREDMOND, Wash. — April 26, 2018 — Microsoft Corp. "
        "today announced the following results for the quarter ended March 31, 2018, as compared to the "
        "corresponding period of last fiscal year:\n"
    )
    facts = extract_filing_facts(text)
    assert (facts.document_type, facts.fiscal_period, facts.period_end) == ("earnings release", "2018-Q3", "2018-03-31")
    assert facts.organization == ""  # named only in a body sentence
    assert facts.sources["fiscal_period"] == "headline quarter: 'Third Quarter' + 'quarter ended March 31, 2018'"


def test_period_end_borrowed_from_another_rule_names_its_own_source() -> None:
    text = "Walmart Inc. (NYSE: WMT)\nEarnings Release\nFourth Quarter Fiscal 2018\nThree Months Ended January 31, 2018"
    facts = extract_filing_facts(text)
    assert (facts.organization, facts.document_type) == ("Walmart Inc.", "earnings release")
    assert (facts.fiscal_period, facts.period_end) == ("2018-Q4", "2018-01-31")
    assert facts.sources["fiscal_period"] == "fiscal quarter stated: 'Fourth Quarter Fiscal 2018'"
    assert facts.sources["period_end"].startswith("headline quarter:")


def test_invoice() -> None:
    text = "ACME WIDGETS LLC\n123 Main St\nINVOICE\nInvoice No. 4711\nBill To: Foo Corp\nDate: 2018-03-05\n"
    facts = extract_filing_facts(text)
    assert (facts.document_type, facts.organization, facts.fiscal_period) == ("invoice", "Acme Widgets LLC", "")


def test_title_gives_type_and_period_when_text_does_not() -> None:
    facts = extract_filing_facts("Letter to shareholders.", title="Amazon.com Annual Report 2017")
    assert (facts.document_type, facts.fiscal_period) == ("annual report", "FY2017")
    assert facts.sources["document_type"] == "title: 'Amazon.com Annual Report 2017'"
    identifier = extract_filing_facts("Letter to shareholders.", title="0001018724-18-000005")
    assert identifier.document_type == ""


def test_file_name_is_the_last_resort_for_the_form() -> None:
    assert extract_filing_facts("Some text.", file_name="amzn-20171231x10k.pdf").document_type == "10-K"
    assert extract_filing_facts("Some text.", file_name="/data/form10-q_2018.pdf").document_type == "10-Q"
    assert extract_filing_facts("Some text.", file_name="x10kb.pdf").document_type == ""


def test_all_caps_casing_rules() -> None:
    cover = "FORM 10-K\n{name}\n(Exact name of registrant as specified in its charter)\n"
    names = {
        "AT&T INC.": "AT&T Inc.",
        "INTERNATIONAL BUSINESS MACHINES CORPORATION": "International Business Machines Corporation",
        "THE COCA-COLA COMPANY": "The Coca-Cola Company",
        "BANK OF AMERICA CORPORATION": "Bank of America Corporation",
        "ING GROEP N.V.": "ING Groep N.V.",
        "3M COMPANY": "3M Company",
        "THE NEW YORK TIMES COMPANY": "The New York Times Company",
        "Alphabet Inc.": "Alphabet Inc.",
        "Microsoft Corporation.": "Microsoft Corporation",
        "JPMorgan Chase & Co.": "JPMorgan Chase & Co.",
    }
    for raw, expected in names.items():
        assert extract_filing_facts(cover.format(name=raw)).organization == expected, raw


def test_empty_text() -> None:
    assert extract_filing_facts("") == FilingFacts()


_PIECES = st.sampled_from(
    [
        "FORM 10-K",
        "Form 10-Q\n",
        "☒",
        "(Exact name of registrant as specified in its charter)",
        "ACME INC.\n",
        "Title of each class Trading Symbol(s) Name of each exchange on which registered\n",
        "| Title of each class | Trading Symbol | Exchange |\n",
        "| --- | --- |",
        "Common Stock AMD The Nasdaq ",
        "| MMM26 | ",
        "Class B ",
        "Q4 FY",
        "fourth quarter ended ",
        "December 31, 2017",
        "31 Dec 0001",
        "9999-12-31",
        "(NASDAQ: X)",
        "--",
        "fiscal 2019 ",
        "Annual Report",
        "Statement Period: ",
        "INVOICE",
        "\n",
        " ",
        "K",
        "Abstract\n",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=400), st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=30).map("".join)))
def test_never_raises_and_types_stay_in_the_vocabulary(text: str) -> None:
    facts = extract_filing_facts(text, title=text[:40], file_name=text[-20:])
    assert facts.document_type in DOCUMENT_TYPES | {""}
    assert facts.fiscal_period == "" or facts.fiscal_period.startswith("FY") or "-Q" in facts.fiscal_period
    assert set(facts.sources) <= {"organization", "document_type", "fiscal_period", "period_end", "ticker"}
    assert facts.ticker == "" or re.fullmatch(r"[A-Z]{1,6}(?:[.-][A-Z]{1,2})?", facts.ticker), facts.ticker
    assert facts.ticker == "" or facts.document_type  # like the organisation, only for a known type
