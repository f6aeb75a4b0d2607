"""Snapshots of the in-process indexes (query_service.index_snapshot): a round trip answers exactly as
before, the restored indexes take updates (without copying their memory-mapped arrays), and a
snapshot that is missing, corrupt, truncated, of another identity, too old or of other indexes is
refused with the reason logged."""

from __future__ import annotations

import gc
import json
import logging
import random
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from query_service.coarse_partitions import PartitionPolicy
from query_service.dense_index import InProcessDenseIndex, VectorChunk
from query_service.index_snapshot import (
    ARRAYS,
    CURRENT,
    FOLLOWER,
    MANIFEST,
    IndexSnapshots,
    capture_indexes,
    load_snapshot,
    save_snapshot,
    verify_snapshot,
)
from query_service.index_sync import APPLIED_CODEC
from query_service.packed_table import PackedTable
from query_service.ragged_arrays import nest_arrays
from query_service.registry_follower import VIEW_CODEC, DocumentView
from query_service.sparse_index import Bm25Parameters, IndexedChunk, InProcessBm25Index
from ragrpc.store import schema as s
from ragrpc.store.request_filter import filter_from_request

IDENTITY = {"model": "bge-small", "dimension": 8, "schema": 2, "analyzer": "whitespace", "bm25": [1.5, 0.75]}
DIMENSION = 8
NO_AUTOMATIC_COMPACTION = {"merge_min_chunks": 10**6, "compaction_min_dead": 10**6}
WORDS = [f"w{i}" for i in range(400)]


class WhitespaceAnalyzer:
    def analyze(self, text: str) -> list[str]:
        return text.split()


def _document(rng: random.Random, tenant: str, number: int, version: int = 0) -> list[IndexedChunk]:
    chunks = []
    for k in range(rng.randint(0, 4)):
        text = " ".join(rng.choice(WORDS[: 50 + number % 300]) for _ in range(rng.randint(1, 25)))
        attrs = {
            s.COLLECTION: f"c{number % 3}",
            s.SOURCE: f"/data/{number}.pdf",
            s.TAGS: ("odd",) if number % 2 else (),
            s.PAGE_START: k + 1,
            s.DOC_DATE: 1_700_000_000 + number,
            s.METADATA: {"organization": f"org{number % 5}"},
            "meta_department": "sales" if number % 4 else "legal",
        }
        chunks.append(IndexedChunk(f"{tenant}-d{number}-v{version}-{k}", text, attrs))
    return chunks


def _vectors(chunks: list[IndexedChunk]) -> list[VectorChunk]:
    out = []
    for chunk in chunks:
        vector = np.random.default_rng(zlib.crc32(chunk.chunk_id.encode())).standard_normal(DIMENSION)
        out.append(VectorChunk(chunk.chunk_id, vector / np.linalg.norm(vector), chunk.attrs))
    return out


def _indexes(
    seed: int = 1, dense_options: dict | None = None
) -> tuple[InProcessBm25Index, InProcessDenseIndex, random.Random]:
    """Two tenants; compact, recent and dead slots at once (compactions only when asked)."""
    rng = random.Random(seed)
    bm25 = InProcessBm25Index(WhitespaceAnalyzer(), **NO_AUTOMATIC_COMPACTION)
    dense = InProcessDenseIndex(DIMENSION, **NO_AUTOMATIC_COMPACTION, **(dense_options or {}))
    for tenant in ("acme", "globex"):
        for number in range(300):
            chunks = _document(rng, tenant, number)
            bm25.replace_document(tenant, f"d{number}", chunks)
            dense.replace_document(tenant, f"d{number}", _vectors(chunks))
            if number == 200:
                bm25.compact()
                dense.compact()
    for number in range(0, 300, 7):
        bm25.remove_document("acme", f"d{number}")
        dense.remove_document("acme", f"d{number}")
    return bm25, dense, rng


QUERIES = ["w1 w2 w3", "w10 w10 w40 w200", "w7", "w299 w0 w13 w5 w8"]
FILTERS = [
    None,
    filter_from_request("acme", "c1").matches,
    filter_from_request("acme", tags=["odd"]).matches,
    lambda attrs: attrs["meta_department"] == "legal" and attrs[s.METADATA]["organization"] == "org0",
]


