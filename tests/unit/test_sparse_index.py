"""Tests of the English analyzer and the incremental in-process BM25 index."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_bm25 import BM25Okapi

from query_service.app import bm25_parameters, check_retrieval_settings
from query_service.sparse_index import IndexedChunk, InProcessBm25Index
from ragrpc.analyzer import ENGLISH_STOP_WORDS, EnglishAnalyzer
from ragrpc.config import Settings
from ragrpc.errors import PreconditionError
from ragrpc.evaluation import load_beir
from ragrpc.store.request_filter import filter_from_request

IR_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "eval" / "ir"


class WhitespaceAnalyzer:
    """Splits on whitespace: lets tests choose the exact terms."""

    def analyze(self, text: str) -> list[str]:
        return text.split()


def assert_equals_rank_bm25(
    index: InProcessBm25Index, analyzer, tenant: str, live: dict[str, str], query: str, k1: float = 1.5, b: float = 0.75
) -> None:
    """The index's scores equal BM25Okapi (with the same k1 and b) rebuilt from scratch on the live chunks."""
    ids = sorted(live)
    corpus = [analyzer.analyze(live[chunk_id]) for chunk_id in ids]
    got = dict(index.search(query, top_k=len(ids) + 5, tenant=tenant))
    if not any(corpus):
        assert got == {}
        return
    query_terms = analyzer.analyze(query)
    expected = BM25Okapi(corpus, k1=k1, b=b).get_scores(query_terms)
    for chunk_id, terms, score in zip(ids, corpus, expected, strict=True):
        if set(terms) & set(query_terms):
            assert got[chunk_id] == pytest.approx(score, rel=1e-9, abs=1e-6), chunk_id
        else:
            assert chunk_id not in got
    assert set(got) <= set(ids)


# --- analyzer -----------------------------------------------------------------------


def test_analyzer_lowercases_removes_stop_words_and_stems() -> None:
    analyzer = EnglishAnalyzer()
    assert analyzer.analyze("The Runner was RUNNING and runs; it ran.") == ["runner", "run", "run", "ran"]


def test_analyzer_keeps_digits_and_unicode_words_and_splits_underscores() -> None:
    analyzer = EnglishAnalyzer()
    assert analyzer.analyze("COVID-19 in 2020: Ünïcode café, snake_case x2") == [
        "covid",
        "19",
        "2020",
        "ünïcode",
        "café",
        "snake",
        "case",
        "x2",
    ]
    assert analyzer.analyze("ﬁnance") == ["financ"]  # NFKC folds the ligature


def test_analyzer_drops_overlong_tokens_and_handles_empty_text() -> None:
    analyzer = EnglishAnalyzer(max_token_length=5)
    assert analyzer.analyze("short muchlonger") == ["short"]
    assert analyzer.analyze("") == []
    assert analyzer.analyze("the and of") == []


def test_stop_word_list_is_a_standard_english_list() -> None:
    assert {"the", "and", "of", "is", "don"} <= ENGLISH_STOP_WORDS
    assert 120 <= len(ENGLISH_STOP_WORDS) <= 200


def test_analyzer_is_safe_from_many_threads() -> None:
    analyzer = EnglishAnalyzer()
    text = "generalizations of running connections between organizations " * 50
    expected = analyzer.analyze(text)
    results: list[list[str]] = []

    def work() -> None:
        for _ in range(50):
            results.append(analyzer.analyze(text))

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 400 and all(result == expected for result in results)


# --- BM25 equality with rank_bm25 ---------------------------------------------------

words = st.sampled_from(["apple", "banana", "cherry", "date", "elder", "fig", "grape", "honey"])
chunk_text = st.lists(words, max_size=6).map(" ".join)
operations = st.lists(
    st.tuples(st.sampled_from(["add", "remove", "replace"]), st.integers(0, 5), st.lists(chunk_text, max_size=4)),
    max_size=25,
)


