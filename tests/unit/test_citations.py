from __future__ import annotations

import pytest

from query_service.generation.citations import CitationSpan, cited_numbers, parse_citations, validate


def spans_text(answer: str) -> list[tuple[int, str]]:
    return [(c.source_number, answer[c.answer_start : c.answer_end]) for c in parse_citations(answer)]


def test_single_marker_span_is_its_sentence():
    answer = "Paris is the capital of France [1]. It has 2 million people [2]."
    assert spans_text(answer) == [
        (1, "Paris is the capital of France [1]."),
        (2, "It has 2 million people [2]."),
    ]


def test_list_and_run_markers():
    answer = "Both agree on the date [1, 3]. The height is disputed [2][4]."
    assert spans_text(answer) == [
        (1, "Both agree on the date [1, 3]."),
        (3, "Both agree on the date [1, 3]."),
        (2, "The height is disputed [2][4]."),
        (4, "The height is disputed [2][4]."),
    ]
    assert cited_numbers(answer) == [1, 3, 2, 4]


def test_semicolons_and_ranges():
    assert cited_numbers("Seen in [1; 2] and [4-6].") == [1, 2, 4, 5, 6]


def test_marker_after_the_period_belongs_to_the_sentence_before():
    answer = "The tower opened in 1889. [2] It is made of iron."
    assert spans_text(answer) == [(2, "The tower opened in 1889. [2]")]


def test_offsets_are_character_positions_with_exclusive_end():
    answer = "Intro without citation. Second sentence cites [3]!"
    (citation,) = parse_citations(answer)
    assert citation == CitationSpan(3, answer.index("Second"), len(answer))


def test_repeated_marker_in_one_sentence_is_reported_once():
    assert len(parse_citations("A [1] and B [1] agree.")) == 1


def test_multiline_answer_lines_are_sentences():
    answer = "Key facts:\n- built in 1889 [1]\n- 330 m tall [2]"
    assert spans_text(answer) == [(1, "- built in 1889 [1]"), (2, "- 330 m tall [2]")]


def test_markdown_links_and_plain_brackets_are_not_citations():
    assert cited_numbers("See [the docs](http://x) and [1](http://y) and [a].") == []


@pytest.mark.parametrize(
    "answer, n_sources, expected",
    [
        ("Fine [1][2].", 2, None),
        ("No citations at all, but says the sources do not contain it.", 3, None),
        ("", 3, "empty answer"),
        ("   \n ", 3, "empty answer"),
        ("Wrong [9].", 3, "[9]"),
        ("Zero [0].", 3, "[0]"),
        ("Some [1] and none [4].", 3, "[4]"),
        ("Anything [1].", 0, "[1]"),
    ],
)
def test_validate(answer, n_sources, expected):
    reason = validate(answer, n_sources)
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason
