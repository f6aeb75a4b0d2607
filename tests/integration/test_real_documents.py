"""The issue's acceptance checks on real documents, asserted on what a search returns over gRPC:
both services in-process (the real composition roots) over a real milvus-lite server and the
real all-MiniLM-L6-v2 model. What the PDFs hold is checked with pdfplumber directly.

- a row of the NICS background-checks table comes back as one intact Markdown row under its
  header row;
- chunks' page_start/page_end are the PDF pages their text is on;
- the three-column Federal Register page reads column by column;
- DOCX headings make up the chunks' section_path;
- re-ingesting a file changes nothing; UpdateDocument of tags is seen by a tag-filtered
  Retrieve, on the same chunks with the same vectors (nothing re-embedded).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pdfplumber
import pytest
from google.protobuf import field_mask_pb2

from ragrpc.config import Settings
from ragrpc.store.factory import open_milvus_stores
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.conftest import SHARED_EVAL

DOCS = SHARED_EVAL / "docs"
NICS = DOCS / "pdf" / "pdfplumber__nics-background-checks-2015-11.pdf"
FEDERAL_REGISTER = DOCS / "pdf" / "pdfplumber__federal-register-2020-17221.pdf"
WORD_SAMPLE = DOCS / "docx" / "docling__word_sample.docx"
HEADERS_DOCX = DOCS / "docx" / "docling__unit_test_headers.docx"
TIMEOUT_S = 300.0
_SEPARATOR = re.compile(r"^\|(?:\s*:?-+:?\s*\|)+$")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(not DOCS.is_dir(), reason=f"the shared corpus {DOCS} is missing"),
]


# --- the services in-process over milvus-lite, on a loop of their own -------------------------


@dataclass
class RealStack:
    settings: Settings
    embedder: Any
    ingest_address: str = ""
    query_address: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _thread: threading.Thread | None = None
    _ready: Future[None] = field(default_factory=Future)

    def start(self) -> RealStack:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), name="real-stack", daemon=True)
        self._thread.start()
        self._ready.result(timeout=300)
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=60)

    async def _serve(self) -> None:
        from ingest_service.app import build_components as build_ingest
        from ingest_service.app import start_ingest_server
        from query_service.app import build_components as build_query
        from query_service.app import start_query_server

        try:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            model = {"model_id": self.embedder.model_id, "dimension": self.embedder.dimension}
            writer = await asyncio.to_thread(open_milvus_stores, self.settings, writer=True, **model)
            reader = await asyncio.to_thread(open_milvus_stores, self.settings, writer=False, **model)
            ingest = build_ingest(self.settings, self.embedder, writer.chunks, writer.registry)
            query = build_query(self.settings, self.embedder, reader.chunks, reader.registry)
            ingest_server = await start_ingest_server(self.settings, ingest, "127.0.0.1:0")
            query_server = await start_query_server(self.settings, query, "127.0.0.1:0")
        except BaseException as exc:
            self._ready.set_exception(exc)
            raise
        self.ingest_address = f"127.0.0.1:{ingest_server.port}"
        self.query_address = f"127.0.0.1:{query_server.port}"
        self._ready.set_result(None)
        try:
            await self._stop.wait()
        finally:
            await ingest_server.stop(0)
            await query_server.stop(0)
            ingest.shutdown()
            query.executor.shutdown(wait=False, cancel_futures=True)


@dataclass
class Client:
    ingest: ingest_pb2_grpc.IngestServiceStub
    query: retrieve_pb2_grpc.RetrieveServiceStub
    uploads: dict[str, ingest_pb2.UploadDocumentResponse] = field(default_factory=dict)

    def upload(self, path: Path, document_id: str, **spec: Any) -> ingest_pb2.UploadDocumentResponse:
        header = ingest_pb2.DocumentSpec(file_name=path.name, document_id=document_id, **spec)
        content = path.read_bytes()
        pieces = [
            ingest_pb2.UploadDocumentRequest(data=content[i : i + (1 << 20)]) for i in range(0, len(content), 1 << 20)
        ]
        reply = self.ingest.UploadDocument(
            iter([ingest_pb2.UploadDocumentRequest(header=header), *pieces]), timeout=TIMEOUT_S
        )
        self.uploads[document_id] = reply
        return reply

    def retrieve(self, query: str, top_k: int = 10, **filters: Any) -> list[retrieve_pb2.RetrieveResponse]:
        options = retrieve_pb2.RetrievalOptions(top_k=top_k, filter=retrieve_pb2.MetadataFilter(**filters))
        replies = list(
            self.query.Retrieve(retrieve_pb2.RetrieveRequest(query=query, options=options), timeout=TIMEOUT_S)
        )
        return [r for r in replies if r.HasField("chunk")]

    def chunks_with(self, phrase: str, document_id: str, query: str = "") -> list[Any]:
        """Chunks of the document a search for `query` (default: the phrase) returns that hold the phrase."""
        hits = self.retrieve(query or phrase, top_k=20, document_ids=[document_id])
        return [h.chunk.chunk for h in hits if phrase in flat(h.chunk.chunk.text)]


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def stack(milvus, real_embedder) -> Iterator[RealStack]:  # type: ignore[no-untyped-def]
    settings = dataclasses.replace(
        Settings(),
        milvus_uri=milvus.uri,
        collection_prefix="t_real_documents",
        workers=2,
        ingest_port=0,
        query_port=0,
        host="127.0.0.1",
    )
    running = RealStack(settings, real_embedder).start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def client(stack: RealStack) -> Iterator[Client]:
    with grpc.insecure_channel(stack.ingest_address) as ingest, grpc.insecure_channel(stack.query_address) as query:
        found = Client(ingest_pb2_grpc.IngestServiceStub(ingest), retrieve_pb2_grpc.RetrieveServiceStub(query))
        for path, document_id, spec in (
            (NICS, "nics", {}),
            (FEDERAL_REGISTER, "federal-register", {}),
            (WORD_SAMPLE, "word-sample", {"tags": ["ducks"]}),
            (
                HEADERS_DOCX,
                "headers",
                {
                    "chunking": ingest_pb2.ChunkingOptions(
                        strategy=ingest_pb2.CHUNKING_STRATEGY_HEADING, chunk_size_tokens=16
                    )
                },
            ),
        ):
            reply = found.upload(path, document_id, **spec)
            assert reply.document.state == ingest_pb2.DOCUMENT_STATE_ACTIVE, (document_id, reply)
        yield found


# --- tables ---------------------------------------------------------------------------------------


def nics_row(state: str) -> list[str]:
    """The cells of `state`'s row as pdfplumber reads the table (five states per ruled row)."""
    with pdfplumber.open(NICS) as pdf:
        rows = pdf.pages[0].find_tables()[0].extract()
    for row in rows:
        names = (row[0] or "").split("\n")
        if state in names:
            k = names.index(state)
            return [(cell or "").split("\n")[k] if (cell or "").count("\n") == len(names) - 1 else "" for cell in row]
    raise AssertionError(f"{state} not in the NICS table")


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