@pytest.mark.parametrize(("compaction_min_dead", "merge_min_chunks"), [(1, 16384), (1024, 16384), (1024, 1), (1, 3)])
@given(operations=operations, query=st.lists(words, min_size=1, max_size=4).map(" ".join))
@settings(max_examples=150, deadline=None)
def test_incremental_updates_equal_a_rebuilt_rank_bm25(
    compaction_min_dead, merge_min_chunks, operations, query
) -> None:
    """Whatever part (compact or recent) each chunk is in when the query comes."""
    analyzer = WhitespaceAnalyzer()
    index = InProcessBm25Index(
        analyzer,
        compaction_min_dead=compaction_min_dead,
        merge_min_chunks=merge_min_chunks,
        merge_ratio=0.5,
        prune_min_postings=0,  # pruning tried on every query (below: the best few, which it may prune for)
    )
    documents: dict[str, list[str]] = {}
    for version, (operation, doc_number, texts) in enumerate(operations):
        document_id = f"doc{doc_number}"
        chunks = [(f"{document_id}-v{version}-{i}", text, {}) for i, text in enumerate(texts)]
        index.replace_document("noise", document_id, [("n" + c[0], "fig fig fig", {}) for c in chunks])
        if operation == "remove":
            assert index.remove_document("t", document_id) == (document_id in documents)
            documents.pop(document_id, None)
        elif operation == "add" and document_id not in documents:
            index.add_document("t", document_id, chunks)
            documents[document_id] = texts
        else:
            index.replace_document("t", document_id, chunks)
            documents[document_id] = texts
    live = {f"{d}-{i}": text for d, texts in documents.items() for i, text in enumerate(texts)}
    got = index.search(query, top_k=1000, tenant="t")
    for k in (1, 2, 3):  # the best k, pruned or not, are the full ranking's first k
        assert index.search(query, top_k=k, tenant="t") == got[:k]
    renamed = {_strip_version(chunk_id): score for chunk_id, score in got}
    assert len(renamed) == len(got)
    rebuilt = InProcessBm25Index(analyzer)
    for chunk_id, text in live.items():
        rebuilt.add_document("t", chunk_id, [(chunk_id, text, {})])
    assert renamed == pytest.approx(dict(rebuilt.search(query, top_k=1000, tenant="t")), rel=1e-9, abs=1e-9)
    assert_equals_rank_bm25(rebuilt, analyzer, "t", live, query)


def _strip_version(chunk_id: str) -> str:
    document_id, _, index = chunk_id.split("-")
    return f"{document_id}-{index}"


def _cisi_documents(count: int) -> list[dict]:
    path = IR_DATA / "cisi" / "corpus.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not available")
    with path.open() as handle:
        return [json.loads(line) for _, line in zip(range(count), handle, strict=False)]


def test_real_text_with_english_analyzer_equals_rank_bm25_after_updates() -> None:
    analyzer = EnglishAnalyzer()
    index = InProcessBm25Index(analyzer, compaction_min_dead=10)
    documents = _cisi_documents(120)
    live: dict[str, str] = {}
    for doc in documents:
        paragraphs = [doc["title"], *doc["text"].split(". ")]
        chunks = [(f"{doc['_id']}:{i}", text, {}) for i, text in enumerate(paragraphs)]
        index.add_document("t", doc["_id"], chunks)
        live.update({chunk_id: text for chunk_id, text, _ in chunks})
    for doc in documents[:40]:  # remove a third (triggers compaction)
        index.remove_document("t", doc["_id"])
        live = {k: v for k, v in live.items() if not k.startswith(doc["_id"] + ":")}
    for doc in documents[40:60]:  # replace with the title only
        index.replace_document("t", doc["_id"], [(f"{doc['_id']}:new", doc["title"], {})])
        live = {k: v for k, v in live.items() if not k.startswith(doc["_id"] + ":")}
        live[f"{doc['_id']}:new"] = doc["title"]
    for query in [
        "classification of library documents",
        "information retrieval systems evaluation",
        "the history of Dewey decimal classifications",
        "citation indexing",
    ]:
        assert_equals_rank_bm25(index, analyzer, "t", live, query)


@pytest.mark.parametrize(("k1", "b"), [(0.9, 0.4), (1.2, 1.0), (2.0, 0.0)])
def test_configured_k1_and_b_score_like_rank_bm25_with_them(k1: float, b: float) -> None:
    analyzer = EnglishAnalyzer()
    settings = dataclasses.replace(Settings(), bm25_k1=k1, bm25_b=b)
    index = InProcessBm25Index(analyzer, bm25_parameters(settings))
    live = {}
    for doc in _cisi_documents(60):
        index.add_document("t", doc["_id"], [(doc["_id"], doc["text"], {})])
        live[doc["_id"]] = doc["text"]
    for query in ("classification of library documents", "citation indexing of scientific journals"):
        assert_equals_rank_bm25(index, analyzer, "t", live, query, k1=k1, b=b)


