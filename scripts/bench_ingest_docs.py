"""Ingestion figures on the shared real documents (../shared/eval/docs):

1. PDF extraction, in-process (the extractor registry the ingest service uses): pages/second
   over every shared PDF (encrypted ones opened with the password from inventory.jsonl; files
   that cannot be read are counted and left out of the rate).
2. End to end through the gRPC ingest service, as separate processes (milvus-lite server +
   `python -m ingest_service` with the real model, `scripts.processes.Stack`): every shared
   document sent in IngestDocuments batches, one format after the other; chunks/second per
   format and over all of them, from the first request to the last summary.

    python -m scripts.bench_ingest_docs [--skip-e2e] [--skip-pdf] [--skip-reference] [--data-dir DIR]

Prints two small tables, and the model alone embedding chunk-sized texts in-process on the same
machine just after, to read the end-to-end figure against. The machine's load matters: the load
average is printed; run it on an otherwise idle machine for figures worth comparing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from scripts.processes import REPO, Stack

DOCS = REPO.parent / "shared" / "eval" / "docs"
KINDS = ("pdf", "docx", "html", "markdown", "other")
BATCH_BYTES = 12 << 20  # under the default 16 MiB message limit
MESSAGE_BYTES = 64 << 20


@dataclass
class Corpus:
    files: dict[str, list[Path]]
    passwords: dict[str, str]

    @staticmethod
    def load(root: Path = DOCS) -> Corpus:
        rows = [json.loads(line) for line in (root / "inventory.jsonl").read_text().splitlines() if line.strip()]
        passwords = {row["file"]: str(row.get("password") or "") for row in rows}
        files = {
            kind: sorted(p for p in (root / kind).iterdir() if p.is_file()) for kind in KINDS if (root / kind).is_dir()
        }
        return Corpus(files, passwords)

    def password(self, path: Path) -> str:
        return self.passwords.get(f"{path.parent.name}/{path.name}", "")


@dataclass
class Row:
    label: str
    documents: int = 0
    active: int = 0
    refused: int = 0
    chunks: int = 0
    units: int = 0  # pages (extraction) or bytes (end to end)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def pdf_extraction(corpus: Corpus) -> Row:
    from ingest_service.extract import build_default_registry

    registry = build_default_registry()
    row = Row("PDF extraction (in-process)")
    slowest: list[tuple[float, str, int]] = []
    for path in corpus.files.get("pdf", []):
        data = path.read_bytes()
        row.documents += 1
        started = time.perf_counter()
        try:
            document = registry.extract(
                data, file_name=path.name, media_type="application/pdf", password=corpus.password(path)
            )
        except Exception as exc:  # noqa: BLE001 - a benchmark counts what fails and says why
            row.refused += 1
            row.notes.append(f"{path.name}: {type(exc).__name__}: {str(exc)[:70]}")
            continue
        elapsed = time.perf_counter() - started
        pages = document.metadata.page_count or len({b.page for b in document.blocks if b.page})
        row.active += 1
        row.units += pages
        row.seconds += elapsed
        slowest.append((elapsed, path.name, pages))
    for elapsed, name, pages in sorted(slowest, reverse=True)[:3]:
        row.notes.append(f"slowest: {name} {pages} p in {elapsed:.1f}s ({pages / elapsed:.1f} pages/s)")
    return row


def _batches(corpus: Corpus, kind: str) -> list[list[Any]]:
    from ragrpc.v1 import ingest_pb2

    batches: list[list[Any]] = [[]]
    size = 0
    for path in corpus.files.get(kind, []):
        content = path.read_bytes()
        if batches[-1] and size + len(content) > BATCH_BYTES:
            batches.append([])
            size = 0
        spec = ingest_pb2.DocumentSpec(
            file_name=path.name,
            document_id=f"{kind}-{path.name}"[:128],
            password=corpus.password(path),
            collection="bench_docs",
        )
        batches[-1].append(ingest_pb2.InlineDocument(spec=spec, content=content))
        size += len(content)
    return [b for b in batches if b]


def ingest_kind(stub: Any, corpus: Corpus, kind: str) -> Row:
    from ragrpc.v1 import ingest_pb2

    row = Row(kind)
    started = time.perf_counter()
    for batch in _batches(corpus, kind):
        request = ingest_pb2.IngestDocumentsRequest(documents=batch)
        row.units += sum(len(d.content) for d in batch)
        for event in stub.IngestDocuments(request, timeout=3600):
            if event.HasField("progress") and event.progress.stage == ingest_pb2.INGEST_STAGE_DONE:
                row.documents += 1
                if event.progress.state == ingest_pb2.DOCUMENT_STATE_ACTIVE:
                    row.active += 1
                    row.chunks += event.progress.chunk_count
                else:
                    row.refused += 1
    row.seconds = time.perf_counter() - started
    return row


def end_to_end(corpus: Corpus, data_dir: Path) -> list[Row]:
    from ragrpc.v1 import ingest_pb2_grpc

    env = {
        "RAGRPC_COLLECTION_PREFIX": "bench_docs",
        "RAGRPC_MAX_MESSAGE_BYTES": str(MESSAGE_BYTES),
        "RAGRPC_LOG_LEVEL": "WARNING",
    }
    with Stack(data_dir, env=env) as stack:
        started = time.perf_counter()
        stack.start_milvus()
        address = stack.start_ingest()
        print(
            f"milvus-lite + ingest service up in {time.perf_counter() - started:.0f}s (logs in {data_dir})",
            file=sys.stderr,
        )
        options = [("grpc.max_send_message_length", MESSAGE_BYTES), ("grpc.max_receive_message_length", MESSAGE_BYTES)]
        with grpc.insecure_channel(address, options=options) as channel:
            stub = ingest_pb2_grpc.IngestServiceStub(channel)
            rows = []
            for kind in KINDS:
                rows.append(ingest_kind(stub, corpus, kind))
                print(
                    f"  {kind}: {rows[-1].documents} documents, {rows[-1].chunks} chunks in {rows[-1].seconds:.1f}s",
                    file=sys.stderr,
                )
    total = Row("all documents")
    for row in rows:
        for name in ("documents", "active", "refused", "chunks", "units"):
            setattr(total, name, getattr(total, name) + getattr(row, name))
        total.seconds += row.seconds
    return [*rows, total]


def embedder_alone(corpus: Corpus, count: int = 256) -> Row:
    """The model alone, in-process, on chunk-sized pieces (~900 characters) of the Markdown files,
    in batches of 32: what the machine gives right now, to read the end-to-end figure against."""
    from ragrpc.embeddings import SentenceTransformerEmbedder

    text = "\n".join(p.read_text(errors="replace") for p in corpus.files.get("markdown", []))
    pieces = [text[i : i + 900] for i in range(0, len(text), 900)][:count]
    embedder = SentenceTransformerEmbedder()
    embedder.warm_up()
    row = Row("model alone (in-process)", documents=len(pieces), chunks=len(pieces))
    started = time.perf_counter()
    for i in range(0, len(pieces), 32):
        embedder.embed_documents(pieces[i : i + 32])
    row.seconds = time.perf_counter() - started
    return row


def _rate(amount: float, seconds: float) -> str:
    return f"{amount / seconds:.1f}" if seconds > 0 else "-"


def print_extraction(row: Row) -> None:
    print("\nPDF extraction, in-process (pdfplumber; every shared PDF, passwords from inventory.jsonl)")
    print(f"{'PDFs':>5} {'read':>5} {'failed':>6} {'pages':>6} {'seconds':>8} {'pages/s':>8}")
    print(
        f"{row.documents:>5} {row.active:>5} {row.refused:>6} {row.units:>6} {row.seconds:>8.1f} "
        f"{_rate(row.units, row.seconds):>8}"
    )
    for note in row.notes:
        print(f"  {note}")


def print_end_to_end(rows: list[Row], reference: Row | None) -> None:
    print("\nEnd to end through gRPC IngestDocuments (milvus-lite + ingest service process, all-MiniLM-L6-v2)")
    print(
        f"{'format':14} {'docs':>5} {'active':>6} {'refused':>7} {'MB':>6} {'chunks':>7} {'seconds':>8} "
        f"{'chunks/s':>9} {'docs/s':>7}"
    )
    for row in rows:
        print(
            f"{row.label:14} {row.documents:>5} {row.active:>6} {row.refused:>7} {row.units / 1e6:>6.1f} "
            f"{row.chunks:>7} {row.seconds:>8.1f} {_rate(row.chunks, row.seconds):>9} "
            f"{_rate(row.documents, row.seconds):>7}"
        )
    if reference is not None:
        print(
            f"for reference, the model alone embedded {reference.chunks} chunk-sized texts in "
            f"{reference.seconds:.1f}s: {_rate(reference.chunks, reference.seconds)} chunks/s"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-pdf", action="store_true", help="skip the in-process PDF extraction figure")
    parser.add_argument("--skip-e2e", action="store_true", help="skip the end-to-end gRPC figure")
    parser.add_argument(
        "--skip-reference",
        action="store_true",
        help="skip timing the model alone (in-process) next to the end-to-end figure",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where milvus-lite data and the process logs go (default: a temporary folder, removed)",
    )
    args = parser.parse_args(argv)
    if not DOCS.is_dir():
        print(f"the shared documents are missing: {DOCS}", file=sys.stderr)
        return 2
    corpus = Corpus.load()
    print(
        f"{sum(len(v) for v in corpus.files.values())} documents in {DOCS}; {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at the start"
    )
    if not args.skip_pdf:
        print_extraction(pdf_extraction(corpus))
    if not args.skip_e2e:
        data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="bench_ingest_docs_"))
        try:
            rows = end_to_end(corpus, data_dir)
            print_end_to_end(rows, None if args.skip_reference else embedder_alone(corpus))
        finally:
            if args.data_dir is None:
                shutil.rmtree(data_dir, ignore_errors=True)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
