"""Domain objects shared by the services: plain dataclasses, no protobuf, no Milvus.

Flow of objects through ingestion:

    bytes --extract--> ExtractedDocument(blocks) --chunk--> [ChunkDraft] --embed--> [ChunkRecord] --> store

and through a query:

    query --search--> [ScoredChunk] --fuse/rerank/diversify--> [ScoredChunk] --> stream
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any


class BlockKind(str, enum.Enum):  # noqa: UP042 - StrEnum would change str() and format() of members
    """What a block of extracted text is; chunkers treat kinds differently."""

    HEADING = "heading"
    PARAGRAPH = "paragraph"
    LIST_ITEM = "list_item"
    TABLE = "table"  # text is a Markdown table (header row, separator row, body rows)
    CODE = "code"  # text is source code; Block.language names it when known
    OTHER = "other"


@dataclass(frozen=True)
class Block:
    """One structural unit of a document in reading order.

    section_path is the heading hierarchy the block sits under (outermost first); a
    HEADING block's own path ends with its own title. page is 1-based, None when the
    format has no pages.
    """

    kind: BlockKind
    text: str
    page: int | None = None
    section_path: tuple[str, ...] = ()
    level: int = 0  # heading level (1 = top) for HEADING, nesting depth for LIST_ITEM
    language: str = ""  # for CODE blocks: "python", "javascript", ... or ""
    table_header: str = ""  # for TABLE blocks: the Markdown header + separator lines
    table_caption: str = ""  # for TABLE blocks: the table's caption or title, when the format has one
    # for TABLE blocks: the block goes on with the rows of the TABLE block before it (a table that
    # runs over a page break); its own header lines repeat that table's header
    continues_table: bool = False


@dataclass
class DocumentMetadata:
    """Facts about a document found while extracting it (all optional)."""

    title: str = ""
    author: str = ""
    created: str = ""  # ISO-8601 date or datetime, as found in the file
    modified: str = ""
    page_count: int = 0
    language: str = ""
    extra: dict[str, str] = field(default_factory=dict)


@dataclass
class ExtractedDocument:
    """Output of an Extractor: blocks in reading order plus document facts."""

    media_type: str
    blocks: list[Block]
    metadata: DocumentMetadata = field(default_factory=DocumentMetadata)
    pages_without_text: list[int] = field(default_factory=list)  # 1-based page numbers

    @property
    def text(self) -> str:
        return "\n\n".join(b.text for b in self.blocks if b.text)


class ChunkKind(enum.IntEnum):
    """Retrievable chunks are searched; PARENT chunks are context for their children."""

    RETRIEVABLE = 0
    PARENT = 1


@dataclass
class ChunkDraft:
    """A chunk before embedding, as a Chunker produces it."""

    text: str
    chunk_index: int
    chunker: str
    page_start: int = 0  # 0 when unknown / no pages
    page_end: int = 0
    section_path: tuple[str, ...] = ()
    kind: ChunkKind = ChunkKind.RETRIEVABLE
    parent_index: int = -1  # chunk_index of the PARENT draft this child belongs to, -1 if none
    # at most this many model tokens in `text` (from the chunker's tokenization of the document); 0: not known
    token_bound: int = 0


@dataclass
class ChunkRecord:
    """A chunk as stored: the draft plus identity, document fields and its vector."""

    chunk_id: str
    document_id: str
    tenant: str
    collection: str
    generation: str
    text: str
    vector: list[float]
    chunk_index: int
    chunker: str
    source: str = ""
    title: str = ""
    media_type: str = ""
    page_start: int = 0
    page_end: int = 0
    section_path: tuple[str, ...] = ()
    kind: ChunkKind = ChunkKind.RETRIEVABLE
    parent_id: str = ""
    content_hash: str = ""
    tags: tuple[str, ...] = ()
    doc_date: int = 0  # unix seconds of the document's own date (modified/created), 0 unknown
    created_at: int = 0  # unix seconds when ingested
    metadata: dict[str, Any] = field(default_factory=dict)
    parent_text: str = ""  # filled at query time for child chunks when asked; never stored
    # The analysed terms BM25 indexes (header and text), read by scan_chunks(with_bm25_terms=True) from a
    # store that keeps them (chunks schema 2, ragrpc.store.bm25_text); None: not read, analyse the text.
    # On a write the store derives them from the chunk, unless the ingest pipeline gave them (its document
    # workers analysed them, same analyser and settings); a writer that changes a chunk's title, section
    # path, metadata or text passes None.
    bm25_terms: tuple[str, ...] | None = None


@dataclass
class StageScores:
    """Per-stage scores of a hit; None where the stage did not run or did not see it."""

    dense: float | None = None  # cosine similarity in [-1, 1]
    sparse: float | None = None  # BM25 score, >= 0
    fused: float | None = None  # RRF or weighted-fusion score
    rerank: float | None = None  # cross-encoder logit, or a remote rerank API's relevance score


@dataclass
class ScoredChunk:
    """A search hit: the stored chunk (without its vector) and its scores."""

    chunk: ChunkRecord
    score: float
    scores: StageScores = field(default_factory=StageScores)
    complete: bool = True  # False: only the hit fields were read (schema.HIT_FIELDS; no text yet)


class DocumentState(enum.IntEnum):
    """Lifecycle of a document (values match ragrpc.v1.DocumentState)."""

    PENDING = 1
    PROCESSING = 2
    ACTIVE = 3
    FAILED = 4


@dataclass
class DocumentRecord:
    """A document registry entry, as stored in Milvus."""

    tenant: str
    document_id: str
    collection: str = "default"
    source: str = ""
    title: str = ""
    media_type: str = ""
    content_hash: str = ""
    state: DocumentState = DocumentState.PENDING
    error: str = ""
    error_code: str = ""
    chunk_count: int = 0
    # chunks the generation wrote, retrievable and parents, with indexes 0 .. chunk_span-1 and ids
    # chunk_id_for derives (0: not recorded, a record from before it was)
    chunk_span: int = 0
    page_count: int = 0
    pages_without_text: list[int] = field(default_factory=list)
    size_bytes: int = 0
    author: str = ""
    language: str = ""
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    chunker: str = ""
    doc_date: int = 0
    created_at: int = 0
    updated_at: int = 0
    generation: str = ""  # the attempt whose chunks are visible; "" before the first success
    pending_generation: str = ""  # the attempt in progress; "" when none
    stale_generation: str = ""  # a replaced attempt whose chunks still await deletion
    deleting: bool = False  # DeleteDocument started; recovery finishes it

    @property
    def key(self) -> str:
        return document_key(self.tenant, self.document_id)


@dataclass
class WriterLeaseRecord:
    """Who writes the collection: the ingest process holding the lease, renewed while it runs."""

    holder: str  # unique per process start
    host: str = ""
    pid: int = 0
    epoch: int = 0  # +1 at every take-over
    acquired_at: float = 0.0
    renewed_at: float = 0.0
    expires_at: float = 0.0  # wall-clock unix seconds; 0 once released


def document_key(tenant: str, document_id: str) -> str:
    return f"{tenant}/{document_id}"


# Stored chunk ids derive from the document, its generation and the chunk's index, so a reader that knows a
# generation and how many chunks it wrote (DocumentRecord.chunk_span) reads them by primary key: a key lookup,
# where a filter on the generation scans the collection (milvus-lite at 1M chunks: about 1.4 ms against 1.2-4 s).
def chunk_id_for(tenant: str, document_id: str, generation: str, index: int) -> str:
    digest = hashlib.sha256(f"{tenant}\x1f{document_id}\x1f{generation}\x1f{index}".encode()).hexdigest()
    return digest[:32]


def chunk_ids_of(tenant: str, document_id: str, generation: str, span: int) -> list[str]:
    """The ids of chunk indexes 0 .. span-1 of one generation."""
    return [chunk_id_for(tenant, document_id, generation, index) for index in range(span)]


@dataclass
class IngestJobRecord:
    """State of an IngestDocuments job (progress per document, summary when done)."""

    job_id: str
    tenant: str
    documents: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    summary: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0