@pytest.mark.parametrize("state", ["Kentucky", "Texas", "District of Columbia"])
def test_a_nics_row_comes_back_intact_under_its_header(client: Client, state: str) -> None:
    hits = client.retrieve(
        f"NICS firearm background checks {state} permit handgun long gun totals", document_ids=["nics"]
    )
    holding = [
        (rank, h.chunk.chunk)
        for rank, h in enumerate(hits, start=1)
        if any(cells(line)[:1] == [state] for line in h.chunk.chunk.text.split("\n"))
    ]
    assert holding, f"no chunk with the {state} row among {[h.chunk.chunk.text[:80] for h in hits]}"
    rank, chunk = holding[0]
    lines = chunk.text.split("\n")
    assert lines[0] == "NICS Firearm Background Checks November - 2015"  # the table's caption, on every part
    lines = lines[1:]
    assert lines[0].startswith("| State / Territory |") and "Permit" in lines[0] and "Totals" in lines[0]
    assert _SEPARATOR.match(lines[1]), lines[1]
    row = next(line for line in lines if cells(line)[:1] == [state])
    expected = [c.replace(" ", "") for c in nics_row(state) if c.strip()]
    assert [c.replace(" ", "") for c in cells(row) if c] == expected  # every cell, in order, one line
    assert len(cells(row)) == len(cells(lines[0])), "the row has as many cells as the header"
    assert (chunk.page_start, chunk.page_end) == (1, 1)
    print(f"\n{state}: rank {rank}, chunk {chunk.chunk_index} ({len(chunk.text)} chars)")