def _answers(bm25: InProcessBm25Index, dense: InProcessDenseIndex) -> list:
    answers: list = []
    for tenant in ("acme", "globex", "nobody"):
        for query in QUERIES:
            for allow in FILTERS:
                answers.append(bm25.search(query, 15, tenant=tenant, allow=allow))
            answers.append(bm25.search(query, 5, tenant=tenant, document_ids=["d3", "d250", "d7", "missing"]))
        vector = np.ones(DIMENSION) / np.sqrt(DIMENSION)
        for allow in FILTERS:
            answers.append(dense.search(vector, 10, tenant=tenant, allow=allow))
        answers.append(dense.search(vector, 5, tenant=tenant, document_ids=["d3", "d250"]))
        answers.append((bm25.chunk_count(tenant), bm25.document_count(tenant), dense.chunk_count(tenant)))
    return answers


def _assert_same_answers(got: list, expected: list) -> None:
    """The same hits in the same order, their scores equal to float32 precision: a compaction lays the held
    vectors out anew, and the BLAS kernel a matrix product takes (by the CPU's features, the matrix's shape and
    alignment) may then round the last bit of a dot product differently. Counts are equal exactly."""
    assert len(got) == len(expected)
    for number, (g, e) in enumerate(zip(got, expected, strict=True)):
        if isinstance(e, list):
            assert [hit[0] for hit in g] == [hit[0] for hit in e], (number, g, e)
            assert np.allclose([hit[1] for hit in g], [hit[1] for hit in e], rtol=1e-5, atol=1e-6), (number, g, e)
        else:
            assert g == e, (number, g, e)


def _load(directory: Path, **changes):  # type: ignore[no-untyped-def]
    options = {"identity": IDENTITY, "max_age_s": 3600.0, "analyzer": WhitespaceAnalyzer(), "dense": True}
    return load_snapshot(directory, **{**options, **changes})


def test_a_round_trip_answers_exactly_as_before_and_carries_the_follower_state(tmp_path: Path) -> None:
    bm25, dense, _ = _indexes()
    before = _answers(bm25, dense)
    state = {"documents": {"acme/d1": "g1"}, "cursor": [3, "x"]}
    path = save_snapshot(tmp_path, identity=IDENTITY, follower_state=state, watermark=1234, bm25=bm25, dense=dense)
    assert (tmp_path / CURRENT).read_text().strip() == path.name
    _assert_same_answers(_answers(bm25, dense), before)  # the compaction before writing changes no answer
    loaded = _load(tmp_path)
    assert loaded is not None and loaded.path == path
    assert loaded.follower_state == state and loaded.watermark == 1234 and time.time() - loaded.created_at < 60
    assert loaded.bm25 is not None and loaded.dense is not None
    _assert_same_answers(_answers(loaded.bm25, loaded.dense), before)
    postings = loaded.bm25._scopes["acme"].postings  # noqa: SLF001 - memory-mapped, read only
    assert not postings.slots.flags.writeable and not postings.slots.flags.owndata
    assert not loaded.dense._scopes["acme"].compact.flags.writeable  # noqa: SLF001


