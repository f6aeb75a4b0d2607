"""meaningful_title: which stored titles are kept and which (identifiers, dates, paths, file
names, editor defaults) are replaced by a better candidate."""

from __future__ import annotations

import pytest

from ragrpc.enrich.titles import meaningful_title


@pytest.mark.parametrize(
    "title",
    [
        "",
        "  ",
        "ab",
        "0001018724-18-000005",
        "3f2504e0-4f89-11d3-9a0c-0305e82c3301",
        "d41d8cd98f00b204e9800998ecf8427e",
        "2018-02-01",
        "D:20180201103000Z",
        "2018-02-01T10:00:00Z",
        "December 31, 2017",
        "12345",
        "C:\\docs\\x.pdf",
        "/home/me/reports/q4.pdf",
        "report_final_v2.docx",
        "report_final_v2",
        "Microsoft Word - abc.docx",
        "Microsoft Word - Annual Report",
        "untitled",
        "Untitled document",
        "Document1",
        "PowerPoint Presentation",
        "Presentation1",
        "--- ! ---",
        "amzn-20171231x10k",
    ],
)
def test_meaningless_titles(title: str) -> None:
    assert not meaningful_title(title)


@pytest.mark.parametrize(
    "title", ["Amazon.com Annual Report 2017", "Attention Is All You Need", "COVID-19 Outlook", "Q4 2017 Results"]
)
def test_meaningful_titles(title: str) -> None:
    assert meaningful_title(title)


def test_title_equal_to_its_file_name_is_not_a_title() -> None:
    assert not meaningful_title("Q4results", file_name="Q4results.pdf")
    assert not meaningful_title("scan 0042.pdf", file_name="uploads/scan 0042.pdf")
    assert meaningful_title("Annual Report 2017", file_name="Annual Report 2017.pdf")
