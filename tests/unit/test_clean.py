"""clean_text / clean_blocks, and the metadata completion helpers."""

from __future__ import annotations

import hashlib

import pytest

from ingest_service.clean import clean_blocks, clean_text, is_boilerplate_line
from ingest_service.metadata import content_hash, document_metadata, guess_language
from ragrpc.models import Block, BlockKind, DocumentMetadata, ExtractedDocument


def test_unicode_normalised_and_controls_removed() -> None:
    assert clean_text("ﬁne ＦＵＬＬ width\u00a0space") == "fine FULL width space"
    assert clean_text("nul\x00byte\x07bell\x1b[0m") == "nulbytebell[0m"
    assert clean_text("zero\u200bwidth soft\u00adhyphen\ufeff") == "zerowidth softhyphen"
    assert clean_text("tab\tand   spaces \r\nnew line") == "tab and spaces\nnew line"


def test_whitespace_and_blank_lines_collapsed() -> None:
    assert clean_text("  a  \n\n\n\n  b \n c  ") == "a\n\nb\nc"


def test_boilerplate_lines_removed() -> None:
    text = "Real text.\nPage 3 of 10\n- 12 -\n42\nClick here to subscribe\n© 2024 ACME Inc. All rights reserved.\nMore."
    assert clean_text(text) == "Real text.\nMore."
    assert is_boilerplate_line("Jump to navigation")
    assert not is_boilerplate_line("Page 3 shows the results")
    assert not is_boilerplate_line("1999 was a good year for ducks")


def test_table_and_code_keep_their_lines() -> None:
    table = Block(
        BlockKind.TABLE,
        "| a |  b |\n| --- | --- |\n\n| 1 |\u00a02 |",
        table_header="| a |  b |\n| --- | --- |",
    )
    code = Block(BlockKind.CODE, "\n\n    def f():\n        return 1\x00\n", language="python")
    cleaned_table, cleaned_code = clean_blocks([table, code])
    assert cleaned_table.text == "| a | b |\n| --- | --- |\n| 1 | 2 |"
    assert cleaned_table.table_header == "| a | b |\n| --- | --- |"
    assert cleaned_code.text == "def f():\n    return 1" and cleaned_code.language == "python"


def test_empty_blocks_dropped_and_fields_kept() -> None:
    blocks = [
        Block(BlockKind.PARAGRAPH, " \x00 \n "),
        Block(BlockKind.PARAGRAPH, "Page 2 of 9"),
        Block(BlockKind.LIST_ITEM, "- item", page=4, section_path=("ﬁrst", " "), level=2),
        Block(BlockKind.CODE, "\n\n"),
    ]
    (item,) = clean_blocks(blocks)
    assert (item.text, item.page, item.section_path, item.level) == ("- item", 4, ("first",), 2)


SENTENCES = {
    "en": "The duck is a bird that lives in the water and it is often seen on lakes with the others, "
    "and this is not a surprise.",
    "de": "Die Ente ist ein Vogel, der auf dem Wasser lebt und nicht gern mit den anderen Vögeln "
    "auf dem See ist, auch wenn es warm ist.",
    "fr": "Le canard est un oiseau qui vit dans les lacs et qui est souvent avec les autres sur le lac, "
    "pour le plaisir de tous.",
    "es": "El pato es un ave que vive en el agua y que se ve con los otros patos en la laguna, "
    "por la mañana y por la tarde.",
}


@pytest.mark.parametrize("language", sorted(SENTENCES))
def test_guess_language(language: str) -> None:
    assert guess_language(SENTENCES[language]) == language


def test_guess_language_unsure_is_empty() -> None:
    assert guess_language("short text") == ""
    assert guess_language("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor") == ""


def test_document_metadata_completes_title_hash_and_size() -> None:
    data = b"raw bytes of the document"
    doc = ExtractedDocument(
        media_type="text/markdown",
        blocks=[Block(BlockKind.PARAGRAPH, "intro"), Block(BlockKind.HEADING, "Real Title", level=1)],
        metadata=DocumentMetadata(author="Ann", extra={"keywords": "k"}),
    )
    meta = document_metadata(doc, data=data, file_name="dir/notes.final.md", source="s3://b/notes.md")
    assert meta.title == "Real Title" and meta.author == "Ann"
    assert meta.extra["sha256"] == hashlib.sha256(data).hexdigest() == content_hash(data)
    assert meta.extra["size_bytes"] == str(len(data)) and meta.extra["keywords"] == "k"
    assert meta.extra["source"] == "s3://b/notes.md"
    assert doc.metadata.extra == {"keywords": "k"}  # the input is not modified
    bare = ExtractedDocument(media_type="text/plain", blocks=[Block(BlockKind.PARAGRAPH, "x")])
    assert document_metadata(bare, data=b"x", file_name="report-2024.txt").title == "report-2024"