@pytest.mark.parametrize(("k1", "b", "variable"), [(-0.1, 0.75, "_K1"), (math.nan, 0.75, "_K1"), (1.2, 1.5, "_B")])
def test_bm25_parameters_out_of_range_are_refused_naming_the_setting(k1: float, b: float, variable: str) -> None:
    with pytest.raises(PreconditionError, match=f"RAGRPC_BM25{variable}"):
        bm25_parameters(dataclasses.replace(Settings(), bm25_k1=k1, bm25_b=b))


def test_repeated_query_terms_count_like_rank_bm25() -> None:
    analyzer = WhitespaceAnalyzer()
    index = InProcessBm25Index(analyzer)
    live = {"a": "x y", "b": "y z z", "c": "w"}
    for chunk_id, text in live.items():
        index.add_document("t", chunk_id, [(chunk_id, text, {})])
    assert_equals_rank_bm25(index, analyzer, "t", live, "z z y")


# --- behaviour ----------------------------------------------------------------------


def test_stemming_makes_running_match_runs() -> None:
    index = InProcessBm25Index(EnglishAnalyzer())
    index.add_document("t", "d1", [("c1", "She runs every morning.", {})])
    index.add_document("t", "d2", [("c2", "Apples are red.", {})])
    index.add_document("t", "d3", [("c3", "Pears are green.", {})])
    assert [chunk_id for chunk_id, _ in index.search("running", 10, tenant="t")] == ["c1"]


def test_tenants_are_separate_scopes() -> None:
    index = InProcessBm25Index(WhitespaceAnalyzer())
    index.add_document("a", "d", [("a1", "alpha beta", {}), ("a2", "gamma", {}), ("a3", "delta", {})])
    before = index.search("alpha", 10, tenant="a")
    index.add_document("b", "d", [(f"b{i}", "alpha alpha", {}) for i in range(50)])
    assert index.search("alpha", 10, tenant="a") == before  # other tenants do not change the statistics
    assert [chunk_id for chunk_id, _ in before] == ["a1"]
    tenant_b = index.search("alpha", 100, tenant="b")
    assert {chunk_id for chunk_id, _ in tenant_b} == {f"b{i}" for i in range(50)}
    assert index.search("alpha", 10, tenant="nobody") == []
    assert index.remove_document("a", "d") and index.search("alpha", 10, tenant="a") == []
    assert index.document_count("b") == 1 and index.chunk_count("b") == 50


def test_allow_predicate_restricts_candidates_with_the_request_filter() -> None:
    index = InProcessBm25Index(WhitespaceAnalyzer())
    attrs = {"collection": "c1", "kind": 0, "source": "s", "tags": ["x"], "doc_date": 5}
    index.add_document("t", "d1", [("c1", "apple pie", attrs), ("c2", "apple", {**attrs, "kind": 1})])
    index.add_document("t", "d2", [("c3", "apple apple", {**attrs, "collection": "c2"})])
    index.add_document("t", "d3", [("c4", "pear", attrs), ("c5", "apple tart", {**attrs, "tags": ["y"]})])
    allow = filter_from_request("t", "c1", tags=["x"]).matches
    assert [chunk_id for chunk_id, _ in index.search("apple", 10, tenant="t", allow=allow)] == ["c1"]
    by_document = filter_from_request("t", document_ids=["d2", "d3"]).matches
    by_allow = index.search("apple", 10, tenant="t", allow=by_document)
    assert [chunk_id for chunk_id, _ in by_allow] == ["c3", "c5"]
    restricted = index.search("apple", 10, tenant="t", document_ids=["d2", "d3", "missing"])
    assert [chunk_id for chunk_id, _ in restricted] == ["c3", "c5"]
    assert index.search("apple", 10, tenant="t", document_ids=[]) == []


