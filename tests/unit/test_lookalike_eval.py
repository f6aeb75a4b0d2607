"""The look-alike document set of make eval (scripts/lookalike_pages.py, lookalike_questions.py,
lookalike_eval.py): question generation (deterministic, extractive, distinctive for one page,
never a verbatim copy), passages from PDF words, document selection and the cache; and, marked
slow, the whole step through the real services."""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from scripts import lookalike_questions as lq
from scripts.lookalike_pages import PageText, duplicate_chars, page_passages
from scripts.lookalike_questions import content_tokens, generate_questions, normalised

DOCS = Path(__file__).resolve().parents[2].parent / "shared" / "eval" / "docs"
needs_docs = pytest.mark.skipif(not (DOCS / "inventory.jsonl").is_file(), reason="shared eval docs not present")
SMALL_PDFS = ("docling__normal_4pages", "docling__multi_page", "docling__code_and_formula")

HEADER = "Example Company quarterly review, page {n}"


def page(document_id: str, number: int, *lines: str) -> PageText:
    passages = (HEADER.format(n=number), *lines)
    return PageText(document_id, number, "\n".join(passages), passages)


def handmade_pages() -> list[PageText]:
    shared = "revenue grew in the quarter compared with the prior year"  # on every page: not distinctive
    return [
        page(
            "report", 1, shared, "The harbour crane contract with Orvieto Logistics was signed in Tallinn last spring"
        ),
        page(
            "report", 2, shared, "Net revenues of the Zephyr segment reached 7,312 million after the Brightwater sale"
        ),
        page("report", 3, shared, "Staff counts fell at the Quimper and Lorient plants while Dunmore hired welders"),
        page("other", 1, shared, "Dividends rose for the Kestrel fund while Marigold bonds matured early in autumn"),
        page("single", 1, shared, "Unique Fandango Xylophone Gazebo words sit on a single page distractor here"),
        page("garbled", 1, "OFFICE OF RISK AN D INSUR ANCE MA NAGEMENT FORTUNATELY NOWHERE ELSE"),
    ]


def generate(pages: list[PageText], seed: int = lq.SEED) -> list[lq.Question]:
    families = {"report": "reports", "other": "reports", "garbled": "forms"}
    return generate_questions(pages, families, {"report", "other", "garbled"}, seed)


def test_generation_is_deterministic() -> None:
    first, second = generate(handmade_pages()), generate(handmade_pages())
    assert first == second and first
    assert len({q.question_id for q in first}) == len(first)


def test_each_question_targets_the_page_of_its_passage() -> None:
    pages = {(p.document_id, p.page): p for p in handmade_pages()}
    questions = generate(list(pages.values()))
    assert {(q.document_id, q.page) for q in questions} == {("report", 1), ("report", 2), ("report", 3), ("other", 1)}
    for question in questions:
        target = pages[(question.document_id, question.page)]
        assert question.passage in target.passages and question.passage in target.text
        assert set(content_tokens(question.query)) <= set(content_tokens(question.passage))
        assert question.family == "reports"


def test_questions_are_distinctive_for_their_page() -> None:
    pages = handmade_pages()
    for question in generate(pages):
        assert len(question.distinctive) >= lq.MIN_DISTINCTIVE
        assert set(question.distinctive) <= set(content_tokens(question.query))
        for other in pages:
            here = set(question.distinctive) & set(content_tokens(other.text))
            if (other.document_id, other.page) == (question.document_id, question.page):
                assert here == set(question.distinctive)
            else:
                assert not here, f"{question.query!r} shares {here} with {other.document_id} p{other.page}"


def test_no_question_is_a_verbatim_piece_of_its_page() -> None:
    pages = handmade_pages()
    for question in generate(pages):
        target = next(p for p in pages if (p.document_id, p.page) == (question.document_id, question.page))
        assert normalised(question.query) not in normalised(target.text)
        assert len(question.query.split()) >= lq.MIN_WORDS


def test_headers_distractors_and_garbled_text_make_no_question() -> None:
    questions = generate(handmade_pages())
    assert not any("example" in q.query or "quarterly" in q.query for q in questions)  # running header
    assert not any(q.document_id == "single" for q in questions)  # not a question document
    assert not any(q.document_id == "garbled" for q in questions)  # letter-spaced words


def test_stop_words_and_common_words_are_dropped() -> None:
    for question in generate(handmade_pages()):
        words = question.query.split()
        assert not set(words) & lq.STOP_WORDS
        assert "revenue" not in words and "quarter" not in words  # found on every page


