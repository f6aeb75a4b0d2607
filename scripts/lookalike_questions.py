"""The look-alike document set of `make eval`: shared PDFs of a few families, and questions
whose answer sits on one page of one of them, generated automatically from the page text.

Documents. The text PDFs of ../shared/eval/docs/pdf sorted into families of similar documents
(FAMILIES: financial statements, government tables, public records, technical manuals, papers,
plans and reports). Files that inventory.jsonl marks as broken, empty, encrypted or without a
text layer are left out (and listed in the report). Every file is ingested; questions are made
from the multi-page ones only, so that "right page" means something. The single-page files and
two pairs of exact duplicates (the two nics-background-checks tables, the two pypdf outline
papers: none of their pages is distinctive, so they get no question) stay in the collection
as look-alike distractors. Pages of one document share running headers, footers and table
layouts, and documents of one family share vocabulary.

Questions (extractive, made automatically from the page text, deterministic: a fixed seed, no
model, no person). Each page is read with pdfplumber (scripts/lookalike_pages.py: characters
drawn twice deduplicated; a gap wider than WORD_GAP_EM of the font size separates words, so
tightly set text is not read as one long word) into passages: a table row (a line of
three or more segments, most of them short), or two consecutive lines of one column (lines are
cut at horizontal gaps wider than GAP_EM word heights, so two columns never mix; a word
hyphenated across the break is joined). A token is a lowercase unicode word (letters and
digits); a token is *distinctive* when it occurs on exactly one page of the whole set (all
documents, distractors included) and has at least MIN_TOKEN characters. Left out: passages
found on three or more pages with digits masked (running headers and footers, which the ingest
service drops), and letter-spaced text ("INSUR ANCE MA NAGEMENT"). A passage qualifies when
at least MIN_DISTINCTIVE of its tokens are distinctive. Its question: the passage's words with
stop words and common words (on more than COMMON_PAGE_SHARE of the pages, and on more than
COMMON_MIN_PAGES) dropped, the window of at most WINDOW words holding the most distinctive
tokens, one adjacent pair swapped, lowercased; a question that is still a verbatim piece of
its page text is dropped. At most PER_PAGE questions a page (no two sharing a distinctive
token), PER_DOCUMENT a document (a seeded sample). Target: the document (its id is the file
stem) and the 1-based page the passage is on; no other page of the set holds the question's
distinctive tokens.

What this measures: whether retrieval brings back the right document and the right page when
the query names a few terms that sit on one page only, among pages and documents that look
alike; page ranges of chunks (page_start..page_end) are checked against the page, so it also
measures that chunking keeps pages apart. What it does not measure: questions as people ask
them (these are keyword bags taken from the page, which favours lexical matching: BM25 will
look better than it would on paraphrased questions), answers spread over several pages,
reasoning, or anything about generated answers. Text the extractor reads differently from
pdfplumber's default word grouping (hyphenation, letter-spaced numbers) can make a question
harder than intended.

The set is cached under .eval/lookalike/ keyed by a digest of the files and of the settings
here, so a second run does not read the PDFs again.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scripts.lookalike_pages import GAP_EM, WORD_GAP_EM, PageText, read_pdf
from scripts.processes import REPO

DOCS = REPO.parent / "shared" / "eval" / "docs"
CACHE_DIR = REPO / ".eval" / "lookalike"
VERSION = 3  # bump when the generation changes: the cache key includes it
SEED = 20240611
MIN_DISTINCTIVE = 2
COMMON_PAGE_SHARE = 0.1
COMMON_MIN_PAGES = 3  # ... but a word on at most this many pages is never common
WINDOW = 8
MIN_WORDS = 4
MIN_TOKEN = 3  # shortest distinctive token
PER_PAGE = 2
PER_DOCUMENT = 30

FAMILIES: dict[str, tuple[str, ...]] = {
    "financial statements": (
        "llamadatasets__income-statement-morgan-stanley",
        "llamadatasets__bank_statement",
        "pdfplumber__senate-expenditures",
    ),
    "government tables": (
        "pdfplumber__WARN-Report-for-7-1-2015-to-03-25-2016",
        "pdfplumber__nics-background-checks-2015-11",
        "pdfplumber__nics-background-checks-2015-11-rotated",
        "pdfplumber__cupertino_usd_4-6-16",
        "pdfplumber__la-precinct-bulletin-2014-p1",
    ),
    "public records": (
        "pdfplumber__federal-register-2020-17221",
        "pdfplumber__150109DSP-Milw-505-90D",
        "pdfplumber__scotus-transcript-p1",
        "llamadatasets__std270",
    ),
    "technical manuals": (
        "docling__redp5110_sampled",
        "pypdf__GeoBase_NHNC1_Data_Model_UML_EN",
        "docling__amt_handbook_sample",
    ),
    "papers": (
        "docling__multi_page",
        "docling__normal_4pages",
        "docling__code_and_formula",
        "pypdf__pdflatex-outline",
        "pypdf__outlines-with-invalid-destinations",
        "docling__2305.03393v1-pg9",
    ),
    "plans and reports": (
        "pdfplumber__chelsea_pdta",
        "pypdf__Seige_of_Vicksburg_Sample_OCR",
        "pdfplumber__issue-33-lorem-ipsum",
    ),
}

STOP_WORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have having he
    her here hers him his how i if in into is it its itself just may me more most must my no nor not now of off on
    once only or other our ours out over own per same shall she should so some such than that the their theirs them
    then there these they this those through to too under until up upon very was we were what when where which while
    who whom why will with would you your de la le les des et du en un une est pour par au aux sur dans que qui pas
    ou ce se sont ne""".split()
)