def test_top_k_and_ties_broken_by_chunk_id() -> None:
    index = InProcessBm25Index(WhitespaceAnalyzer())
    for i in range(300):
        index.add_document("t", f"d{i:03}", [(f"c{299 - i:03}", "same words" if i % 2 else "other text", {})])
    hits = index.search("same", 5, tenant="t")
    assert [chunk_id for chunk_id, _ in hits] == ["c000", "c002", "c004", "c006", "c008"]
    assert len({score for _, score in hits}) == 1
    filtered = index.search("same", 3, tenant="t", allow=lambda attrs: attrs["chunk_id"] > "c200")
    assert [chunk_id for chunk_id, _ in filtered] == ["c202", "c204", "c206"]
    assert index.search("same", 0, tenant="t") == [] and index.search("the", 5, tenant="t") == []


def test_higher_scores_come_first() -> None:
    index = InProcessBm25Index(WhitespaceAnalyzer())
    filler = [(f"f{i}", "e f g", {}) for i in range(6)]
    index.add_document("t", "d", [("c1", "a b c d", {}), ("c2", "a a a", {}), *filler])
    hits = index.search("a", 10, tenant="t")
    assert [chunk_id for chunk_id, _ in hits] == ["c2", "c1"] and hits[0][1] > hits[1][1] > 0


def test_adding_an_indexed_document_again_is_an_error() -> None:
    index = InProcessBm25Index(WhitespaceAnalyzer())
    index.add_document("t", "d", [IndexedChunk("c", "a", {})])
    with pytest.raises(ValueError):
        index.add_document("t", "d", [IndexedChunk("c", "a", {})])
    assert not index.remove_document("t", "missing")


def test_replacement_is_atomic_for_concurrent_readers() -> None:
    index = InProcessBm25Index(WhitespaceAnalyzer(), compaction_min_dead=8)
    index.add_document("t", "other", [("o", "filler words here", {})])
    index.add_document("t", "d", [(f"v0-{i}", "common v0", {}) for i in range(4)])
    errors: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            versions = {chunk_id.split("-")[0] for chunk_id, _ in index.search("common", 50, tenant="t")}
            if len(versions) != 1:
                errors.append(f"saw versions {versions}")

    readers = [threading.Thread(target=read) for _ in range(4)]
    for reader in readers:
        reader.start()
    for version in range(1, 300):
        index.replace_document("t", "d", [(f"v{version}-{i}", f"common v{version}", {}) for i in range(4)])
    stop.set()
    for reader in readers:
        reader.join()
    assert errors == []
    final = index.search("common", 50, tenant="t")
    assert {chunk_id for chunk_id, _ in final} == {f"v299-{i}" for i in range(4)}


def test_selective_allow_walks_past_the_first_sorted_head() -> None:
    analyzer = WhitespaceAnalyzer()
    index = InProcessBm25Index(analyzer)
    rng = random.Random(5)
    for i in range(2000):
        vocabulary = ["alpha", "beta", "gamma", "delta", "x", "y", "z"]
        text = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 12)))
        index.add_document("t", f"d{i}", [(f"c{i:04}", text, {"bucket": i % 37})])
    allow = lambda attrs: attrs["bucket"] == 3  # noqa: E731 - about 54 of 2000 chunks pass
    everything = index.search("alpha beta", 5000, tenant="t")
    passing = [(chunk_id, score) for chunk_id, score in everything if int(chunk_id[1:]) % 37 == 3]
    expected = sorted(passing, key=lambda hit: (-hit[1], hit[0]))[:20]
    assert index.search("alpha beta", 20, tenant="t", allow=allow) == expected
    assert len(everything) > 1000


@pytest.mark.parametrize(
    ("changes", "variable"),
    [
        ({"rrf_k": 0}, "RAGRPC_RRF_K"),
        ({"dense_weight": -0.5}, "RAGRPC_DENSE_WEIGHT"),
        ({"dense_weight": 0.0, "sparse_weight": 0.0}, "RAGRPC_SPARSE_WEIGHT"),
        ({"sparse_weight": math.inf}, "RAGRPC_SPARSE_WEIGHT"),
        ({"bm25_b": -0.1}, "RAGRPC_BM25_B"),
    ],
)
def test_retrieval_settings_no_request_could_use_stop_the_service(changes: dict, variable: str) -> None:
    with pytest.raises(PreconditionError, match=variable):
        check_retrieval_settings(dataclasses.replace(Settings(), **changes))
    check_retrieval_settings(Settings())  # the defaults pass


