"""PDF tables over page breaks: a table at the top of a page that goes on with the table that
ended the page before is marked as its continuation, with that table's header and caption."""

from __future__ import annotations

from ingest_service.extract.pdf_blocks import Paragraph, build_blocks
from ragrpc.models import BlockKind


def test_a_table_at_the_top_of_a_page_goes_on_with_the_table_that_ended_the_page_before() -> None:
    header = "| Company | City | Jobs |\n| --- | --- | --- |"

    def table(page: int, first: str, rows: list[str], caption: str = "") -> Paragraph:
        own = f"| {first} |\n| --- | --- | --- |"
        return Paragraph(BlockKind.TABLE, "\n".join([own, *rows]), page, table_header=own, caption=caption)

    same = table(2, "Company | City | Jobs", ["| Acme | Reno | 12 |"])
    assert same.table_header == header
    blocks = build_blocks(
        [
            table(1, "Company | City | Jobs", ["| Zenith | Ely | 40 |"], caption="WARN notices"),
            same,  # the header repeated on the page
            table(3, "Borders | Lodi | 7", ["| Cobalt | Elko | 3 |"]),  # the header not repeated
            Paragraph(BlockKind.PARAGRAPH, "Notes.", 4),
            table(5, "Company | City | Jobs", ["| Delta | Mesa | 9 |"]),  # text came between
        ]
    )
    tables = [b for b in blocks if b.kind is BlockKind.TABLE]
    assert [b.continues_table for b in tables] == [False, True, True, False]
    assert [b.table_caption for b in tables] == ["WARN notices", "WARN notices", "WARN notices", ""]
    assert tables[2].text == f"{header}\n| Borders | Lodi | 7 |\n| Cobalt | Elko | 3 |"  # its first row is a row
    assert all(b.table_header == header for b in tables)
