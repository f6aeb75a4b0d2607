"""A real Milvus server: Milvus 2.3.5 standalone from PyPI (`pip install milvus==2.3.5`, which
ships the server binary; no Docker). It has no BM25 function and no sparse vectors, so it tests
that ragrpc runs on what such a server supports and refuses what it lacks, clearly, at start:

  * the writer creates the collections without the BM25 function (CollectionSetup detects it);
  * ingestion through the pipeline (gRPC), dense retrieval, `rank_bm25` sparse retrieval, hybrid;
  * filters: document ids, sources with quotes and backslashes, tags (ARRAY), media types, dates;
  * UpdateDocument (chunk upserts), replacement (generations), deletes;
  * `RAGRPC_SPARSE_BACKEND=milvus_bm25` is refused with FAILED_PRECONDITION, in-process and when
    the query service process starts.

The test SKIPS (printing why) when the `milvus` package is not installed. The server opens
ports on 0.0.0.0 besides the proxy (all chosen free here) and leaves a child behind on SIGTERM:
its whole process group is killed at the end.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import field_mask_pb2, timestamp_pb2

from ragrpc import errors
from ragrpc.testing.invariants import check_store
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.reliability.conftest import ServiceProcess, free_port, print_table, service_env
from tests.support import hostile_inputs as hi
from tests.support.async_calls import eventually, retrieve_chunks, upload_document
from tests.support.milvus235 import Milvus235, running_or_skipped

REAL_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def milvus235(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Milvus235]:
    with running_or_skipped(tmp_path_factory.mktemp("milvus235"), "test_milvus_235") as server:
        yield server


HERONS = (
    b"# Herons\n\nGrey herons stand still in shallow water and spear fish with their bills.\n\n"
    b"## Nesting\n\nHerons nest in colonies called heronries, high in tall trees near lakes.\n"
)
HERONS_V2 = (
    b"# Herons\n\nRevised: herons also hunt voles and frogs in wet meadows at dawn.\n\n"
    b"## Flight\n\nIn flight a heron folds its neck back into an S shape.\n"
)
STOCKS = b"The stock market fell sharply on Tuesday after the central bank raised interest rates again."
QUOTED_SOURCE = 'C:\\notes\\birds "grey" heron\'s.md'  # backslashes, double and single quotes


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_pipeline_against_milvus_235(milvus235: Milvus235, settings) -> None:  # type: ignore[no-untyped-def]
    from ingest_service.app import build_components as build_ingest
    from ingest_service.app import start_ingest_server
    from query_service.app import build_components as build_query
    from query_service.app import build_sparse, start_query_server
    from query_service.registry_follower import RegistryFollower
    from ragrpc.store import filters as f
    from ragrpc.store import schema as s
    from ragrpc.store.factory import open_milvus_stores
    from ragrpc.testing import HashingEmbedder

    embedder = HashingEmbedder()
    config = dataclasses.replace(  # dense search by the server's own index (auto would hold this small collection)
        settings,
        milvus_uri=milvus235.uri,
        collection_prefix="m235",
        sparse_backend="rank_bm25",
        index_type="HNSW",
        dense_search="store",
    )
    started = time.monotonic()
    stores = open_milvus_stores(config, model_id=embedder.model_id, dimension=embedder.dimension, writer=True)
    fields = [fld["name"] for fld in stores.connection.call(lambda c: c.describe_collection("m235_chunks"))["fields"]]
    print(
        f"collections ready in {time.monotonic() - started:.1f}s; BM25 function supported: "
        f"{stores.setup.bm25_supported}; chunk fields: {fields}"
    )
    assert stores.setup.bm25_supported is False and s.SPARSE not in fields
    # no BM25 function, but the analysed terms are stored for the rank_bm25 index to load (schema 2)
    assert stores.setup.bm25_analysed and s.BM25_TEXT in fields

    with pytest.raises(errors.PreconditionError) as refused:
        build_sparse(
            dataclasses.replace(config, sparse_backend="milvus_bm25"), stores.chunks, RegistryFollower(stores.registry)
        )
    assert errors.status_name(refused.value) == "FAILED_PRECONDITION" and "rank_bm25" in refused.value.message
    print(f"milvus_bm25 refused in-process: FAILED_PRECONDITION: {refused.value.message}")

    ingest = build_ingest(config, embedder, stores.chunks, stores.registry)
    query = build_query(config, embedder, stores.chunks, stores.registry)
    ingest_server = await start_ingest_server(config, ingest, "127.0.0.1:0")
    query_server = await start_query_server(config, query, "127.0.0.1:0")
    rows: list[tuple[str, str]] = []
    try:
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{ingest_server.port}") as ingest_channel,
            grpc.aio.insecure_channel(f"127.0.0.1:{query_server.port}") as query_channel,
        ):
            ingest_stub = ingest_pb2_grpc.IngestServiceStub(ingest_channel)
            query_stub = retrieve_pb2_grpc.RetrieveServiceStub(query_channel)
            herons = await upload_document(
                ingest_stub,
                HERONS,
                file_name="herons.md",
                document_id="herons",
                source=QUOTED_SOURCE,
                tags=["birds", 'quote"tag', "back\\slash"],
                metadata={"k": 'v "x"'},
            )
            await upload_document(ingest_stub, STOCKS, file_name="stocks.txt", document_id="stocks", tags=["finance"])
            await upload_document(
                ingest_stub,
                hi.minimal_pdf(["Kingfishers dive from branches into clear streams."] * 3),
                file_name="kingfisher.pdf",
                document_id="kingfisher",
                tags=["birds"],
            )
            await upload_document(
                ingest_stub,
                hi.small_docx("Cormorants dry their wings on rocks after diving."),
                file_name="cormorant.docx",
                document_id="cormorant",
                tags=["birds"],
            )
            assert herons.state == ingest_pb2.DOCUMENT_STATE_ACTIVE and herons.chunk_count >= 1
            rows.append(("ingest md/txt/pdf/docx", "4 documents ACTIVE"))

            async def top(query_text: str, **options: Any) -> list[str]:
                chunks, _ = await retrieve_chunks(query_stub, query_text, **options)
                return [c.chunk.document_id for c in chunks]

            dense, summary = await retrieve_chunks(
                query_stub, "where do herons nest", mode=retrieve_pb2.RETRIEVAL_MODE_DENSE
            )
            assert dense and dense[0].chunk.document_id == "herons" and summary.dense_candidates > 0
            rows.append(("dense (HNSW, COSINE)", f"top hit herons, score {dense[0].score:.3f}"))
            sparse, summary = await retrieve_chunks(
                query_stub, "heronries colonies", mode=retrieve_pb2.RETRIEVAL_MODE_SPARSE
            )
            assert sparse and sparse[0].chunk.document_id == "herons" and summary.sparse_backend == "rank_bm25"
            stored = [
                c
                for page in stores.chunks.scan_chunks(f.eq(s.DOCUMENT_ID, "herons"), with_bm25_terms=True)
                for c in page
            ]
            assert stored and all(c.bm25_terms and "heron" in c.bm25_terms for c in stored)
            rows.append(("sparse (rank_bm25)", f"top hit herons, backend {summary.sparse_backend}"))
            hybrid, summary = await retrieve_chunks(query_stub, "interest rates stock market")
            assert hybrid and hybrid[0].chunk.document_id == "stocks"
            rows.append(
                (
                    "hybrid (RRF)",
                    f"top hit stocks, {summary.dense_candidates} dense + {summary.sparse_candidates} sparse candidates",
                )
            )

            only = await top("birds", filter=retrieve_pb2.MetadataFilter(sources=[QUOTED_SOURCE]))
            assert set(only) == {"herons"}, only
            assert set(await top("birds", filter=retrieve_pb2.MetadataFilter(tags=['quote"tag']))) == {"herons"}
            assert set(await top("birds", filter=retrieve_pb2.MetadataFilter(tags=["back\\slash"]))) == {"herons"}
            assert set(await top("birds", top_k=20, filter=retrieve_pb2.MetadataFilter(tags=["birds"]))) == {
                "herons",
                "kingfisher",
                "cormorant",
            }
            assert set(await top("market", filter=retrieve_pb2.MetadataFilter(document_ids=["stocks", 'x"y']))) == {
                "stocks"
            }
            assert set(await top("birds", filter=retrieve_pb2.MetadataFilter(media_types=["application/pdf"]))) == {
                "kingfisher"
            }
            future = timestamp_pb2.Timestamp(seconds=4_000_000_000)
            assert await top("birds", filter=retrieve_pb2.MetadataFilter(document_time_after=future)) == []
            rows.append(("filters", "source with \\ \" ', tags ARRAY (quote, backslash), ids, media type, date"))

            replaced = await upload_document(
                ingest_stub,
                HERONS_V2,
                file_name="herons.md",
                document_id="herons",
                source=QUOTED_SOURCE,
                tags=["birds"],
            )

            async def heron_texts() -> list[str]:
                hits, _ = await retrieve_chunks(
                    query_stub, "herons", top_k=20, filter=retrieve_pb2.MetadataFilter(document_ids=["herons"])
                )
                return [c.chunk.text for c in hits]

            async def new_version_shown() -> bool:
                texts = await heron_texts()
                return bool(texts) and all("heronries" not in t for t in texts) and any("voles" in t for t in texts)

            # queries show the old version until the query service's follower polls (never a mix of both)
            assert await eventually(new_version_shown, True), await heron_texts()
            record = stores.registry.get("default", "herons")
            assert record is not None

            async def stored_generations() -> set[str]:
                return {c.generation for c in stores.chunks.query_chunks(f.eq(s.DOCUMENT_ID, "herons"), 100)}

            # the old generation's delete reaches this Session-consistent read a time tick later
            generations = await eventually(stored_generations, {record.generation})
            assert record is not None and generations == {record.generation}, (generations, record)
            rows.append(("replacement", f"{replaced.chunk_count} new chunks, one generation stored"))

            deleted = await ingest_stub.DeleteDocument(
                ingest_pb2.DeleteDocumentRequest(document_id="stocks"), timeout=60
            )

            async def stocks_hits() -> list[str]:
                return await top("market", filter=retrieve_pb2.MetadataFilter(document_ids=["stocks"]))

            assert await eventually(stocks_hits, []) == []  # gone once the query service's follower polls
            assert stores.chunks.count_chunks(f.eq(s.DOCUMENT_ID, "stocks")) == 0
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await ingest_stub.GetDocument(ingest_pb2.GetDocumentRequest(document_id="stocks"), timeout=30)
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
            rows.append(("delete", f"{deleted.chunks_deleted} chunks deleted, NOT_FOUND afterwards"))
        from query_service.dense import dense_search_mode

        held = stores.chunks.count_chunks(f.gte(s.CHUNK_INDEX, 0))
        assert held > 1
        assert dense_search_mode("auto", stores.chunks, held) == "in_process"  # a collection this small is held
        assert dense_search_mode("auto", stores.chunks, held - 1) == "store"  # one chunk more: the server's index
        assert dense_search_mode("auto", stores.chunks, 0) == "store"
        rows.append(("dense search auto", f"in_process at {held} chunks (<= the limit), store above it"))
    finally:
        await ingest_server.stop(0)
        await query_server.stop(0)
        ingest.shutdown()
        query.executor.shutdown(wait=False, cancel_futures=True)
    report = check_store(stores.chunks, stores.registry)
    rows.append(("store invariants", report.summary()))
    print_table("ragrpc against Milvus 2.3.5 standalone", rows, ("path", "result"))
    assert not report.problems, report.problems


@pytest.mark.reliability
@pytest.mark.timeout(900)
def test_query_service_refuses_milvus_bm25_at_start(milvus235: Milvus235, tmp_path: Path) -> None:
    """The query service process, started against 2.3.5 with the default RAGRPC_SPARSE_BACKEND
    (milvus_bm25), stops at start with a FAILED_PRECONDITION-style message naming the fix. (It
    loads the real model first, ~30-50 s here: --run-reliability only; the regular suite checks
    the same refusal in-process in test_pipeline_against_milvus_235.)"""
    from ragrpc.config import Settings
    from ragrpc.store.factory import open_milvus_stores

    config = dataclasses.replace(Settings(), milvus_uri=milvus235.uri, collection_prefix="m235real")
    open_milvus_stores(config, model_id=REAL_MODEL_ID, dimension=384, writer=True).connection.reset()
    env = service_env(
        {
            "RAGRPC_MILVUS_URI": milvus235.uri,
            "RAGRPC_COLLECTION_PREFIX": "m235real",
            "RAGRPC_SPARSE_BACKEND": "milvus_bm25",
            "RAGRPC_QUERY_PORT": str(free_port()),
        }
    )
    service = ServiceProcess("query-milvus_bm25", "query_service", int(env["RAGRPC_QUERY_PORT"]), env, tmp_path)
    started = time.monotonic()
    service.spawn()
    assert service.process is not None
    try:
        code = service.process.wait(timeout=300)
    except subprocess.TimeoutExpired:
        service.kill()
        raise AssertionError(f"the query service did not refuse to start:\n{service.log_tail()}") from None
    log = service.log_text()
    last = [line for line in log.splitlines() if "milvus_bm25" in line]
    print(
        f"\nquery service with RAGRPC_SPARSE_BACKEND=milvus_bm25 exited with {code} after "
        f"{time.monotonic() - started:.1f}s; it said: {last[-1] if last else log[-500:]}"
    )
    assert code != 0
    assert "PreconditionError" in log or "FAILED_PRECONDITION" in log, log[-2000:]
    assert "rank_bm25" in log and "BM25" in log


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_update_document_against_milvus_235(milvus235: Milvus235, settings) -> None:  # type: ignore[no-untyped-def]
    """UpdateDocument rewrites the chunks' tags with an upsert: the document must stay retrievable
    (under its tenant) and the new tag must be filterable."""
    from ingest_service.app import build_components as build_ingest
    from ingest_service.app import start_ingest_server
    from query_service.app import build_components as build_query
    from query_service.app import start_query_server
    from ragrpc.store import filters as f
    from ragrpc.store import schema as s
    from ragrpc.store.factory import open_milvus_stores
    from ragrpc.testing import HashingEmbedder

    embedder = HashingEmbedder()
    config = dataclasses.replace(  # the server's own dense search (auto would hold this small collection)
        settings,
        milvus_uri=milvus235.uri,
        collection_prefix="m235upd",
        sparse_backend="rank_bm25",
        dense_search="store",
    )
    stores = open_milvus_stores(config, model_id=embedder.model_id, dimension=embedder.dimension, writer=True)
    ingest = build_ingest(config, embedder, stores.chunks, stores.registry)
    query = build_query(config, embedder, stores.chunks, stores.registry)
    ingest_server = await start_ingest_server(config, ingest, "127.0.0.1:0")
    query_server = await start_query_server(config, query, "127.0.0.1:0")
    try:
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{ingest_server.port}") as ingest_channel,
            grpc.aio.insecure_channel(f"127.0.0.1:{query_server.port}") as query_channel,
        ):
            ingest_stub = ingest_pb2_grpc.IngestServiceStub(ingest_channel)
            query_stub = retrieve_pb2_grpc.RetrieveServiceStub(query_channel)
            text = " ".join(
                f"Kingfisher note {n}: kingfishers dive from branches into clear streams." for n in range(40)
            )
            uploaded = await upload_document(
                ingest_stub,
                text.encode(),
                file_name="kingfisher.txt",
                document_id="kingfisher",
                tags=["birds"],
                chunking=ingest_pb2.ChunkingOptions(
                    strategy=ingest_pb2.CHUNKING_STRATEGY_FIXED_TOKENS, chunk_size_tokens=24, chunk_overlap_tokens=4
                ),
            )
            assert uploaded.chunk_count >= 10, uploaded.chunk_count  # many chunk ids: no lucky routing
            before = sorted({c.chunk.document_id for c in (await retrieve_chunks(query_stub, "kingfishers"))[0]})
            await ingest_stub.UpdateDocument(
                ingest_pb2.UpdateDocumentRequest(
                    document=ingest_pb2.Document(document_id="kingfisher", tags=["birds", "retagged"]),
                    update_mask=field_mask_pb2.FieldMask(paths=["tags"]),
                ),
                timeout=60,
            )
            after = sorted(
                {
                    c.chunk.document_id
                    for c in (await retrieve_chunks(query_stub, "kingfishers", mode=retrieve_pb2.RETRIEVAL_MODE_DENSE))[
                        0
                    ]
                }
            )

            async def retagged() -> list[str]:
                hits, _ = await retrieve_chunks(
                    query_stub,
                    "kingfishers",
                    mode=retrieve_pb2.RETRIEVAL_MODE_DENSE,
                    filter=retrieve_pb2.MetadataFilter(tags=["retagged"]),
                )
                return sorted({c.chunk.document_id for c in hits})

            # The chunks collection is Session-consistent: the query service's search sees the rewritten
            # chunks a time tick after the ingest service wrote them (a bounded wait, not a retry of failures).
            tagged = await eventually(retagged, ["kingfisher"])
    finally:
        await ingest_server.stop(0)
        await query_server.stop(0)
        ingest.shutdown()
        query.executor.shutdown(wait=False, cancel_futures=True)
    by_tenant = stores.chunks.count_chunks(f.eq(s.TENANT, "default"))
    by_document = stores.chunks.count_chunks(f.eq(s.DOCUMENT_ID, "kingfisher"))
    print(
        f"\nbefore UpdateDocument: dense+sparse hits {before}; after: dense hits {after}, with the new tag "
        f'{tagged}; chunks found by `tenant == "default"`: {by_tenant}, by `document_id`: {by_document}'
    )
    assert before == ["kingfisher"]
    assert by_tenant == by_document, (
        f'after UpdateDocument\'s upsert, `tenant == "default"` finds {by_tenant} of the {by_document} chunks '
        "`document_id` finds: on Milvus 2.3.5 an upsert into the partition-key (tenant) collection lands the rows "
        "where partition-key pruning does not look, so every query (always tenant-filtered) loses the document"
    )
    assert after == ["kingfisher"] and tagged == ["kingfisher"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_metadata_filters_against_milvus_235(milvus235: Milvus235, settings) -> None:  # type: ignore[no-untyped-def]
    """Declared metadata keys as VARCHAR fields of their own, exact matches in search, query and scan (the
    server's query iterator), and the deprecated fields' JSON filter on a collection created before
    (tests/support/metadata_filter_checks.py, which milvus-lite runs too)."""
    from tests.support.metadata_filter_checks import check_metadata_filters

    rows = check_metadata_filters(dataclasses.replace(settings, milvus_uri=milvus235.uri), prefix="m235meta")
    print_table("generic metadata filters on Milvus 2.3.5", rows, ("check", "result"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_writers_reads_by_key_see_its_own_writes_on_milvus_235(milvus235: Milvus235, settings) -> None:  # type: ignore[no-untyped-def]
    """On the server whose Session reads wait for a time tick: each read by key names only its key's last
    write (ragrpc.store.key_write_times) and sees it: rewrites, the deleting mark, deletes (2.3.5 answers a
    delete without its timestamp: the key is read Strong), rows written before the writer followed the
    registry, and a write applied whose answer was lost (read Strong)."""
    from ragrpc.testing import HashingEmbedder
    from tests.support.key_write_checks import check_the_writers_reads_by_key

    embedder = HashingEmbedder()
    levels = check_the_writers_reads_by_key(
        dataclasses.replace(
            settings,
            milvus_uri=milvus235.uri,
            collection_prefix="m235keys",
            sparse_backend="rank_bm25",
            index_type="HNSW",
        ),
        embedder.model_id,
        embedder.dimension,
        rounds=10,
    )
    print_table("the writer's reads by key on Milvus 2.3.5", sorted(levels.items()), ("consistency", "reads"))
    # a delete answers without a timestamp on 2.3.5: a deleted key is read Strong (10 rounds, and the lost answer)
    assert levels["Customized"] >= 30 and levels["Strong"] >= 11, levels
