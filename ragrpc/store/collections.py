"""Creates, checks and loads ragrpc's Milvus collections.

`CollectionSetup.ensure(model_id, dimension, provider=...)` is idempotent and runs at the start of
both services: it creates the collections when missing (only the writer does), refuses to
work with a collection built by another embedding provider, model or dimension
(ModelMismatchError, see ragrpc.store.model_record), reads the metadata keys the chunks
collection filters on (declared when it was created, a field each, recorded next to the embedding
identity; see ragrpc.store.metadata_fields), detects whether the server has the BM25 function, and loads the
collections (after a restart they come back released).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from ragrpc import errors
from ragrpc.store import schema as s
from ragrpc.store.metadata_fields import MAX_VALUE_BYTES, RECORD_KEY, MetadataFields, follow_recorded
from ragrpc.store.milvus_connection import MilvusConnection, translate_errors
from ragrpc.store.model_record import LOCAL_PROVIDER, EmbeddingIdentity, ensure_recorded

logger = logging.getLogger(__name__)

# The chunks collection is created with Session consistency: the writer reads its own inserts, and a
# reader's search does not wait for Milvus' time tick. Under "Strong" every search on a Milvus server
# waited for it: 200 ms per call on Milvus 2.3.5 standalone (measured: HNSW top-100 at 20k rows 200 ms
# Strong, 5.7 ms Session). So a reader may see chunk writes a tick late: queries show a document
# only in the generation the registry names, so a late read can hide a just-replaced document for that
# moment, never show two versions. The registry and jobs stay Strong: the lifecycle and the query
# service's follower read them across processes, off the request path. milvus-lite behaves the same
# under either. Collections created before keep their own level.
CHUNKS_CONSISTENCY = "Session"
# Schema versions of the chunks collection (in its description): 1 indexed the raw `text` for BM25;
# 2 stores `bm25_text`, the analysed context header and text (ragrpc.store.bm25_text): the input of
# Milvus' BM25 function where the server has one, and on every server the terms the query service's
# rank_bm25 index loads without analysing each chunk again. A collection keeps the version it was
# created with; both are read and written.
CHUNKS_SCHEMA = 2
REGISTRY_CONSISTENCY = "Strong"


@dataclass(frozen=True)
class IndexConfig:
    index_type: str = "HNSW"  # FLAT, IVF_FLAT or HNSW
    hnsw_m: int = 16
    hnsw_ef_construction: int = 200
    hnsw_ef: int = 192
    ivf_nlist: int = 1024
    ivf_nprobe: int = 32

    def build_params(self) -> dict[str, Any]:
        if self.index_type == "HNSW":
            return {"M": self.hnsw_m, "efConstruction": self.hnsw_ef_construction}
        if self.index_type == "IVF_FLAT":
            return {"nlist": self.ivf_nlist}
        if self.index_type == "FLAT":
            return {}
        raise errors.PreconditionError(f"unsupported index type {self.index_type!r}; use FLAT, IVF_FLAT or HNSW")

    def search_params(self, limit: int) -> dict[str, Any]:
        if self.index_type == "HNSW":
            return {"metric_type": "COSINE", "params": {"ef": max(self.hnsw_ef, limit)}}
        if self.index_type == "IVF_FLAT":
            return {"metric_type": "COSINE", "params": {"nprobe": self.ivf_nprobe}}
        return {"metric_type": "COSINE", "params": {}}


@dataclass(frozen=True)
class CollectionNames:
    chunks: str
    documents: str
    jobs: str

    @classmethod
    def with_prefix(cls, prefix: str) -> CollectionNames:
        return cls(f"{prefix}_chunks", f"{prefix}_documents", f"{prefix}_jobs")


def is_milvus_lite(server_version: str) -> bool:
    """milvus-lite reports its version as `milvus_lite-<version>`."""
    return server_version.startswith("milvus_lite")


def upsert_keeps_partitions(server_version: str) -> bool:
    """Whether the server's upsert keeps rows in their partition-key partition. Milvus 2.3.x does not:
    upserted rows vanish from filters on the key (measured on the 2.3.5 server PyPI ships; milvus-lite
    and 2.4+ are fine). Unparseable versions are trusted."""
    match = re.match(r"v?(\d+)\.(\d+)", server_version.strip())
    if match is None:
        return True
    return (int(match.group(1)), int(match.group(2))) >= (2, 4)


class CollectionSetup:
    """Ensures the collections exist with the expected model and are loaded."""

    def __init__(
        self,
        connection: MilvusConnection,
        names: CollectionNames,
        index: IndexConfig,
        *,
        chunks_schema: int = CHUNKS_SCHEMA,
        metadata_keys: tuple[str, ...] | None = (),
    ) -> None:
        """metadata_keys: the filterable metadata keys a new chunks collection declares (RAGRPC_METADATA_FILTER_KEYS;
        None: none and no record, as collections were created before keys could be declared, for tests)."""
        if chunks_schema not in (1, 2):
            raise ValueError(f"chunks schema {chunks_schema} unknown; 1 or 2")
        self._conn = connection
        self._names = names
        self._index = index
        self._chunks_schema = chunks_schema  # what a new chunks collection gets (1: as created before, for tests)
        self._metadata_keys = metadata_keys
        # the keys the chunks collection filters on, as recorded on it (known once `ensure` ran)
        self.metadata_fields = MetadataFields()
        self.bm25_supported = False
        # schema 2: `bm25_text` holds each chunk's analysed terms (Milvus' BM25 reads them where the server
        # has BM25); schema 1: no such field, Milvus' BM25 reads the raw `text`
        self.bm25_analysed = False
        self.upsert_keeps_partitions = True
        self.server_version = ""

    @property
    def embedded(self) -> bool:
        """The server is milvus-lite (known once `ensure` ran)."""
        return is_milvus_lite(self.server_version)

    @translate_errors
    def ensure(self, model_id: str, dimension: int, *, provider: str = LOCAL_PROVIDER, create: bool = True) -> None:
        client = self._conn.client()
        if not client.has_collection(self._names.documents):
            if not create:
                raise errors.PreconditionError(
                    f"collection {self._names.documents} does not exist yet; start the ingest service first",
                    reason="COLLECTION_MISSING",
                )
            self._create_registry(client)
        client.load_collection(self._names.documents)
        self._check_model(client, EmbeddingIdentity(model_id, dimension, provider), create=create)
        if not client.has_collection(self._names.chunks):
            if not create:
                raise errors.PreconditionError(
                    f"collection {self._names.chunks} does not exist yet; start the ingest service first",
                    reason="COLLECTION_MISSING",
                )
            self._create_chunks(client, dimension)
            if self._metadata_keys is not None:  # recorded next to the embedding identity (None: as before, tests)
                self._write_model_record(
                    client, {**(self._read_model_record(client) or {}), RECORD_KEY: list(self._metadata_keys)}
                )
        if not client.has_collection(self._names.jobs):
            if create:
                self._create_jobs(client)
        for name in (self._names.chunks, self._names.jobs):
            if client.has_collection(name):
                client.load_collection(name)
        self._conn.keep_loaded(
            *(
                name
                for name in (self._names.documents, self._names.chunks, self._names.jobs)
                if client.has_collection(name)
            )
        )
        fields = self._chunk_fields(client)
        self.metadata_fields = self._recorded_metadata_fields(client, create=create)
        self.bm25_supported = s.SPARSE in fields
        self.bm25_analysed = s.BM25_TEXT in fields
        if self.bm25_supported and not self.bm25_analysed:
            logger.info(
                "collection %s has chunks schema 1: Milvus' BM25 (RAGRPC_SPARSE_BACKEND=milvus_bm25) scores its raw "
                "text (no stems, no context header); documents ingested under a new RAGRPC_COLLECTION_PREFIX get "
                "schema 2",
                self._names.chunks,
            )
        self.server_version = str(client.get_server_version())
        self.upsert_keeps_partitions = upsert_keeps_partitions(self.server_version)
        if not self.upsert_keeps_partitions:
            logger.warning(
                "Milvus %s moves upserted rows out of their partition-key partition; document updates "
                "rewrite chunks as a new generation instead of upserting them (chunk ids change)",
                self.server_version,
            )

    def _recorded_metadata_fields(self, client: Any, *, create: bool) -> MetadataFields:
        """The metadata keys of the chunks collection: its `meta_<key>` fields (what each row must carry),
        recorded in the registry's model record next to the embedding identity (`RECORD_KEY`), which tells a
        collection created with no keys from one created before keys could be declared (no record, no such
        fields: legacy). The writer records what the fields say; a service whose setting differs follows them
        and logs it (ragrpc.store.metadata_fields)."""
        if not client.has_collection(self._names.chunks):
            return MetadataFields()
        names = [str(f.get("name")) for f in client.describe_collection(self._names.chunks).get("fields", [])]
        keys = tuple(n.removeprefix(s.METADATA_FIELD_PREFIX) for n in names if n.startswith(s.METADATA_FIELD_PREFIX))
        record = self._read_model_record(client) or {}
        recorded = record.get(RECORD_KEY)
        if recorded is None and not keys:
            found = MetadataFields(legacy=True)
        else:
            found = MetadataFields(keys)
            if create and recorded != list(keys):
                self._write_model_record(client, {**record, RECORD_KEY: list(keys)})
        return follow_recorded(found, self._metadata_keys or (), self._names.chunks)

    def _read_model_record(self, client: Any) -> dict[str, Any] | None:
        rows = client.get(self._names.documents, ids=[s.MODEL_INFO_KEY], output_fields=[s.RECORD])
        return dict(rows[0][s.RECORD] or {}) if rows else None

    def _write_model_record(self, client: Any, record: dict[str, Any]) -> None:
        row = _registry_row_defaults()
        row.update({s.DOC_KEY: s.MODEL_INFO_KEY, s.RECORD: record})
        client.upsert(self._names.documents, [row])

    def _check_model(self, client: Any, identity: EmbeddingIdentity, *, create: bool) -> None:
        ensure_recorded(
            lambda: self._read_model_record(client),
            lambda record: self._write_model_record(client, record),
            identity,
            create=create,
        )

    def _create_registry(self, client: Any) -> None:
        from pymilvus import DataType

        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field(s.DOC_KEY, DataType.VARCHAR, max_length=s.VARCHAR_LIMITS[s.DOC_KEY], is_primary=True)
        for name in (
            s.TENANT,
            s.COLLECTION,
            s.DOCUMENT_ID,
            s.CONTENT_HASH,
            s.SOURCE,
            s.GENERATION,
            s.PENDING_GENERATION,
        ):
            schema.add_field(name, DataType.VARCHAR, max_length=s.VARCHAR_LIMITS[name])
        schema.add_field(s.STATE, DataType.INT8)
        schema.add_field(s.UPDATED_AT, DataType.INT64)
        schema.add_field(s.RECORD, DataType.JSON)
        schema.add_field(s.REGISTRY_VECTOR, DataType.FLOAT_VECTOR, dim=2)
        index = client.prepare_index_params()
        index.add_index(s.REGISTRY_VECTOR, index_type="FLAT", metric_type="L2")
        client.create_collection(
            self._names.documents, schema=schema, index_params=index, consistency_level=REGISTRY_CONSISTENCY
        )
        logger.info("created collection %s", self._names.documents)

    def _create_jobs(self, client: Any) -> None:
        from pymilvus import DataType

        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field(s.JOB_ID, DataType.VARCHAR, max_length=64, is_primary=True)
        schema.add_field(s.TENANT, DataType.VARCHAR, max_length=s.VARCHAR_LIMITS[s.TENANT])
        schema.add_field(s.UPDATED_AT, DataType.INT64)
        schema.add_field(s.RECORD, DataType.JSON)
        schema.add_field(s.REGISTRY_VECTOR, DataType.FLOAT_VECTOR, dim=2)
        index = client.prepare_index_params()
        index.add_index(s.REGISTRY_VECTOR, index_type="FLAT", metric_type="L2")
        client.create_collection(
            self._names.jobs, schema=schema, index_params=index, consistency_level=REGISTRY_CONSISTENCY
        )

    def _create_chunks(self, client: Any, dimension: int) -> None:
        try:
            self._create_chunks_with(client, dimension, bm25=True)
        except Exception as exc:  # noqa: BLE001 - older servers lack the BM25 function
            logger.warning("server rejected the BM25 function (%s); creating chunks without it", exc)
            if client.has_collection(self._names.chunks):
                client.drop_collection(self._names.chunks)
            self._create_chunks_with(client, dimension, bm25=False)

    def _create_chunks_with(self, client: Any, dimension: int, *, bm25: bool) -> None:
        from pymilvus import DataType, Function, FunctionType

        schema = client.create_schema(
            auto_id=False, enable_dynamic_field=False, description=json.dumps({"ragrpc_schema": self._chunks_schema})
        )
        schema.add_field(s.CHUNK_ID, DataType.VARCHAR, max_length=s.VARCHAR_LIMITS[s.CHUNK_ID], is_primary=True)
        schema.add_field(s.TENANT, DataType.VARCHAR, max_length=s.VARCHAR_LIMITS[s.TENANT], is_partition_key=True)
        analysed = {"enable_analyzer": True, "analyzer_params": {"type": "standard"}}
        raw_input = bm25 and self._chunks_schema == 1
        schema.add_field(
            s.TEXT, DataType.VARCHAR, max_length=s.VARCHAR_LIMITS[s.TEXT], **(analysed if raw_input else {})
        )
        if self._chunks_schema == 2:
            # The analysed header and text (ragrpc.store.bm25_text): the BM25 function's input where
            # the server has one; everywhere, the terms the rank_bm25 index loads at start.
            schema.add_field(
                s.BM25_TEXT,
                DataType.VARCHAR,
                max_length=s.VARCHAR_LIMITS[s.BM25_TEXT],
                **(analysed if bm25 else {}),
            )
        for name in (
            s.COLLECTION,
            s.DOCUMENT_ID,
            s.GENERATION,
            s.SOURCE,
            s.TITLE,
            s.MEDIA_TYPE,
            s.SECTION_PATH,
            s.CHUNKER,
            s.PARENT_ID,
            s.CONTENT_HASH,
        ):
            schema.add_field(name, DataType.VARCHAR, max_length=s.VARCHAR_LIMITS[name])
        for name in (s.PAGE_START, s.PAGE_END, s.CHUNK_INDEX):
            schema.add_field(name, DataType.INT32)
        schema.add_field(s.KIND, DataType.INT8)
        schema.add_field(s.DOC_DATE, DataType.INT64)
        schema.add_field(s.CREATED_AT, DataType.INT64)
        schema.add_field(
            s.TAGS, DataType.ARRAY, element_type=DataType.VARCHAR, max_capacity=s.MAX_TAGS, max_length=s.MAX_TAG_LENGTH
        )
        schema.add_field(s.METADATA, DataType.JSON)
        for key in self._metadata_keys or ():  # the filterable metadata keys, each a field of its own
            schema.add_field(s.metadata_field(key), DataType.VARCHAR, max_length=MAX_VALUE_BYTES)
        schema.add_field(s.DENSE, DataType.FLOAT_VECTOR, dim=dimension)
        index = client.prepare_index_params()
        index.add_index(
            s.DENSE, index_type=self._index.index_type, metric_type="COSINE", params=self._index.build_params()
        )
        if bm25:
            schema.add_field(s.SPARSE, DataType.SPARSE_FLOAT_VECTOR)
            schema.add_function(
                Function(
                    name="text_bm25",
                    function_type=FunctionType.BM25,
                    input_field_names=[s.TEXT if raw_input else s.BM25_TEXT],
                    output_field_names=[s.SPARSE],
                )
            )
            index.add_index(s.SPARSE, index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
        client.create_collection(
            self._names.chunks, schema=schema, index_params=index, consistency_level=CHUNKS_CONSISTENCY
        )
        logger.info(
            "created collection %s (dim %d, %s, bm25=%s)", self._names.chunks, dimension, self._index.index_type, bm25
        )

    def _chunk_fields(self, client: Any) -> set[str]:
        if not client.has_collection(self._names.chunks):
            return set()
        info = client.describe_collection(self._names.chunks)
        return {str(f.get("name")) for f in info.get("fields", [])}


def _registry_row_defaults() -> dict[str, Any]:
    return {
        s.TENANT: "",
        s.COLLECTION: "",
        s.DOCUMENT_ID: "",
        s.CONTENT_HASH: "",
        s.SOURCE: "",
        s.GENERATION: "",
        s.PENDING_GENERATION: "",
        s.STATE: 0,
        s.UPDATED_AT: 0,
        s.RECORD: {},
        s.REGISTRY_VECTOR: [1.0, 0.0],
    }