def test_caps_per_page_and_per_document(monkeypatch: pytest.MonkeyPatch) -> None:
    # no two lines share a distinctive token (a page's questions never do)
    lines = [f"Alpha{i}x Beta{i}y Gamma{i}z Delta{i}w meet Epsilon{i}v" for i in range(6)]
    pages = [page("report", 1, *lines), page("report", 2, *(line.replace("a", "o") for line in lines))]
    pages += [page("filler", n, "nothing shared here at all") for n in range(1, 30)]
    questions = generate(pages)
    assert sum(q.page == 1 for q in questions) == lq.PER_PAGE
    monkeypatch.setattr(lq, "PER_DOCUMENT", 3)
    assert len(generate(pages)) == 3


def words_of(*rows: tuple[float, float, str]) -> list[dict[str, Any]]:
    """pdfplumber-like word dicts: (x0, top, text), 10 pt high, 6 pt a character."""
    return [{"x0": x, "x1": x + 6 * len(t), "top": top, "bottom": top + 10, "text": t} for x, top, t in rows]


def test_passages_keep_columns_apart_and_table_rows_whole() -> None:
    def line(x: float, top: float, text: str) -> list[tuple[float, float, str]]:
        out, position = [], x
        for word in text.split():
            out.append((position, top, word))
            position += 6 * len(word) + 3  # a word space: 0.3 of the height
        return out

    words = words_of(
        *line(0, 0, "left column first"),
        *line(300, 0, "right column first"),
        *line(0, 12, "left column sec-"),
        *line(300, 12, "right column second"),
        *line(0, 40, "ondly written"),
        (0, 60, "Acme"),
        (100, 60, "Oakland"),
        (200, 60, "202"),
        (260, 60, "Closure"),
    )
    passages = page_passages(words)
    assert "left column first left column sec-" in passages
    assert "right column first right column second" in passages
    assert "left column secondly written" in passages  # hyphenation joined across the lines
    assert "Acme Oakland 202 Closure" in passages
    assert not any("left" in p and "right" in p for p in passages)


@needs_docs
def test_questions_from_real_pdfs_hold_on_their_page() -> None:
    import pdfplumber

    pages = [p for stem in SMALL_PDFS for p in lq.read_pdf(DOCS / "pdf" / f"{stem}.pdf", stem)]
    questions = generate_questions(pages, {}, set(SMALL_PDFS))
    assert len(questions) >= 10 and {q.document_id for q in questions} >= {SMALL_PDFS[0], SMALL_PDFS[1]}
    assert generate_questions(pages, {}, set(SMALL_PDFS)) == questions
    tokens_on = {(p.document_id, p.page): set(content_tokens(p.text)) for p in pages}
    words_on: dict[tuple[str, int], set[str]] = {}
    for stem in SMALL_PDFS:
        with pdfplumber.open(DOCS / "pdf" / f"{stem}.pdf") as pdf:
            for number, pdf_page in enumerate(pdf.pages, start=1):
                # read independently: pdfplumber's own dedupe_chars, the same word gap
                words = [w["text"] for w in pdf_page.dedupe_chars().extract_words(x_tolerance_ratio=lq.WORD_GAP_EM)]
                joined = {a[:-1] + b for a, b in zip(words, words[1:], strict=False) if a.endswith("-")}
                words_on[(stem, number)] = {normalised(w) for w in [*words, *joined]}
    for question in questions:
        on_page = words_on[(question.document_id, question.page)]
        for word in question.passage.split():
            assert normalised(word) in on_page, f"{word!r} of {question.question_id} is not on its page"
        for token in question.distinctive:
            holders = [key for key, found in tokens_on.items() if token in found]
            assert holders in ([(question.document_id, question.page)], []), (token, holders)
        assert normalised(question.query) not in normalised(pdf_text(question, pages))


def pdf_text(question: lq.Question, pages: list[PageText]) -> str:
    return next(p.text for p in pages if (p.document_id, p.page) == (question.document_id, question.page))