_TOKEN = re.compile(r"[^\W_]+")
_DIGIT = re.compile(r"\d")
_EDGE_PUNCT = re.compile(r"^[^\w$£€%]+|[^\w%]+$")


def tokens(text: str) -> list[str]:
    """Lowercase unicode word tokens (letters and digits), NFKC-normalised."""
    return _TOKEN.findall(unicodedata.normalize("NFKC", text).lower())


def content_tokens(text: str) -> list[str]:
    """Tokens that can make a page distinctive: no stop words, no single characters."""
    return [t for t in tokens(text) if len(t) > 1 and t not in STOP_WORDS]


def normalised(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


@dataclass(frozen=True)
class Question:
    question_id: str
    query: str
    document_id: str
    page: int  # 1-based
    family: str
    passage: str  # the page text the question was made from
    distinctive: tuple[str, ...]  # its tokens that occur on this page only


# ---------------------------------------------------------------- questions


def page_frequencies(pages: Iterable[PageText]) -> Counter[str]:
    """Content token -> number of pages it occurs on (text and passages, whose joined hyphenations
    may add words)."""
    counts: Counter[str] = Counter()
    for page in pages:
        counts.update(set(content_tokens(page.text)).union(*(content_tokens(p) for p in page.passages)))
    return counts


def repeated_passages(pages: Iterable[PageText], min_pages: int = 3) -> set[str]:
    """Passages (digits masked) found on at least `min_pages` pages: running headers and
    footers, boilerplate rows. The ingest service drops repeated margins, so no question is
    made from them."""
    counts: Counter[str] = Counter()
    for page in pages:
        counts.update({masked(p) for p in page.passages})
    return {text for text, count in counts.items() if count >= min_pages}


def distinctive_tokens(text: str, frequencies: Counter[str]) -> tuple[str, ...]:
    """The text's tokens that occur on one page only (and are at least MIN_TOKEN long), sorted."""
    return tuple(sorted(t for t in set(content_tokens(text)) if frequencies[t] == 1 and len(t) >= MIN_TOKEN))


def masked(passage: str) -> str:
    return _DIGIT.sub("0", normalised(passage))


def garbled(words: Sequence[str]) -> bool:
    """Two or more one- or two-letter (latin) words that are not stop words: letter-spaced text that
    the extractor may read as other words ("INSUR ANCE MA NAGEMENT", "Wa ter")."""
    return sum(1 for w in words if w.isascii() and w.isalpha() and len(w) <= 2 and w.lower() not in STOP_WORDS) >= 2


def _window(words: list[str], distinctive: set[str]) -> list[str]:
    """The WINDOW consecutive words with the most distinctive tokens (earliest on ties)."""
    best, best_count = words[:WINDOW], -1
    for start in range(max(len(words) - WINDOW, 0) + 1):
        window = words[start : start + WINDOW]
        count = len(distinctive.intersection(t for w in window for t in tokens(w)))
        if count > best_count:
            best, best_count = window, count
    return best


def make_question(
    passage: str, page_text: str, frequencies: Counter[str], pages: int, rng: random.Random
) -> str | None:
    """The question for one passage, or None when it does not qualify (see the module docstring)."""
    common = max(COMMON_PAGE_SHARE * pages, COMMON_MIN_PAGES)
    words = [w for w in (_EDGE_PUNCT.sub("", raw) for raw in passage.split()) if w]
    if garbled(words):
        return None
    kept = [w for w in words if any(frequencies[t] <= common for t in content_tokens(w))]
    distinctive = set(distinctive_tokens(" ".join(kept), frequencies))
    if len(distinctive) < MIN_DISTINCTIVE or len(kept) < MIN_WORDS:
        return None
    window = _window(kept, distinctive)
    if len(distinctive.intersection(t for w in window for t in tokens(w))) < MIN_DISTINCTIVE:
        return None
    swap = rng.randrange(len(window) - 1)
    window[swap], window[swap + 1] = window[swap + 1], window[swap]
    query = " ".join(window).lower()
    if normalised(query) in normalised(page_text) or normalised(query) in normalised(passage):
        return None
    return query


def generate_questions(
    pages: Sequence[PageText], families: dict[str, str], question_documents: set[str], seed: int = SEED
) -> list[Question]:
    """Questions over `pages` (all documents of the set: distinctiveness is over all of them),
    made from the pages of `question_documents` only; deterministic for a given seed."""
    rng = random.Random(seed)
    frequencies = page_frequencies(pages)
    repeated = repeated_passages(pages)
    by_document: dict[str, list[Question]] = {}
    for page in pages:
        if page.document_id not in question_documents:
            continue
        chosen: list[Question] = []
        used: set[str] = set()
        for passage in rng.sample(page.passages, len(page.passages)):
            if masked(passage) in repeated:
                continue
            query = make_question(passage, page.text, frequencies, len(pages), rng)
            if query is None:
                continue
            distinctive = distinctive_tokens(query, frequencies)
            if used.intersection(distinctive):
                continue
            used.update(distinctive)
            qid = f"{page.document_id}:p{page.page}:{len(chosen) + 1}"
            family = families.get(page.document_id, "")
            chosen.append(Question(qid, query, page.document_id, page.page, family, passage, distinctive))
            if len(chosen) == PER_PAGE:
                break
        by_document.setdefault(page.document_id, []).extend(chosen)
    questions: list[Question] = []
    for document_questions in by_document.values():
        if len(document_questions) > PER_DOCUMENT:
            document_questions = rng.sample(document_questions, PER_DOCUMENT)
        questions.extend(sorted(document_questions, key=lambda q: (q.page, q.question_id)))
    return questions


# ---------------------------------------------------------------- the set, cached


@dataclass(frozen=True)
class LookalikeDocument:
    document_id: str
    path: Path
    family: str
    pages: int


@dataclass(frozen=True)
class LookalikeSet:
    documents: list[LookalikeDocument]
    questions: list[Question]
    skipped: dict[str, str]  # file -> why it is not in the set
    source: Path | None = None  # the cached questions file


def select_documents(root: Path = DOCS) -> tuple[list[LookalikeDocument], dict[str, str]]:
    """The family members inventory.jsonl shows as readable, unencrypted, with a text layer."""
    inventory = {
        Path(row["file"]).stem: row
        for row in (json.loads(line) for line in (root / "inventory.jsonl").read_text().splitlines() if line.strip())
        if row["file"].startswith("pdf/")
    }
    documents, skipped = [], {}
    for family, stems in FAMILIES.items():
        for stem in stems:
            row = inventory.get(stem)
            why = _unfit(row)
            if why:
                skipped[f"pdf/{stem}.pdf"] = why
            else:
                assert row is not None
                documents.append(LookalikeDocument(stem, root / row["file"], family, int(row["pages"])))
    return documents, skipped


def _unfit(row: dict[str, Any] | None) -> str:
    if row is None:
        return "not in inventory.jsonl"
    if row.get("error"):
        return f"unreadable: {row['error']}"
    if row.get("encrypted"):
        return "encrypted"
    if not row.get("pages") or row.get("pages_without_text", 0) >= row["pages"]:
        return "no text layer"
    if row.get("text_chars", 0) < 100 * row["pages"]:
        return "almost no text"
    return ""


def cache_key(documents: Sequence[LookalikeDocument], seed: int) -> str:
    digest = hashlib.sha256()
    settings = (VERSION, seed, MIN_DISTINCTIVE, MIN_TOKEN, COMMON_PAGE_SHARE, COMMON_MIN_PAGES, WINDOW, MIN_WORDS)
    digest.update(repr((settings, PER_PAGE, PER_DOCUMENT, WORD_GAP_EM, GAP_EM, sorted(STOP_WORDS))).encode())
    for document in documents:
        digest.update(f"{document.document_id}\0{document.family}\0".encode())
        digest.update(hashlib.sha256(document.path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def load_lookalike_set(root: Path = DOCS, cache_dir: Path = CACHE_DIR, seed: int = SEED) -> LookalikeSet:
    """The documents and questions, from the cache when the files and settings are unchanged."""
    documents, skipped = select_documents(root)
    cache = cache_dir / f"questions-{cache_key(documents, seed)}.json"
    if cache.is_file():
        questions = [Question(**{**q, "distinctive": tuple(q["distinctive"])}) for q in json.loads(cache.read_text())]
        return LookalikeSet(documents, questions, skipped, cache)
    pages = [page for document in documents for page in read_pdf(document.path, document.document_id)]
    families = {d.document_id: d.family for d in documents}
    multi_page = {d.document_id for d in documents if d.pages > 1}
    questions = generate_questions(pages, families, multi_page, seed)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps([asdict(q) for q in questions], indent=1, ensure_ascii=False))
    return LookalikeSet(documents, questions, skipped, cache)