def test_held_vectors_laid_out_by_coarse_partitions_round_trip_and_their_absence_refuses_the_snapshot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tenant the partition policy wants partitioned: carried with its layout; a snapshot written without
    partitions is not used (the full load lays them out and writes a new one)."""
    bm25, plain, _ = _indexes()
    policy = {"partitions": PartitionPolicy(min_chunks=100, probe_percent=100)}  # every list: answers exact
    _, dense, _ = _indexes(dense_options=policy)  # the same chunks, compacted once with partitions
    before = _answers(bm25, plain)
    save_snapshot(tmp_path, identity=IDENTITY, follower_state={}, watermark=1, bm25=bm25, dense=dense)
    _assert_same_answers(_answers(bm25, dense), before)
    loaded = _load(tmp_path, dense_options=policy)
    assert loaded is not None and loaded.dense is not None
    assert dense._scopes["acme"].partitions is not None  # noqa: SLF001 - laid out by the compaction at d200
    assert loaded.dense._scopes["acme"].partitions is not None  # noqa: SLF001
    _assert_same_answers(_answers(loaded.bm25, loaded.dense), before)
    save_snapshot(tmp_path, identity=IDENTITY, follower_state={}, watermark=2, bm25=bm25, dense=plain)
    _refused(tmp_path, caplog, "have no coarse partitions", dense_options=policy)
    assert "corrupt" not in caplog.text


def test_the_restored_indexes_take_updates_like_the_originals(tmp_path: Path) -> None:
    bm25, dense, rng = _indexes(seed=2)
    save_snapshot(tmp_path, identity=IDENTITY, follower_state=None, watermark=1, bm25=bm25, dense=dense)
    options = NO_AUTOMATIC_COMPACTION  # as the originals: the same layout, so float32 dot products agree bit for bit
    loaded = _load(tmp_path, bm25_options=options, dense_options=options)
    assert loaded is not None and loaded.bm25 is not None and loaded.dense is not None
    mapped = loaded.bm25._scopes["acme"].postings.slots  # noqa: SLF001
    mapped_vectors = loaded.dense._scopes["acme"].compact  # noqa: SLF001
    for number in [*range(0, 300, 5), *range(300, 330)]:  # replacements of compact documents, new ones
        chunks = _document(rng, "acme", number, version=1)
        for pair in ((bm25, loaded.bm25), (dense, loaded.dense)):
            for index in pair:
                index.replace_document(
                    "acme", f"d{number}", chunks if index is bm25 or index is loaded.bm25 else _vectors(chunks)
                )
    for number in range(1, 300, 9):
        for index in (bm25, loaded.bm25, dense, loaded.dense):
            index.remove_document("acme", f"d{number}")
    loaded.bm25.add_document("newcomer", "d", [IndexedChunk("n-1", "w1 w1 brandnew", {})])
    bm25.add_document("newcomer", "d", [IndexedChunk("n-1", "w1 w1 brandnew", {})])
    assert _answers(loaded.bm25, loaded.dense) == _answers(bm25, dense)
    assert loaded.bm25.search("brandnew", 3, tenant="newcomer") == bm25.search("brandnew", 3, tenant="newcomer")
    assert loaded.bm25._scopes["acme"].postings.slots is mapped  # noqa: SLF001 - the updates copied nothing mapped
    assert loaded.dense._scopes["acme"].compact is mapped_vectors  # noqa: SLF001
    for index in (loaded.bm25, loaded.dense, bm25, dense):
        index.compact()
    assert _answers(loaded.bm25, loaded.dense) == _answers(bm25, dense)
    again = save_snapshot(
        tmp_path, identity=IDENTITY, follower_state=None, watermark=2, bm25=loaded.bm25, dense=loaded.dense
    )
    reloaded = _load(tmp_path, bm25_options=options, dense_options=options)
    assert reloaded is not None and reloaded.path == again and reloaded.watermark == 2
    assert _answers(reloaded.bm25, reloaded.dense) == _answers(bm25, dense)  # type: ignore[arg-type]


def test_empty_indexes_adopt_a_loaded_snapshot_and_answer_and_change_as_it_would(tmp_path: Path) -> None:
    """What a service does with the snapshot its build process wrote: the (empty) indexes it was built on,
    which its retrievers hold, take over the loaded ones' contents; a different BM25 parameter or
    dimension is refused."""
    bm25, dense, rng = _indexes(seed=4)
    save_snapshot(tmp_path, identity=IDENTITY, follower_state=None, watermark=1, bm25=bm25, dense=dense)
    options = NO_AUTOMATIC_COMPACTION
    loaded = _load(tmp_path, bm25_options=options, dense_options=options)
    assert loaded is not None and loaded.bm25 is not None and loaded.dense is not None
    held_bm25 = InProcessBm25Index(WhitespaceAnalyzer(), **options)
    held_dense = InProcessDenseIndex(DIMENSION, **options)
    with pytest.raises(ValueError, match="BM25 parameters"):
        InProcessBm25Index(WhitespaceAnalyzer(), Bm25Parameters(k1=1.2)).adopt(loaded.bm25)
    with pytest.raises(ValueError, match="dimension"):
        InProcessDenseIndex(DIMENSION + 1).adopt(loaded.dense)
    held_bm25.adopt(loaded.bm25)
    held_dense.adopt(loaded.dense)
    assert _answers(held_bm25, held_dense) == _answers(bm25, dense)
    assert loaded.bm25.chunk_count("acme") == 0 and loaded.dense.chunk_count("acme") == 0  # given away, not shared
    chunks = _document(rng, "acme", 5, version=1)
    for index in (bm25, held_bm25):
        index.replace_document("acme", "d5", chunks)
    for index in (dense, held_dense):
        index.replace_document("acme", "d5", _vectors(chunks))
    assert _answers(held_bm25, held_dense) == _answers(bm25, dense)


def _saved(tmp_path: Path) -> Path:
    bm25, dense, _ = _indexes(seed=3)
    return save_snapshot(tmp_path, identity=IDENTITY, follower_state={"a": 1}, watermark=7, bm25=bm25, dense=dense)


def _refused(tmp_path: Path, caplog: pytest.LogCaptureFixture, reason: str, **changes) -> None:  # type: ignore[no-untyped-def]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="query_service.index_snapshot"):
        assert _load(tmp_path, **changes) is None
    assert reason in caplog.text and "load in full" in caplog.text, caplog.text


def test_a_missing_snapshot_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _refused(tmp_path / "never-written", caplog, "missing")
    _saved(tmp_path)
    (tmp_path / CURRENT).write_text("snapshot-gone\n")
    _refused(tmp_path, caplog, "missing (CURRENT names 'snapshot-gone'")


def test_another_identity_too_old_or_other_indexes_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _saved(tmp_path)
    _refused(tmp_path, caplog, "other identity (differs in model)", identity={**IDENTITY, "model": "e5-small"})
    _refused(tmp_path, caplog, "other identity (differs in collections)", identity={**IDENTITY, "collections": ["x"]})
    _refused(tmp_path, caplog, "too old", clock=lambda: time.time() + 7200)
    _refused(tmp_path, caplog, "in the future", clock=lambda: time.time() - 7200)
    _refused(tmp_path, caplog, "holds indexes ['bm25', 'dense'], the service keeps ['bm25']", dense=False)
    assert _load(tmp_path, max_age_s=3600.0) is not None


def test_corrupt_and_truncated_files_are_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _saved(tmp_path)
    arrays = path / ARRAYS
    original = arrays.read_bytes()
    damaged = bytearray(original)
    damaged[100] ^= 0xFF  # a header block: the sampled check reads it too
    arrays.write_bytes(bytes(damaged))
    _refused(tmp_path, caplog, "corrupt (arrays.bin checksum differs)")
    _refused(tmp_path, caplog, "corrupt (arrays.bin sampled checksum differs)", verify="sampled")
    arrays.write_bytes(original[: len(original) // 2])
    _refused(tmp_path, caplog, f"corrupt (arrays.bin is {len(original) // 2} bytes, {len(original)} written)")
    arrays.write_bytes(original)
    assert _load(tmp_path) is not None and verify_snapshot(path) is None

    manifest = json.loads((path / MANIFEST).read_text())
    manifest["body"]["watermark"] = 8
    (path / MANIFEST).write_text(json.dumps(manifest))
    _refused(tmp_path, caplog, "corrupt (manifest checksum differs)")
    assert verify_snapshot(path) == "corrupt (manifest checksum differs)"
    (path / MANIFEST).write_text("{not json")
    _refused(tmp_path, caplog, "corrupt (manifest unreadable")


def test_a_full_verification_finds_a_flip_the_samples_miss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bm25 = InProcessBm25Index(WhitespaceAnalyzer())
    for number in range(4000):  # a file of more than 64 sampled blocks of 64 KiB
        text = " ".join(f"w{(number * 7 + k) % 5000}" for k in range(300))
        bm25.add_document("acme", f"d{number}", [IndexedChunk(f"c{number}", text, {})])
    path = save_snapshot(tmp_path, identity=IDENTITY, follower_state=None, watermark=1, bm25=bm25)
    arrays = path / ARRAYS
    size = arrays.stat().st_size
    assert size > 64 * 2**16 * 2
    data = bytearray(arrays.read_bytes())
    middle = (size // 63) // 2  # between the first and second sampled blocks
    data[middle] ^= 0x01
    arrays.write_bytes(bytes(data))
    options = {"analyzer": WhitespaceAnalyzer(), "dense": False}
    assert _load(tmp_path, verify="sampled", **options) is not None  # what the sampled check cannot see
    assert verify_snapshot(path) == "arrays.bin: checksum differs"
    _refused(tmp_path, caplog, "corrupt (arrays.bin checksum differs)", **options)  # the default: full
    (path / FOLLOWER).write_text('{"state": null, "watermark": 2}')
    _refused(tmp_path, caplog, "corrupt (follower.json checksum differs)", verify="sampled", **options)


def test_writing_is_atomic_and_only_the_newest_snapshots_stay(tmp_path: Path) -> None:
    bm25, dense, _ = _indexes(seed=4)
    paths = [
        save_snapshot(tmp_path, identity=IDENTITY, follower_state=i, watermark=i, bm25=bm25, dense=dense, keep=2)
        for i in range(3)
    ]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted(p.name for p in paths[1:])
    with pytest.raises(TypeError):  # a follower state JSON cannot hold: nothing half-written stays
        save_snapshot(tmp_path, identity=IDENTITY, follower_state={1, 2}, watermark=9, bm25=bm25, dense=dense)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == sorted(p.name for p in paths[1:])
    loaded = _load(tmp_path)
    assert loaded is not None and loaded.path == paths[2] and loaded.watermark == 2


def _rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/self/status")
def test_loading_maps_the_arrays_instead_of_reading_them_into_memory(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    vocabulary = [f"t{i}" for i in range(3000)]
    bm25 = InProcessBm25Index(WhitespaceAnalyzer())
    dense = InProcessDenseIndex(256)
    for number in range(200):  # 20,000 chunks of 120 terms, 20,000 vectors of 256 floats
        terms = rng.integers(0, len(vocabulary), size=(100, 120))
        chunks = [
            IndexedChunk(f"d{number}-{k}", "", {s.PAGE_START: k}, [vocabulary[t] for t in row])
            for k, row in enumerate(terms)
        ]
        bm25.add_document("acme", f"d{number}", chunks)
        vectors = rng.standard_normal((100, 256)).astype(np.float32)
        dense.replace_document(
            "acme", f"d{number}", [VectorChunk(c.chunk_id, v, c.attrs) for c, v in zip(chunks, vectors, strict=True)]
        )
    path = save_snapshot(tmp_path, identity=IDENTITY, follower_state=None, watermark=1, bm25=bm25, dense=dense)
    size = (path / ARRAYS).stat().st_size
    assert size > 40 * 2**20
    del bm25, dense, chunks
    gc.collect()
    before = _rss_anon()
    loaded = _load(tmp_path, dense=True)
    assert loaded is not None and loaded.bm25 is not None and loaded.dense is not None
    for query in ("t1 t2 t3", "t100 t2000", "t5"):
        assert len(loaded.bm25.search(query, 10, tenant="acme")) == 10
    assert len(loaded.dense.search(np.ones(256, dtype=np.float32), 10, tenant="acme")) == 10
    loaded.bm25.replace_document("acme", "d3", [IndexedChunk("new", "t1 t1", {})])
    loaded.dense.remove_document("acme", "d4")
    grown = _rss_anon() - before
    assert grown < size / 10, f"anonymous memory grew by {grown} bytes for a {size}-byte snapshot"


def test_a_capture_written_while_the_indexes_change_holds_the_moment_it_was_taken(tmp_path: Path) -> None:
    bm25, dense, rng = _indexes(seed=6)
    capture = capture_indexes(bm25, dense)
    at_capture = _answers(bm25, dense)
    for number in range(0, 300, 3):  # the follower goes on while the capture is written (another thread)
        chunks = _document(rng, "acme", number, version=2)
        bm25.replace_document("acme", f"d{number}", chunks)
        dense.replace_document("acme", f"d{number}", _vectors(chunks))
    bm25.compact()
    dense.compact()
    save_snapshot(tmp_path, identity=IDENTITY, follower_state="then", watermark=5, capture=capture)
    loaded = _load(tmp_path)
    assert loaded is not None and loaded.watermark == 5
    assert _answers(loaded.bm25, loaded.dense) == at_capture  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        save_snapshot(tmp_path, identity=IDENTITY, follower_state=None, watermark=6, capture=capture, bm25=bm25)


def test_the_per_document_state_round_trips_and_a_state_that_does_not_fit_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The follower's view and the sync's record travel as packed arrays (query_service.packed_table);
    arrays written whole (checksums intact) that do not form a table make the replica load in full."""
    bm25, dense, _ = _indexes()
    view: PackedTable[DocumentView] = PackedTable(VIEW_CODEC)
    view["acme/d1"] = DocumentView("acme", "d1", "g1", ("Title ✓", ("t",), (("k", "v"),)), 2)
    applied: PackedTable[tuple[str, int]] = PackedTable(APPLIED_CODEC)
    applied["acme/d1"] = ("g1", 2)
    arrays = {**nest_arrays("follower", view.export()), **nest_arrays("sync", applied.export())}
    snapshots = IndexSnapshots(tmp_path, identity=IDENTITY, max_age_s=3600)

    def save(state_arrays: dict[str, np.ndarray]) -> None:
        save_snapshot(
            tmp_path,
            identity=IDENTITY,
            follower_state={"follower": {"incoming": [], "applied_through": 1.0}},
            state_arrays=state_arrays,
            watermark=5,
            bm25=bm25,
            dense=dense,
        )

    save(arrays)
    loaded = snapshots.load(analyzer=WhitespaceAnalyzer(), dense=True)
    assert loaded is not None and loaded.watermark == 5
    assert dict(loaded.tables["follower"].items()) == dict(view.items())
    assert dict(loaded.tables["sync"].items()) == {"acme/d1": ("g1", 2)}

    no_values = {**arrays, "sync/values/blob": np.zeros(0, np.uint8), "sync/values/offsets": np.zeros(1, np.int64)}
    save(no_values)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="query_service.index_snapshot"):
        assert snapshots.load(analyzer=WhitespaceAnalyzer(), dense=True) is None
    assert "corrupt state" in caplog.text and "1 keys and 0 values" in caplog.text and "load in full" in caplog.text