# --- pages and columns ---------------------------------------------------------------------------

_PLAIN_LINE = re.compile(r"^[A-Za-z][A-Za-z ,;()]+[a-z,;)]$")


def column_lines(page: Any, x0: float, x1: float) -> list[str]:
    return [flat(line) for line in page.crop((x0, 0, x1, page.height)).extract_text().split("\n")]


def distinctive_lines(pages: list[int]) -> dict[str, int]:
    """For each page: two consecutive plain lines (letters only, 12+ words together, found once
    in the whole PDF) from the middle of its first column, mapped to the page pdfplumber finds
    them on."""
    found: dict[str, int] = {}
    with pdfplumber.open(FEDERAL_REGISTER) as pdf:
        whole = [flat(page.extract_text() or "") for page in pdf.pages]
        for number in pages:
            page = pdf.pages[number - 1]
            lines = column_lines(page, 0, page.width / 3 + 10)
            middle = sorted(range(len(lines) - 1), key=lambda i: abs(i - len(lines) // 2))
            for i in middle:
                pair = lines[i : i + 2]
                phrase = " ".join(pair)
                if (
                    all(_PLAIN_LINE.match(line) for line in pair)
                    and len(phrase.split()) >= 12
                    and sum(line in text for line in pair for text in whole) == 2
                ):
                    found[phrase] = number
                    break
    return found


def test_chunk_pages_are_the_pdf_pages(client: Client) -> None:
    phrases = distinctive_lines(list(range(1, 16)))  # pages 7-12 and 14 are figures with little text
    assert len(phrases) >= 8 and 13 in phrases.values(), phrases
    for phrase, page in phrases.items():
        chunks = client.chunks_with(phrase, "federal-register")
        assert chunks, f"no retrieved chunk holds {phrase!r} (page {page})"
        for chunk in chunks:  # a chunk may run on over a page break, not further
            assert chunk.page_start <= page <= chunk.page_end <= chunk.page_start + 1, (
                phrase,
                page,
                chunk.page_start,
                chunk.page_end,
            )
    print(f"\n{len(phrases)} phrases on pages {sorted(phrases.values())} found in chunks of those pages")


# Page 2 of the Federal Register notice: three columns. Each phrase wraps over lines of one
# column, so it is found as one run of text only when the column's lines are read together.
COLUMNS_PAGE = 2
COLUMN_PHRASES = (
    (1, "Hatta International Airport in Jakarta, Indonesia, resulting in 189 fatalities"),
    (1, "These effects include stall warning activation, airspeed disagree alert, and"),
    (2, "the flightcrew’s ability to accomplish continued safe flight and landing"),
    (2, "eliminate this unsafe condition with a software revision to the flight control computers"),
    (3, "and the Ethiopian Civil Aviation Authority (ECAA)"),
)


def column_of(phrase: str) -> int:
    """The column (1-3) of page 2 whose own text (read column by column) holds the phrase."""
    with pdfplumber.open(FEDERAL_REGISTER) as pdf:
        page = pdf.pages[COLUMNS_PAGE - 1]
        thirds = [(0, 215), (215, 387), (387, page.width)]
        texts = [" ".join(column_lines(page, a, b)) for a, b in thirds]
    holding = [k + 1 for k, text in enumerate(texts) if phrase in text]
    assert len(holding) == 1, (phrase, holding)
    return holding[0]


def test_the_three_column_page_reads_column_by_column(client: Client) -> None:
    positions: list[tuple[int, int]] = []
    for column, phrase in COLUMN_PHRASES:
        assert column_of(phrase) == column  # what the PDF holds, checked with pdfplumber
        chunks = client.chunks_with(phrase, "federal-register")
        assert chunks, f"column {column}: no retrieved chunk holds {phrase!r} as one run of text"
        first = min(chunks, key=lambda c: c.chunk_index)
        assert first.page_start <= COLUMNS_PAGE <= first.page_end
        positions.append((first.chunk_index, flat(first.text).index(phrase)))
    assert positions == sorted(positions), f"not in column order: {positions}"


# --- DOCX headings --------------------------------------------------------------------------------


def test_docx_headings_make_up_section_paths(client: Client) -> None:
    deep = client.chunks_with("Paragraph 1.2.3.1", "headers", query="Section 1.2.3 Paragraph 1.2.3.1")
    assert [list(c.section_path) for c in deep] == [["Test Document", "Section 1", "Section 1.2", "Section 1.2.3"]]
    second = client.chunks_with("Paragraph 2.1.2", "headers", query="Section 2.1 Paragraph 2.1.2")
    assert [list(c.section_path) for c in second] == [["Test Document", "Section 2", "Section 2.1"]]
    eat = client.chunks_with("I like to eat leaves", "word-sample", query="what does a duck like to eat")
    assert eat and list(eat[0].section_path) == ["Swimming in the lake", "Let’s swim!", "Let’s eat"]
    swim = client.chunks_with("Paddle about", "word-sample", query="swimming: paddle about and relax")
    assert swim and list(swim[0].section_path) == ["Swimming in the lake", "Let’s swim!"]


# --- re-ingestion and updates ----------------------------------------------------------------------


def test_reingest_changes_nothing_and_tag_updates_need_no_embedding(client: Client) -> None:
    first = client.uploads["word-sample"].document
    before = client.retrieve("ducks swimming in the lake", top_k=50, document_ids=["word-sample"])
    again = client.upload(WORD_SAMPLE, "word-sample", tags=["ducks"])
    assert again.unchanged and again.document.chunk_count == first.chunk_count
    after = client.retrieve("ducks swimming in the lake", top_k=50, document_ids=["word-sample"])
    assert [h.chunk.chunk.chunk_id for h in after] == [h.chunk.chunk.chunk_id for h in before]
    assert len(before) == first.chunk_count

    update = ingest_pb2.UpdateDocumentRequest(
        document=ingest_pb2.Document(document_id="word-sample", tags=["waterfowl", "summer"]),
        update_mask=field_mask_pb2.FieldMask(paths=["tags"]),
    )
    client.ingest.UpdateDocument(update, timeout=TIMEOUT_S)
    document = client.ingest.GetDocument(ingest_pb2.GetDocumentRequest(document_id="word-sample"), timeout=60).document
    assert list(document.tags) == ["waterfowl", "summer"] and document.chunk_count == first.chunk_count
    # BM25 (in the query service) sees the new tags once its registry follower has polled
    # (RAGRPC_REGISTRY_FOLLOW_INTERVAL_S); dense search filters in the store at once.
    gone = _eventually(lambda: client.retrieve("ducks swimming in the lake", tags=["ducks"]) == [])
    assert gone, "the old tag still matches after the follower's freshness window"
    tagged = client.retrieve("ducks swimming in the lake", top_k=50, tags=["waterfowl"])
    assert {h.chunk.chunk.chunk_id for h in tagged} == {h.chunk.chunk.chunk_id for h in before}
    assert all(list(h.chunk.chunk.tags) == ["waterfowl", "summer"] for h in tagged)
    dense_before = {h.chunk.chunk.chunk_id: h.chunk.stage_scores.dense for h in before}
    for hit in tagged:  # the same vectors: nothing was embedded again
        assert hit.chunk.stage_scores.dense == pytest.approx(dense_before[hit.chunk.chunk.chunk_id], abs=1e-6)


def _eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """True once `check()` holds, trying every 50 ms for up to timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
