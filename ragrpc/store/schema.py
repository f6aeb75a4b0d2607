"""Milvus schema of ragrpc: field-name constants and collection builders.

Two collections share a name prefix (default "ragrpc"):

  <prefix>_chunks     one row per chunk; searched by the query service
  <prefix>_documents  the document registry (one row per document, plus one model-info row)

Chunks carry a `generation` (the ingestion attempt that wrote them). A chunk is visible
only while its generation equals the registry's `generation` of its document, so a
replacement (write new chunks -> switch the registry -> delete old chunks) never shows a
document twice or missing, and a crash at any point leaves only invisible leftovers that
recovery deletes.
"""

from __future__ import annotations

# --- chunk collection fields -------------------------------------------------------
CHUNK_ID = "chunk_id"  # VARCHAR primary key
TENANT = "tenant"  # VARCHAR partition key
COLLECTION = "collection"  # VARCHAR logical collection
DOCUMENT_ID = "document_id"  # VARCHAR
GENERATION = "generation"  # VARCHAR ingestion attempt id
TEXT = "text"  # VARCHAR, the chunk's text (BM25 input of schema-1 collections)
BM25_TEXT = "bm25_text"  # VARCHAR, analysed header + text (BM25 input of schema 2; ragrpc.store.bm25_text)
DENSE = "dense"  # FLOAT_VECTOR(dim), COSINE
SPARSE = "sparse"  # SPARSE_FLOAT_VECTOR filled by the BM25 function (when supported)
SOURCE = "source"
TITLE = "title"
MEDIA_TYPE = "media_type"
PAGE_START = "page_start"  # INT32
PAGE_END = "page_end"  # INT32
SECTION_PATH = "section_path"  # VARCHAR, " > "-joined
CHUNK_INDEX = "chunk_index"  # INT32
CHUNKER = "chunker"  # VARCHAR
KIND = "kind"  # INT8 (ChunkKind: 0 retrievable, 1 parent)
PARENT_ID = "parent_id"  # VARCHAR
CONTENT_HASH = "content_hash"  # VARCHAR sha256 of the document bytes
TAGS = "tags"  # ARRAY<VARCHAR> (filtered with array_contains_any)
DOC_DATE = "doc_date"  # INT64 unix seconds of the document's own date, 0 unknown
CREATED_AT = "created_at"  # INT64 unix seconds of ingestion
METADATA = "metadata"  # JSON, not filterable (kept out of hot filters)
# VARCHAR per metadata key the collection declares filterable ("meta_<key>"; ragrpc.store.metadata_fields)
METADATA_FIELD_PREFIX = "meta_"
MAX_METADATA_VALUE_CHARS = 4096  # a metadata value (in the METADATA JSON)

SECTION_SEPARATOR = " > "


MAX_TAGS = 32
MAX_TAG_LENGTH = 128

# Fields a query may filter on, with their value type.
FILTERABLE_FIELDS: dict[str, type] = {
    TENANT: str,
    COLLECTION: str,
    DOCUMENT_ID: str,
    GENERATION: str,
    SOURCE: str,
    MEDIA_TYPE: str,
    TAGS: list,
    DOC_DATE: int,
    CREATED_AT: int,
    KIND: int,
    CHUNK_INDEX: int,
    PAGE_START: int,
    PAGE_END: int,
    CHUNK_ID: str,
    PARENT_ID: str,
}

# Output fields of a search (everything but the vectors).
CHUNK_OUTPUT_FIELDS = [
    CHUNK_ID,
    TENANT,
    COLLECTION,
    DOCUMENT_ID,
    GENERATION,
    TEXT,
    SOURCE,
    TITLE,
    MEDIA_TYPE,
    PAGE_START,
    PAGE_END,
    SECTION_PATH,
    CHUNK_INDEX,
    CHUNKER,
    KIND,
    PARENT_ID,
    CONTENT_HASH,
    TAGS,
    DOC_DATE,
    CREATED_AT,
    METADATA,
]

# What a scan for the in-process indexes leaves unread where the store keeps each chunk's analysed
# terms (scan_chunks(index_fields_only=True)): the index holds none of them, and the text is most of a row.
NOT_INDEXED_FIELDS = (TEXT, TITLE, SECTION_PATH, CONTENT_HASH)

