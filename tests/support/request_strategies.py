"""Hypothesis strategies for the fields of the services' requests: valid values, hostile ones
(NUL, quotes, filter syntax, huge strings, out-of-range numbers, NaN), and requests where none, one
or all fields are hostile, so that both the validation and the deep paths run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import timestamp_pb2
from hypothesis import strategies as st

from ragrpc.v1 import ingest_pb2, retrieve_pb2
from tests.support import hostile_inputs as hi

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=80)
NASTY = st.sampled_from(
    [
        '"',
        "\\",
        '\\"',
        "' or 1==1 or '",
        '") or true or ("',
        "a\nb",
        "\t",
        "\x00",
        "\x7f",
        "\u202e",
        'tenant == "x"',
        "{p0}",
        "%s",
        "é",
        "🦆",
        "x" * 129,
        "x" * 5000,
        " ",
        "",
    ]
)
STRINGS = st.one_of(TEXT, NASTY, st.from_regex(r"[A-Za-z0-9._:-]{1,40}", fullmatch=True))
INT32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 1, -1, 100, 101, 1000, 1001, 2**31 - 1]))
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 0.5, 1.0, -0.0, 1e308]))
ENUM = st.integers(-3, 40)
ID = st.from_regex(r"[A-Za-z0-9._:-]{1,40}", fullmatch=True)
NAME = st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True)
WORDS = st.lists(
    st.sampled_from(["grebe", "coot", "tern", "pond", "reed", "fish", "dive", "nest", "lake"]), min_size=1, max_size=8
).map(" ".join)
LABEL = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=30)
CONTENT = st.one_of(
    st.binary(max_size=3000),
    TEXT.map(lambda t: ("Grebes and coots share the pond. " + t).encode()),
    WORDS.map(lambda t: (t + ". ").encode() * 40),
    st.sampled_from(
        [hi.minimal_pdf(["fuzzed pdf line about terns"]), hi.small_docx("fuzzed docx about terns"), b"", b"\x00" * 64]
    ),
)


def timestamp(seconds: int, nanos: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)


TIMESTAMPS = st.builds(timestamp, st.integers(-(2**63), 2**63 - 1), INT32)


def pick(draw: Callable[..., Any], hostile: set[str], name: str, valid: Any, bad: Any) -> Any:
    return draw(bad if name in hostile else valid)


def hostile_fields(draw: Callable[..., Any], names: list[str]) -> set[str]:
    """Which fields of one request are hostile: none (a valid request, so the deep paths run),
    one, or all of them."""
    mode = draw(st.sampled_from(["valid", "one", "one", "all"]))
    if mode == "valid":
        return set()
    if mode == "one":
        return {draw(st.sampled_from(names))}
    return set(names)


_SPEC_FIELDS = [
    "document_id",
    "file_name",
    "media_type",
    "collection",
    "source",
    "title",
    "tags",
    "metadata",
    "password",
    "strategy",
    "size",
    "overlap",
]


@st.composite
def document_specs(draw: Callable[..., Any]) -> ingest_pb2.DocumentSpec:
    bad = hostile_fields(draw, _SPEC_FIELDS)
    size = pick(draw, bad, "size", st.sampled_from([0, 0, 16, 64, 200, 254]), INT32)
    spec = ingest_pb2.DocumentSpec(
        document_id=pick(
            draw, bad, "document_id", st.one_of(ID, st.sampled_from(["fuzz-doc-1", "fuzz-doc-2"])), STRINGS
        ),
        file_name=pick(draw, bad, "file_name", st.sampled_from(["a.txt", "b.md", "c.html", "notes"]), STRINGS),
        media_type=pick(
            draw,
            bad,
            "media_type",
            st.sampled_from(["", "text/plain", "text/markdown"]),
            st.one_of(
                STRINGS,
                st.sampled_from(["application/pdf", "text/html", hi.MEDIA_DOCX, "image/png", "text/x-unknown"]),
            ),
        ),
        collection=pick(draw, bad, "collection", st.one_of(st.just(""), NAME), STRINGS),
        source=pick(draw, bad, "source", st.one_of(st.just(""), LABEL), STRINGS),
        title=pick(draw, bad, "title", st.one_of(st.just(""), LABEL), STRINGS),
        tags=pick(draw, bad, "tags", st.lists(LABEL, max_size=4), st.lists(STRINGS, max_size=40)),
        metadata=pick(
            draw,
            bad,
            "metadata",
            st.dictionaries(LABEL, LABEL, max_size=4),
            st.dictionaries(STRINGS, st.one_of(STRINGS, st.just("v" * 5000)), max_size=70),
        ),
        password=pick(draw, bad, "password", st.just(""), STRINGS),
        chunking=ingest_pb2.ChunkingOptions(
            strategy=pick(draw, bad, "strategy", st.integers(0, 10), ENUM),
            chunk_size_tokens=size,
            chunk_overlap_tokens=pick(
                draw, bad, "overlap", st.integers(0, max(0, size - 1)) if 0 <= size < 2**31 else st.just(0), INT32
            ),
        ),
    )
    return spec


_OPTION_FIELDS = [
    "top_k",
    "mode",
    "fusion",
    "candidates",
    "rrf_k",
    "collection",
    "document_ids",
    "sources",
    "media_types",
    "tags",
    "facts",
    "weights",
    "mmr",
    "min_score",
    "times",
]


@st.composite
def retrieval_options(draw: Callable[..., Any], hostile: bool = True) -> retrieve_pb2.RetrievalOptions:
    bad = hostile_fields(draw, _OPTION_FIELDS) if hostile else set()
    top_k = pick(draw, bad, "top_k", st.integers(0, 20), INT32)
    options = retrieve_pb2.RetrievalOptions(
        top_k=top_k,
        mode=pick(draw, bad, "mode", st.integers(0, 3), ENUM),
        fusion=pick(draw, bad, "fusion", st.integers(0, 2), ENUM),
        candidates=pick(draw, bad, "candidates", st.sampled_from([0, 50, 200]), INT32),
        rrf_k=pick(draw, bad, "rrf_k", st.sampled_from([0, 1, 60]), INT32),
        include_parent=draw(st.booleans()),
        collection=pick(draw, bad, "collection", st.sampled_from(["", "default", "other"]), STRINGS),
        filter=retrieve_pb2.MetadataFilter(
            document_ids=pick(
                draw,
                bad,
                "document_ids",
                st.lists(st.sampled_from(["fuzz-doc-0", "fuzz-doc-1", "fuzz-doc-2", "nope"]), max_size=3),
                st.lists(STRINGS, max_size=6),
            ),
            sources=pick(
                draw,
                bad,
                "sources",
                st.lists(st.sampled_from(['src "0" \\', "seed1.txt"]), max_size=2),
                st.lists(STRINGS, max_size=4),
            ),
            media_types=pick(
                draw,
                bad,
                "media_types",
                st.lists(st.sampled_from(["text/plain", "text/html"]), max_size=2),
                st.lists(STRINGS, max_size=3),
            ),
            tags=pick(
                draw,
                bad,
                "tags",
                st.lists(st.sampled_from(["seed", "t1", "t2"]), max_size=2),
                st.lists(STRINGS, max_size=6),
            ),
            tickers=pick(draw, bad, "facts", st.lists(st.sampled_from(["AMD", "JNJ"]), max_size=2), st.lists(STRINGS)),
            organizations=pick(
                draw, bad, "facts", st.lists(st.sampled_from(["Amazon.com, Inc."]), max_size=1), st.lists(STRINGS)
            ),
        ),
    )
    if "weights" in bad:
        for name in ("dense_weight", "sparse_weight"):
            if draw(st.booleans()):
                setattr(options, name, draw(FLOATS))
    elif draw(st.booleans()):
        options.dense_weight, options.sparse_weight = draw(st.sampled_from([(0.7, 0.3), (1.0, 0.0), (0.0, 1.0)]))
    if draw(st.booleans()):
        options.mmr_lambda = draw(FLOATS if "mmr" in bad else st.floats(0.0, 1.0))
    if draw(st.booleans()):
        options.min_score = draw(FLOATS if "min_score" in bad else st.floats(-1.0, 1.0))
    if draw(st.booleans()):
        options.rerank = draw(st.booleans())
    for name in ("document_time_after", "document_time_before"):
        if draw(st.booleans()):
            stamp = draw(
                TIMESTAMPS
                if "times" in bad
                else st.builds(timestamp, st.integers(0, 4_000_000_000), st.integers(0, 999_999_999))
            )
            getattr(options.filter, name).CopyFrom(stamp)
    return options


QUERIES = st.one_of(WORDS, WORDS, WORDS, STRINGS, st.sampled_from(["x" * 4097, "   ", "\x00", "é" * 4096]))