# --- real text at size, compaction, the compact layout --------------------------------


@pytest.fixture(scope="module")
def scifact() -> tuple[dict[str, list[str]], list[str]]:
    """3,000 SciFact abstracts (title and text) analysed by the English analyzer, and 40 claims."""
    directory = IR_DATA / "scifact"
    if not directory.exists():
        pytest.skip(f"{directory} not available")
    dataset = load_beir(directory, "train")
    analyzer = EnglishAnalyzer()
    documents = {doc_id: analyzer.analyze(doc.full_text) for doc_id, doc in list(dataset.corpus.items())[:3000]}
    return documents, list(dataset.queries.values())[:40]


def _exact_ranking(live: dict[str, list[str]], text: str, k: int) -> tuple[list[str], dict[str, float]]:
    """rank_bm25's scores of the chunks that hold a query term, and their top k (ties by chunk id)."""
    ids = sorted(live)
    query = EnglishAnalyzer().analyze(text)
    scores = BM25Okapi([live[i] for i in ids]).get_scores(query)
    wanted = set(query)
    held = {i: float(score) for i, score in zip(ids, scores, strict=True) if wanted & set(live[i])}
    return sorted(held, key=lambda i: (-held[i], i))[:k], held


@pytest.mark.parametrize("prune_min_postings", [0, 10**9])
def test_scifact_abstracts_score_exactly_like_rank_bm25_through_updates_and_compactions(
    scifact, prune_min_postings: int
) -> None:
    """Scores equal rank_bm25's; the top 10 (pruned or not) are rank_bm25's top 10, ties by chunk id."""
    documents, queries = scifact
    index = InProcessBm25Index(
        EnglishAnalyzer(),
        merge_min_chunks=256,
        merge_ratio=0.3,
        compaction_min_dead=200,
        prune_min_postings=prune_min_postings,
    )
    live: dict[str, list[str]] = {}
    ids = list(documents)
    for number, doc_id in enumerate(ids):  # documents of 1-3 chunks: the abstract cut in thirds
        terms = documents[doc_id]
        parts = [terms[i * len(terms) // 3 : (i + 1) * len(terms) // 3] for i in range(1 + number % 3)]
        chunks = [
            IndexedChunk(f"{doc_id}:{i}", "", {"collection": f"c{number % 4}"}, part) for i, part in enumerate(parts)
        ]
        index.add_document("t", doc_id, chunks)
        live.update({chunk.chunk_id: list(chunk.terms or ()) for chunk in chunks})
    for doc_id in ids[::7]:  # removals, in compact and recent parts
        assert index.remove_document("t", doc_id)
        live = {c: t for c, t in live.items() if not c.startswith(doc_id + ":")}
    for doc_id in ids[1::11]:  # replacements by the first half of the abstract
        index.replace_document("t", doc_id, [IndexedChunk(f"{doc_id}:r", "", {}, documents[doc_id][:40])])
        live = {c: t for c, t in live.items() if not c.startswith(doc_id + ":")}
        live[f"{doc_id}:r"] = documents[doc_id][:40]
    scope = index._scopes["t"]  # noqa: SLF001 - both parts must be in play
    assert scope.slots.compact_size > 1000 and scope.slots.recent_size > 0 and scope.slots.dead_slots > 0
    for query in queries:
        top, exact = _exact_ranking(live, query, 10)
        got = dict(index.search(query, len(live), tenant="t"))
        assert set(got) == set(exact)
        assert all(got[c] == pytest.approx(exact[c], rel=1e-9, abs=1e-9) for c in exact)
        assert [c for c, _ in index.search(query, 10, tenant="t")] == top
    index.compact()
    assert scope.slots.recent_size == 0 and scope.slots.dead_slots == 0
    for query in queries[:10]:
        top, _ = _exact_ranking(live, query, 10)
        assert [c for c, _ in index.search(query, 10, tenant="t")] == top


def test_terms_of_removed_chunks_leave_the_vocabulary_at_a_compaction() -> None:
    analyzer = WhitespaceAnalyzer()
    index = InProcessBm25Index(analyzer, merge_min_chunks=100, compaction_min_dead=10**6)  # compact() only
    live = {}
    for i in range(3000):  # each chunk has a term no other has
        index.add_document("t", f"d{i}", [(f"c{i}", f"common unique{i} shared{i % 10}", {})])
        live[f"c{i}"] = f"common unique{i} shared{i % 10}"
    for i in range(2800):
        index.remove_document("t", f"d{i}")
        del live[f"c{i}"]
    index.compact()
    scope = index._scopes["t"]  # noqa: SLF001 - the vocabulary's size is what is checked
    assert len(scope.postings.vocabulary) == 200 + 10 + 1 and scope.term_cache == {}
    index.add_document("t", "again", [("again", "unique5 unique2999 shared3", {})])  # an old and a kept term
    live["again"] = "unique5 unique2999 shared3"
    for query in ("unique5", "unique2999 common", "shared3 unique2950", "unique17"):
        assert_equals_rank_bm25(index, analyzer, "t", live, query)


def test_the_compact_layout_costs_a_few_bytes_a_posting() -> None:
    index = InProcessBm25Index(WhitespaceAnalyzer())
    rng = random.Random(3)
    for d in range(2000):
        chunks = [
            (f"d{d}-{i}", " ".join(f"w{rng.randint(0, 999)}" for _ in range(40)), {"collection": "c"}) for i in range(5)
        ]
        index.add_document("t", f"d{d}", chunks)
    index.compact()
    scope = index._scopes["t"]  # noqa: SLF001 - the layout is what is checked
    postings = scope.postings
    assert postings.slots.dtype == np.int32 and postings.tfs.dtype == np.uint8 and postings.terms.dtype == np.int32
    assert postings.lengths.dtype == np.uint8
    per_posting = (postings.slots.nbytes + postings.tfs.nbytes + postings.terms.nbytes) / len(postings.slots)
    assert per_posting == 9  # slot 4 + tf 1 + forward term id 4
    assert index.memory_bytes() / index.chunk_count("t") < 9 * 40 + 100  # 40 terms a chunk, ids and attributes
    assert index.chunk_count("t") == 10_000 and index.document_count("t") == 2000


def test_document_restriction_reads_compact_and_recent_documents() -> None:
    index = InProcessBm25Index(WhitespaceAnalyzer(), merge_min_chunks=1000)
    index.add_document("t", "filler", [(f"filler{i}", "pear", {}) for i in range(200)])  # apple is rare
    for i in range(30):
        index.add_document("t", f"d{i}", [(f"d{i}-{k}", "apple " * (k + 1), {}) for k in range(2)])
    index.compact()
    for i in range(30, 40):
        index.add_document("t", f"d{i}", [(f"d{i}-{k}", "apple " * (k + 1), {}) for k in range(2)])
    index.remove_document("t", "d3")
    got = index.search("apple", 10, tenant="t", document_ids=["d2", "d3", "d35", "nope"])
    assert sorted(chunk_id for chunk_id, _ in got) == ["d2-0", "d2-1", "d35-0", "d35-1"]
    assert [a for a, _ in got][:2] == ["d2-1", "d35-1"]  # tf 2 beats tf 1; equal scores by chunk id


def test_readers_see_whole_documents_while_compactions_run() -> None:
    index = InProcessBm25Index(WhitespaceAnalyzer(), merge_min_chunks=8, merge_ratio=0.1, compaction_min_dead=4)
    for i in range(50):
        index.add_document("t", f"filler{i}", [(f"f{i}", f"filler words {i}", {"n": i})])
    index.add_document("t", "d", [(f"v0-{i}", "common v0", {"n": i}) for i in range(4)])
    errors: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            hits = index.search("common", 50, tenant="t", allow=lambda attrs: attrs["n"] < 4)
            versions = {chunk_id.split("-")[0] for chunk_id, _ in hits}
            if len(versions) != 1 or len(hits) != 4:
                errors.append(f"saw {hits}")

    readers = [threading.Thread(target=read) for _ in range(3)]
    for reader in readers:
        reader.start()
    for version in range(1, 200):
        index.replace_document("t", "d", [(f"v{version}-{i}", f"common v{version}", {"n": i}) for i in range(4)])
        if version % 50 == 0:
            index.compact()
    stop.set()
    for reader in readers:
        reader.join()
    assert errors == []
    assert {chunk_id for chunk_id, _ in index.search("common", 50, tenant="t")} == {f"v199-{i}" for i in range(4)}