@needs_docs
def test_selection_leaves_out_unreadable_files_and_the_set_is_cached(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in (DOCS / "inventory.jsonl").read_text().splitlines() if line.strip()]
    keep = {f"pdf/{stem}.pdf" for stem in SMALL_PDFS}
    (tmp_path / "pdf").mkdir()
    inventory = [r for r in rows if r["file"] in keep]
    inventory.append({"file": "pdf/pypdf__pdflatex-outline.pdf", "encrypted": True, "pages": 4, "text_chars": 7699})
    inventory.append({"file": "pdf/docling__2305.03393v1-pg9.pdf", "error": "EmptyFileError"})
    for row in inventory:
        (tmp_path / row["file"]).symlink_to(DOCS / row["file"])
    (tmp_path / "inventory.jsonl").write_text("\n".join(json.dumps(r) for r in inventory))
    documents, skipped = lq.select_documents(tmp_path)
    assert {d.document_id for d in documents} == set(SMALL_PDFS)
    assert skipped["pdf/pypdf__pdflatex-outline.pdf"] == "encrypted"
    assert skipped["pdf/docling__2305.03393v1-pg9.pdf"].startswith("unreadable")
    assert all(d.family == "papers" for d in documents)
    first = lq.load_lookalike_set(tmp_path, cache_dir=tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("questions-*.json"))) == 1

    def no_reading(*_: object) -> None:
        raise AssertionError("the cached set was read again")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lq, "read_pdf", no_reading)
        assert lq.load_lookalike_set(tmp_path, cache_dir=tmp_path / "cache").questions == first.questions


def test_every_family_member_is_a_valid_document_id() -> None:
    valid = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
    stems = [stem for members in lq.FAMILIES.values() for stem in members]
    assert len(stems) == len(set(stems)) and all(valid.match(s) for s in stems)


def test_subset_and_table() -> None:
    from scripts.lookalike_eval import print_lookalike_table, subset

    assert subset(list(range(10)), 3) == [0, 3, 6] and subset([1, 2], None) == [1, 2] and subset([1], 5) == [1]
    row = {"doc@1": 0.5, "doc@5": 0.75, "page@5": 0.25, "page@10": 0.5, "mrr@10": 0.3, "page@5 in doc": 0.6}
    report = {
        "documents": [{"document_id": "a", "family": "f", "pages": 3}],
        "questions": 4,
        "question_documents": 1,
        "results": {"dense": {**row, "p50_ms": 12.0}},
    }
    out = io.StringIO()
    with redirect_stdout(out):
        print_lookalike_table(report)
    text = out.getvalue()
    assert "1 PDFs (3 pages), 4 questions" in text and "page@5 in doc" in text
    assert re.search(r"dense\s+0\.5000\s+0\.7500\s+0\.2500\s+0\.5000\s+0\.3000\s+0\.6000\s+12\.0", text)


@pytest.mark.slow
@needs_docs
def test_the_lookalike_step_through_the_real_services(tmp_path: Path) -> None:
    """Two PDFs, ten questions, the four configurations: uploads, Retrieve with and without the
    document filter, scores (a few minutes: the services load the real model)."""
    from scripts.eval import lookalike_configs
    from scripts.lookalike_eval import evaluate_lookalike

    documents = [d for d in lq.select_documents(DOCS)[0] if d.document_id in SMALL_PDFS[:2]]
    pages = [p for d in documents for p in lq.read_pdf(d.path, d.document_id)]
    questions = generate_questions(pages, {d.document_id: d.family for d in documents}, set(SMALL_PDFS))
    lookalike = lq.LookalikeSet(documents, questions, {})
    report = evaluate_lookalike(lookalike_configs(), data_dir=tmp_path, max_questions=10, lookalike=lookalike)
    assert report["questions"] == 10 and report["ingestion"]["chunks"] > 0
    assert set(report["results"]) == {"dense", "sparse rank_bm25", "hybrid rrf", "hybrid weighted"}
    for row in report["results"].values():
        assert 0.0 <= row["page@5"] <= min(row["page@10"], row["doc@5"]) and row["doc@1"] <= row["doc@5"] <= 1.0
        assert 0.0 <= row["page@5 in doc"] <= 1.0 and row["p50_ms"] > 0
    # keyword questions from the page: BM25 finds most of their pages among two documents
    assert report["results"]["sparse rank_bm25"]["page@5"] >= 0.5


def test_characters_drawn_twice_are_read_once() -> None:
    def char(text: str, x: float, top: float = 100.0) -> dict[str, Any]:
        return {"text": text, "x0": x, "top": top, "fontname": "F", "size": 10.0}

    # "all" in fake bold: every glyph drawn again 0.4 pt to the right; a real double "l" stays
    chars = [char("a", 10), char("a", 10.4), char("l", 16), char("l", 16.4), char("l", 19), char("l", 19.4)]
    chars.append(char("a", 10.2, top=130))  # the same letter on another line
    duplicates = duplicate_chars(chars)
    assert duplicates == {id(chars[1]), id(chars[3]), id(chars[5])}
    across_cells = [char("x", 5.9, 9.9), char("x", 6.1, 10.1)]  # on both sides of a one-point cell border
    assert duplicate_chars(across_cells) == {id(across_cells[1])}