# What a search reads of each candidate (identity and visibility); the rows of the hits that
# survive fusion are read afterwards, by id.
HIT_FIELDS = [CHUNK_ID, TENANT, COLLECTION, DOCUMENT_ID, GENERATION, CHUNK_INDEX, CHUNKER, KIND]

# --- document registry fields ------------------------------------------------------
DOC_KEY = "doc_key"  # VARCHAR primary key: "<tenant>/<document_id>"
STATE = "state"  # INT8 (DocumentState)
CHUNK_COUNT = "chunk_count"  # INT32
ERROR = "error"  # VARCHAR
UPDATED_AT = "updated_at"  # INT64
PENDING_GENERATION = "pending_generation"  # VARCHAR: attempt in progress, "" when none
JOB_ID = "job_id"  # jobs collection primary key
RECORD = "record"  # JSON: the rest of the Document resource
REGISTRY_VECTOR = "_unused_vector"  # FLOAT_VECTOR(2): Milvus requires a vector field

MODEL_INFO_KEY = "__ragrpc_model_info__"  # registry row that records the embedding model
# Deletion journal: a row in the jobs collection per deleted document (tenant field set to this
# value, which no tenant name can take; the document's key in RECORD["doc_key"]), so that
# readers following the registry see a delete whose registry row is already gone.
DELETION_JOURNAL_TENANT = "#deleted"
# How long the ingest service keeps journal entries (purged at its start): a reader whose view is
# younger than this learns every delete since from the journal alone.
DELETION_JOURNAL_KEEP_S = 7 * 24 * 3600
# Change journal: a row in the jobs collection per document whose registry row the writer changed
# lately (tenant field set to this value; the key in RECORD["doc_key"], its time in UPDATED_AT), so
# that a reader following the registry finds what changed by reading a few rows, not by filtering
# the whole registry on updated_at (milvus-lite scans it: 1.2-1.4 s at 1M documents). A hint, not
# the record of truth: a change whose journal write failed is found by the reader's periodic sweep
# of the registry (query_service.registry_follower).
CHANGE_JOURNAL_TENANT = "#changed"
# How long entries stay (the writer purges older ones every CHANGE_JOURNAL_PURGE_S): a reader further
# behind than this sweeps the registry instead.
CHANGE_JOURNAL_KEEP_S = 600
CHANGE_JOURNAL_PURGE_S = 60
WRITER_LEASE_KEY = "#writer-lease"  # job id and tenant of the writer lease's row in the jobs collection
JOBS_FILTERABLE_FIELDS: dict[str, type] = {TENANT: str, UPDATED_AT: int}

REGISTRY_FILTERABLE_FIELDS: dict[str, type] = {
    DOC_KEY: str,
    TENANT: str,
    COLLECTION: str,
    DOCUMENT_ID: str,
    CONTENT_HASH: str,
    SOURCE: str,
    STATE: int,
    UPDATED_AT: int,
}

# VARCHAR limits in UTF-8 bytes, as a Milvus server counts them (milvus-lite counts characters): a
# value of 400 CJK characters is 1,200 bytes. Values the service derives are cut to fit (clip_utf8);
# values a caller gives are checked first (INVALID_ARGUMENT naming the field and its byte limit).
VARCHAR_LIMITS = {
    CHUNK_ID: 64,
    TENANT: 64,
    COLLECTION: 128,
    DOCUMENT_ID: 128,
    GENERATION: 64,
    TEXT: 65535,
    BM25_TEXT: 65535,
    SOURCE: 2048,
    TITLE: 1024,
    MEDIA_TYPE: 128,
    SECTION_PATH: 2048,
    CHUNKER: 64,
    PARENT_ID: 64,
    CONTENT_HASH: 64,
    DOC_KEY: 256,
    ERROR: 4096,
    PENDING_GENERATION: 64,
}


def utf8_length(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def clip_utf8(value: str, limit: int) -> str:
    """`value` cut to at most `limit` UTF-8 bytes, on a character boundary."""
    if len(value) * 4 <= limit or utf8_length(value) <= limit:
        return value
    return value.encode("utf-8", "surrogatepass")[:limit].decode("utf-8", "ignore")


def metadata_field(key: str) -> str:
    """The scalar field (and in-process attribute) of a declared metadata key: "department" -> "meta_department"."""
    return METADATA_FIELD_PREFIX + key
