"""A document's title is one a person can tell it by, with the choice recorded (metadata
`title_source`); an enricher's title suggestion takes its place in that order."""

from __future__ import annotations

from ingest_service.document_facts import choose_title
from ragrpc.enrich import TitleSuggestion
from ragrpc.models import Block, BlockKind, DocumentMetadata, ExtractedDocument


def _doc(blocks: list[Block], title: str = "") -> ExtractedDocument:
    return ExtractedDocument("application/pdf", blocks, metadata=DocumentMetadata(title=title))


def test_an_identifier_title_is_replaced_and_the_choice_recorded() -> None:
    cover = _doc([Block(BlockKind.PARAGRAPH, "Some cover text")], title="0001018724-18-000005")
    assert choose_title("My own title", cover, "cover.pdf") == ("My own title", "request")
    assert choose_title("", cover, "cover.pdf") == ("Some cover text", "first line")
    named = _doc([Block(BlockKind.PARAGRAPH, "text")], title="Attention Is All You Need")
    assert choose_title("", named, "1706.03762.pdf") == ("Attention Is All You Need", "file metadata")
    headed = _doc([Block(BlockKind.HEADING, "Ducks"), Block(BlockKind.PARAGRAPH, "Ducks swim.")])
    assert choose_title("", headed, "ducks.md") == ("Ducks", "first heading")
    plain = _doc([Block(BlockKind.PARAGRAPH, "Quarterly field notes\nThe herons came back in March.")])
    assert choose_title("", plain, "notes.txt") == ("Quarterly field notes", "first line")
    empty = _doc([Block(BlockKind.PARAGRAPH, "1234 5678")])
    assert choose_title("", empty, "scan_0042.pdf") == ("scan_0042", "file name")


def test_an_enrichers_suggestion_comes_after_the_files_title_and_a_heading_it_accepts() -> None:
    suggestion = TitleSuggestion("Heron Survey 2024", "survey facts", frozenset({"heron"}))
    named = _doc([Block(BlockKind.HEADING, "Introduction")], title="Field Report On Herons")
    assert choose_title("", named, "r.pdf", suggestion) == ("Field Report On Herons", "file metadata")
    generic_heading = _doc([Block(BlockKind.HEADING, "Introduction"), Block(BlockKind.PARAGRAPH, "Text here.")])
    assert choose_title("", generic_heading, "r.pdf", suggestion) == ("Heron Survey 2024", "survey facts")
    assert choose_title("", generic_heading, "r.pdf") == ("Introduction", "first heading")  # no suggestion
    naming = _doc([Block(BlockKind.HEADING, "The Heron Count"), Block(BlockKind.PARAGRAPH, "Text here.")])
    assert choose_title("", naming, "r.pdf", suggestion) == ("The Heron Count", "first heading")
    assert choose_title("Given", naming, "r.pdf", suggestion) == ("Given", "request")
