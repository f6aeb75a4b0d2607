"""Bad input in request fields: hypothesis fuzzes every field of UploadDocument, IngestDocuments,
the document resource calls, Retrieve and Ask against the fake stack (in-process services over the
in-memory stores, hashing embedder).

Whatever a request holds, it succeeds or is refused with INVALID_ARGUMENT / RESOURCE_EXHAUSTED /
FAILED_PRECONDITION (NOT_FOUND for a missing document) and a message, never INTERNAL or UNKNOWN;
every call ends within its deadline; the store invariants hold after each call; the services stay
SERVING. --run-reliability runs many more examples.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf import field_mask_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragrpc.testing.invariants import check_store
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.reliability.conftest import REFUSAL_CODES, health, refusal_problem, upload
from tests.support import request_strategies as rs


class _Fuzzer:
    """Calls the services with sync stubs from a worker thread (the servers run on the test's
    event loop, which stays free while the test awaits the thread)."""

    def __init__(self, stack: Any) -> None:
        self.stack = stack
        self.ingest_channel = grpc.insecure_channel(stack.ingest_address)
        self.query_channel = grpc.insecure_channel(stack.query_address)
        self.ingest = ingest_pb2_grpc.IngestServiceStub(self.ingest_channel)
        self.query = retrieve_pb2_grpc.RetrieveServiceStub(self.query_channel)
        self.outcomes: Counter[str] = Counter()
        self.problems: list[str] = []
        self.calls = 0
        self.slowest = 0.0

    def close(self) -> None:
        self.ingest_channel.close()
        self.query_channel.close()

    def call(
        self, name: str, fn: Callable[[], Any], allowed: frozenset[grpc.StatusCode], describe: Callable[[], str]
    ) -> Any:
        self.calls += 1
        started = time.monotonic()
        try:
            result = fn()
            self.outcomes[f"{name}:OK"] += 1
            return result
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            self.outcomes[f"{name}:{code.name}"] += 1
            problem = refusal_problem(exc, allowed)
            if problem:
                self.problems.append(f"{name}: {problem}\n    request: {describe()[:600]}")
            return None
        finally:
            self.slowest = max(self.slowest, time.monotonic() - started)

    def check_store(self, context: str) -> None:
        report = check_store(self.stack.chunks, self.stack.registry)
        if report.problems:
            self.problems.append(f"store invariants after {context}: {report.problems[:5]}")

    def report(self, title: str) -> None:
        print(f"\n=== {title}: {self.calls} calls, slowest {self.slowest:.2f}s ===")
        for key, count in sorted(self.outcomes.items()):
            print(f"  {key:40s} {count}")
        assert not self.problems, "\n".join(self.problems[:20])


_DEADLINE = 60.0
_UPLOAD_CODES = REFUSAL_CODES
_RETRIEVE_CODES = REFUSAL_CODES
_DOCUMENT_CODES = REFUSAL_CODES | {grpc.StatusCode.NOT_FOUND}


def _fuzz_ingest(fuzzer: _Fuzzer, examples: int) -> None:
    @settings(
        max_examples=examples, deadline=None, database=None, derandomize=False, suppress_health_check=list(HealthCheck)
    )
    @given(spec=rs.document_specs(), content=rs.CONTENT)
    def upload_one(spec: ingest_pb2.DocumentSpec, content: bytes) -> None:
        def request() -> Any:
            def messages():  # type: ignore[no-untyped-def]
                yield ingest_pb2.UploadDocumentRequest(header=spec)
                yield ingest_pb2.UploadDocumentRequest(data=content)

            return fuzzer.ingest.UploadDocument(messages(), timeout=_DEADLINE)

        reply = fuzzer.call("UploadDocument", request, _UPLOAD_CODES, lambda: f"{spec} content={content[:80]!r}")
        if reply is not None and reply.document.state != ingest_pb2.DOCUMENT_STATE_ACTIVE:
            fuzzer.problems.append(f"UploadDocument OK but state {reply.document.state}")
        fuzzer.check_store(f"UploadDocument {spec.document_id!r}")

    @settings(
        max_examples=max(10, examples // 4), deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(specs=st.lists(rs.document_specs(), max_size=4), contents=st.lists(rs.CONTENT, min_size=4, max_size=4))
    def batch(specs: list[ingest_pb2.DocumentSpec], contents: list[bytes]) -> None:
        pairs = zip(specs, contents, strict=False)
        request = ingest_pb2.IngestDocumentsRequest(
            documents=[ingest_pb2.InlineDocument(spec=spec, content=content) for spec, content in pairs]
        )
        events = fuzzer.call(
            "IngestDocuments",
            lambda: list(fuzzer.ingest.IngestDocuments(request, timeout=_DEADLINE)),
            _UPLOAD_CODES,
            lambda: str(request)[:600],
        )
        if events is not None:
            if not events or not events[-1].HasField("summary"):
                fuzzer.problems.append(f"IngestDocuments stream without a final summary: {events[-1:]}")
            for event in events:
                progress = event.progress
                if (
                    event.HasField("progress")
                    and progress.state == ingest_pb2.DOCUMENT_STATE_FAILED
                    and (progress.error_code not in {c.name for c in REFUSAL_CODES} or not progress.error_message)
                ):
                    fuzzer.problems.append(
                        f"IngestDocuments: document failed with {progress.error_code}: {progress.error_message[:200]}"
                    )
        fuzzer.check_store("IngestDocuments")

    upload_one()
    batch()


def _fuzz_documents(fuzzer: _Fuzzer, examples: int) -> None:
    tokens = st.one_of(
        rs.STRINGS,
        st.binary(max_size=40).map(lambda b: base64.urlsafe_b64encode(b).decode()),
        st.sampled_from(["ZGVmYXVsdC9mdXp6LWRvYy0x", "=", "====", "%%%"]),
    )

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data(), delete=st.booleans())
    def resources(data: st.DataObject, delete: bool) -> None:
        bad = rs.hostile_fields(
            data.draw,
            [
                "page_size",
                "page_token",
                "state",
                "source",
                "collection",
                "document_id",
                "paths",
                "tags",
                "metadata",
                "job_id",
            ],
        )
        page_size = rs.pick(data.draw, bad, "page_size", st.integers(0, 5), rs.INT32)
        page_token = rs.pick(data.draw, bad, "page_token", st.sampled_from(["", "ZGVmYXVsdC9mdXp6LWRvYy0x"]), tokens)
        state = rs.pick(data.draw, bad, "state", st.integers(0, 4), rs.ENUM)
        source = rs.pick(data.draw, bad, "source", st.sampled_from(["", "seed1.txt"]), rs.STRINGS)
        collection = rs.pick(data.draw, bad, "collection", st.sampled_from(["", "default"]), rs.STRINGS)
        document_id = rs.pick(
            data.draw, bad, "document_id", st.sampled_from(["fuzz-doc-0", "fuzz-doc-1", "fuzz-doc-2"]), rs.STRINGS
        )
        paths = rs.pick(
            data.draw,
            bad,
            "paths",
            st.lists(st.sampled_from(["title", "tags", "metadata"]), min_size=1, max_size=3, unique=True),
            st.lists(st.one_of(st.sampled_from(["title", "tags", "content", "state"]), rs.STRINGS), max_size=4),
        )
        tags = rs.pick(data.draw, bad, "tags", st.lists(rs.LABEL, max_size=3), st.lists(rs.STRINGS, max_size=40))
        metadata = rs.pick(
            data.draw,
            bad,
            "metadata",
            st.dictionaries(rs.LABEL, rs.LABEL, max_size=3),
            st.dictionaries(rs.STRINGS, rs.STRINGS, max_size=70),
        )
        job_id = rs.pick(data.draw, bad, "job_id", st.just("0" * 32), rs.STRINGS)
        listing = ingest_pb2.ListDocumentsRequest(
            page_size=page_size, page_token=page_token, state=state, source=source, collection=collection
        )
        fuzzer.call(
            "ListDocuments",
            lambda: fuzzer.ingest.ListDocuments(listing, timeout=_DEADLINE),
            REFUSAL_CODES,
            lambda: str(listing),
        )
        fuzzer.call(
            "GetDocument",
            lambda: fuzzer.ingest.GetDocument(
                ingest_pb2.GetDocumentRequest(document_id=document_id), timeout=_DEADLINE
            ),
            _DOCUMENT_CODES,
            lambda: document_id,
        )
        update = ingest_pb2.UpdateDocumentRequest(
            document=ingest_pb2.Document(document_id=document_id, title=source, tags=tags, metadata=metadata),
            update_mask=field_mask_pb2.FieldMask(paths=paths),
        )
        fuzzer.call(
            "UpdateDocument",
            lambda: fuzzer.ingest.UpdateDocument(update, timeout=_DEADLINE),
            _DOCUMENT_CODES,
            lambda: str(update),
        )
        fuzzer.call(
            "GetIngestJob",
            lambda: fuzzer.ingest.GetIngestJob(ingest_pb2.GetIngestJobRequest(job_id=job_id), timeout=_DEADLINE),
            _DOCUMENT_CODES,
            lambda: job_id,
        )
        if delete:
            fuzzer.call(
                "DeleteDocument",
                lambda: fuzzer.ingest.DeleteDocument(
                    ingest_pb2.DeleteDocumentRequest(document_id=document_id), timeout=_DEADLINE
                ),
                _DOCUMENT_CODES,
                lambda: document_id,
            )
        fuzzer.check_store("document resource calls")

    resources()


def _fuzz_queries(fuzzer: _Fuzzer, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(query=rs.QUERIES, options=rs.retrieval_options())
    def retrieve_one(query: str, options: retrieve_pb2.RetrievalOptions) -> None:
        request = retrieve_pb2.RetrieveRequest(query=query, options=options)
        responses = fuzzer.call(
            "Retrieve",
            lambda: list(fuzzer.query.Retrieve(request, timeout=_DEADLINE)),
            _RETRIEVE_CODES,
            lambda: str(request),
        )
        if responses is not None and (not responses or not responses[-1].HasField("summary")):
            fuzzer.problems.append(f"Retrieve OK without a final summary: {request}")

    @settings(
        max_examples=max(10, examples // 3), deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(data=st.data())
    def ask_one(data: st.DataObject) -> None:
        part = data.draw(st.sampled_from(["none", "none", "query", "options", "ask"]))
        query = data.draw(rs.QUERIES if part == "query" else rs.WORDS)
        options = data.draw(rs.retrieval_options(hostile=part == "options"))
        bad = (
            rs.hostile_fields(data.draw, ["template", "budget", "answer_tokens", "history", "temperature"])
            if part == "ask"
            else set()
        )
        request = retrieve_pb2.AskRequest(
            query=query,
            options=options,
            template=rs.pick(
                data.draw,
                bad,
                "template",
                st.sampled_from(["", "default", "analytical", "conversational", "creative"]),
                rs.STRINGS,
            ),
            token_budget=rs.pick(data.draw, bad, "budget", st.sampled_from([0, 300, 4000]), rs.INT32),
            max_answer_tokens=rs.pick(data.draw, bad, "answer_tokens", st.sampled_from([0, 1, 64, 512]), rs.INT32),
            history=[
                retrieve_pb2.ConversationTurn(role=role, content=content)
                for role, content in rs.pick(
                    data.draw,
                    bad,
                    "history",
                    st.lists(st.tuples(st.integers(1, 2), rs.WORDS), max_size=3),
                    st.lists(st.tuples(rs.ENUM, rs.STRINGS), max_size=3),
                )
            ],
        )
        if data.draw(st.booleans()):
            request.temperature = rs.pick(data.draw, bad, "temperature", st.floats(0.0, 2.0), rs.FLOATS)
        events = fuzzer.call(
            "Ask", lambda: list(fuzzer.query.Ask(request, timeout=_DEADLINE)), _RETRIEVE_CODES, lambda: str(request)
        )
        if events is not None and (not events or not events[-1].HasField("final")):
            fuzzer.problems.append(f"Ask OK without a final event: {request}")

    retrieve_one()
    ask_one()


def _long_echo_checks(fuzzer: _Fuzzer) -> None:
    """Requests whose error messages could echo a huge value back: the status travels in trailing
    metadata (8 KiB on clients by default), so an unbounded echo turns a clean refusal into a
    client-side RESOURCE_EXHAUSTED without details (found by the long fuzzing run)."""
    huge = ["x" * 5000, "🦆" * 3000, "é" * 6000]
    for value in huge:
        update = ingest_pb2.UpdateDocumentRequest(
            document=ingest_pb2.Document(document_id="fuzz-doc-1"),
            update_mask=field_mask_pb2.FieldMask(paths=["state", value]),
        )
        fuzzer.call(
            "UpdateDocument",
            lambda u=update: fuzzer.ingest.UpdateDocument(u, timeout=_DEADLINE),
            _DOCUMENT_CODES,
            lambda: "update_mask with a huge path",
        )

        def upload_with(media_type: str) -> Any:
            def messages():  # type: ignore[no-untyped-def]
                yield ingest_pb2.UploadDocumentRequest(
                    header=ingest_pb2.DocumentSpec(file_name="a.bin", media_type=media_type)
                )
                yield ingest_pb2.UploadDocumentRequest(data=b"some words")

            return fuzzer.ingest.UploadDocument(messages(), timeout=_DEADLINE)

        fuzzer.call(
            "UploadDocument", lambda v=value: upload_with("application/" + v), _UPLOAD_CODES, lambda: "huge media type"
        )
        request = retrieve_pb2.RetrieveRequest(
            query="grebes",
            options=retrieve_pb2.RetrievalOptions(
                filter=retrieve_pb2.MetadataFilter(tags=[value], sources=[value], document_ids=[value])
            ),
        )
        fuzzer.call(
            "Retrieve",
            lambda r=request: list(fuzzer.query.Retrieve(r, timeout=_DEADLINE)),
            _RETRIEVE_CODES,
            lambda: "huge filter values",
        )


async def _seed_documents(stack: Any) -> None:
    seeds = [
        "Grebes dive for fish in deep lakes.",
        "Coots eat weeds near the reeds.",
        "Terns fly long distances over the sea.",
    ]
    for index, text in enumerate(seeds):
        spec = ingest_pb2.DocumentSpec(
            file_name=f"seed{index}.txt",
            document_id=f"fuzz-doc-{index}",
            tags=["seed", f"t{index}"],
            source=f'src "{index}" \\',
        )
        await asyncio.to_thread(upload, stack.ingest_address, spec, text.encode() * 5, timeout_s=60)


async def _fuzz(fake_stack: Any, ingest_examples: int, document_examples: int, query_examples: int) -> None:
    await _seed_documents(fake_stack)
    fuzzer = _Fuzzer(fake_stack)
    started = time.monotonic()
    try:
        await asyncio.to_thread(_long_echo_checks, fuzzer)
        await asyncio.to_thread(_fuzz_ingest, fuzzer, ingest_examples)
        await asyncio.to_thread(_fuzz_documents, fuzzer, document_examples)
        await asyncio.to_thread(_fuzz_queries, fuzzer, query_examples)
    finally:
        fuzzer.close()
    print(f"\nfuzzing took {time.monotonic() - started:.1f}s")
    for address in (fake_stack.ingest_address, fake_stack.query_address):
        assert await asyncio.to_thread(health, address, 10.0) == "SERVING", address
    fuzzer.report("hypothesis fuzzing of request fields (outcomes by RPC and code)")


async def test_fuzz_request_fields(fake_stack) -> None:  # type: ignore[no-untyped-def]
    await _fuzz(fake_stack, ingest_examples=60, document_examples=40, query_examples=80)


@pytest.mark.reliability
@pytest.mark.timeout(1800)
async def test_fuzz_request_fields_long(fake_stack) -> None:  # type: ignore[no-untyped-def]
    await _fuzz(fake_stack, ingest_examples=1500, document_examples=800, query_examples=2000)
