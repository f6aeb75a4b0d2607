"""The commands of the `ragrpc` CLI (clients.cli builds the parser and maps errors to exit
codes). Each command takes the parsed arguments and returns an exit code."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any, TextIO

from google.protobuf import json_format
from google.protobuf.message import Message
from tqdm import tqdm

from clients import convert
from clients.channel import ChannelSettings
from clients.errors import RagrpcClientError, Unauthenticated, Unavailable
from clients.events import Citation, Final, Hit, Retraction, Source, Token
from clients.session import ReadYourWrites
from clients.sync_client import IngestClient, RetrieveClient, wait_until_serving
from ragrpc.v1 import ingest_pb2

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
SNIPPET_CHARS = 200


class UsageError(Exception):
    """A wrong command line that argparse cannot detect (exit code 2)."""


class Output:
    """Writes human text, or JSON lines with --json, to stdout."""

    def __init__(self, as_json: bool, stream: TextIO | None = None) -> None:
        self.as_json = as_json
        self._stream = stream

    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stdout

    def emit(self, record: dict[str, Any], text: str) -> None:
        line = json.dumps(record, ensure_ascii=False, default=str) if self.as_json else text
        tqdm.write(line, file=self.stream)

    def write(self, text: str) -> None:
        """Raw text (human mode only), flushed at once."""
        if not self.as_json:
            self.stream.write(text)
            self.stream.flush()


def message_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _settings_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"api_key": args.api_key or None}
    if args.timeout is not None:
        kwargs.update(timeout=args.timeout, stream_timeout=args.timeout)
    return kwargs


def session_file() -> Path:
    """Where the CLI keeps the consistency token of its last writes (RAGRPC_CLI_STATE_DIR, else
    $XDG_STATE_HOME/ragrpc, else ~/.local/state/ragrpc)."""
    base = os.environ.get("RAGRPC_CLI_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state"), "ragrpc"
    )
    return Path(base) / "last-write-token"


def _session(args: argparse.Namespace) -> ReadYourWrites | None:
    """Read your writes across CLI runs: `ingest`, `docs delete` record their writes, `search` and `ask`
    are answered once the query service reflects them (--no-read-your-writes: answer at once)."""
    return ReadYourWrites(path=session_file()) if getattr(args, "read_your_writes", True) else None


def ingest_client(args: argparse.Namespace) -> IngestClient:
    return IngestClient(args.ingest_target, session=_session(args), **_settings_kwargs(args))


def retrieve_client(args: argparse.Namespace) -> RetrieveClient:
    return RetrieveClient(args.query_target, session=_session(args), **_settings_kwargs(args))


# ---- ingest -------------------------------------------------------------------------------


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def collect_files(paths: list[str]) -> list[Path]:
    """The files named, plus every non-hidden file under the directories named (sorted)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not _is_hidden(d))
                found.extend(Path(root) / f for f in sorted(files) if not _is_hidden(f))
        else:
            raise UsageError(f"no such file or directory: {raw}")
    return found


def _upload_one(client: IngestClient, path: Path, args: argparse.Namespace, show_bars: bool) -> dict[str, Any]:
    with tqdm(
        total=path.stat().st_size,
        unit="B",
        unit_scale=True,
        desc=path.name[:30],
        leave=False,
        position=1,
        disable=not show_bars,
        file=sys.stderr,
    ) as bar:
        document = client.upload(
            path,
            source_name=str(path),
            collection=args.collection,
            tags=args.tag,
            password=args.password,
            chunking=args.chunking,
            on_progress=bar.update,
        )
    return {
        "file": str(path),
        "document_id": document.document_id,
        "state": convert.state_label(document.state),
        "chunks": document.chunk_count,
        "error": None,
    }


def _failed_record(path: Path, err: RagrpcClientError) -> dict[str, Any]:
    return {"file": str(path), "document_id": None, "state": "failed", "chunks": 0, "error": err.to_dict()}


def cmd_ingest(args: argparse.Namespace, out: Output) -> int:
    """Uploads the files, `--parallel` at once (the service batches their embeddings together);
    prints each file's outcome as it finishes."""
    files = collect_files(args.paths)
    if not files:
        raise UsageError("no files to ingest (hidden files are skipped)")
    if args.parallel < 1:
        raise UsageError(f"--parallel must be at least 1, not {args.parallel}")
    show_bars = not out.as_json and sys.stderr.isatty()
    file_bars = show_bars and args.parallel == 1  # byte bars of concurrent uploads would overwrite each other
    failed = 0
    with (
        ingest_client(args) as client,
        ThreadPoolExecutor(max_workers=args.parallel, thread_name_prefix="upload") as pool,
        tqdm(
            total=len(files), unit="file", desc="files", position=0, disable=not show_bars, file=sys.stderr
        ) as overall,
    ):
        uploads = {pool.submit(_upload_one, client, path, args, file_bars): path for path in files}
        try:
            for future in as_completed(uploads):
                path = uploads[future]
                try:
                    record = future.result()
                    text = f"{record['document_id']}\t{record['state']}\t{record['chunks']} chunks\t{path}"
                except (Unavailable, Unauthenticated):
                    raise  # every later file would fail the same way
                except RagrpcClientError as err:
                    failed += 1
                    record, text = _failed_record(path, err), f"FAILED\t{path}\t{err}"
                out.emit(record, text)
                overall.update(1)
        finally:
            for future in uploads:
                future.cancel()  # those not started yet
    if not out.as_json:
        print(f"{len(files) - failed} of {len(files)} files ingested", file=sys.stderr)
    return EXIT_ERROR if failed else EXIT_OK


# ---- search / ask -------------------------------------------------------------------------


def _date(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value else None


def retrieval_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "top_k": args.top_k,
        "mode": args.mode,
        "fusion": args.fusion,
        "mmr_lambda": args.mmr,
        "collection": args.collection,
        "sources": args.source,
        "tags": args.tag,
        "document_ids": args.document,
        "metadata": convert.parse_where(args.where),
        "organizations": args.organization,
        "tickers": [symbol.upper() for symbol in args.ticker],
        "document_types": args.document_type,
        "fiscal_periods": args.fiscal_period,
        "after": _date(args.after),
        "before": _date(args.before),
    }


def _location(chunk: Any) -> str:
    parts = []
    if chunk.page_start:
        end = f"-{chunk.page_end}" if chunk.page_end > chunk.page_start else ""
        parts.append(f"p. {chunk.page_start}{end}")
    if chunk.section_path:
        parts.append(" > ".join(chunk.section_path))
    return f" ({', '.join(parts)})" if parts else ""


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _label(chunk: Any) -> str:
    """Title and source ("Guide — docs/guide.md"), either alone when the other is empty."""
    parts = [part for part in (chunk.title, chunk.source) if part]
    return " — ".join(dict.fromkeys(parts)) or chunk.document_id


def format_hit(hit: Hit) -> str:
    return (
        f"{hit.rank:>3}. {hit.score:.4f} {hit.score_kind:<8} {_label(hit.chunk)}{_location(hit.chunk)}"
        f"  [{hit.document_id}]\n     {snippet(hit.text)}"
    )


def cmd_search(args: argparse.Namespace, out: Output) -> int:
    with retrieve_client(args) as client, client.retrieve(args.query, **retrieval_options(args)) as stream:
        for hit in stream:
            out.emit({"type": "hit", **hit.to_dict()}, format_hit(hit))
        summary = stream.summary
    if summary is not None:
        total = summary.timings.get("total")
        timing = f" in {total:.1f} ms" if total is not None else ""
        out.emit({"type": "summary", **summary.to_dict()}, f"({summary.returned} hits{timing})")
    return EXIT_OK


def _print_ask_event(event: Any, out: Output) -> None:
    if isinstance(event, Token):
        out.write(event.text)
    elif isinstance(event, Retraction):
        out.write(f"\n[answer withdrawn: {event.model} failed ({event.reason}); starting over]\n")


def format_final(final: Final, sources: list[Source], citations: list[Citation]) -> str:
    lines = ["", "", "Sources:"]
    for source in sources:
        hit = source.hit
        lines.append(
            f"  [{source.number}] {_label(hit.chunk)}{_location(hit.chunk)}  "
            f"[{hit.document_id}] {hit.score:.4f} {hit.score_kind}"
        )
    if citations:
        lines.append("Citations:")
        lines += [
            f"  [{c.source_number}] answer[{c.answer_start}:{c.answer_end}] {c.title} ({c.chunk_id})" for c in citations
        ]
    timings = ", ".join(f"{stage} {millis:.1f} ms" for stage, millis in final.timings.items())
    lines.append(
        f"model {final.model}, finish {final.finish_reason}, tokens {final.prompt_tokens}+"
        f"{final.completion_tokens}" + (f"; {timings}" if timings else "")
    )
    return "\n".join(lines)


def cmd_ask(args: argparse.Namespace, out: Output) -> int:
    options = retrieval_options(args)
    options.update(template=args.template, max_answer_tokens=args.max_answer_tokens, temperature=args.temperature)
    with retrieve_client(args) as client, client.ask(args.query, **options) as stream:
        for event in stream:
            if out.as_json:
                out.emit({"event": event.kind, "data": event.to_dict()}, "")
            else:
                _print_ask_event(event, out)
        if stream.final is not None and not out.as_json:
            out.write(format_final(stream.final, stream.sources, stream.citations) + "\n")
    return EXIT_OK


# ---- documents, jobs, health --------------------------------------------------------------


def format_document(doc: ingest_pb2.Document) -> str:
    label = doc.title or doc.source
    return f"{doc.document_id}\t{convert.state_label(doc.state)}\t{doc.chunk_count} chunks\t{label}"


def _format_fields(record: dict[str, Any]) -> str:
    return "\n".join(f"{key}: {value}" for key, value in record.items() if value not in ("", [], {}, None))


def cmd_docs_list(args: argparse.Namespace, out: Output) -> int:
    with ingest_client(args) as client:
        documents = client.list_documents(
            page_size=args.page_size, state=args.state, source=args.source or "", collection=args.collection or ""
        )
        for count, document in enumerate(documents, start=1):
            out.emit(message_dict(document), format_document(document))
            if args.limit and count >= args.limit:
                break
    return EXIT_OK


def cmd_docs_get(args: argparse.Namespace, out: Output) -> int:
    with ingest_client(args) as client:
        record = message_dict(client.get_document(args.document_id))
    out.emit(record, _format_fields(record))
    return EXIT_OK


def cmd_docs_delete(args: argparse.Namespace, out: Output) -> int:
    with ingest_client(args) as client:
        deleted = client.delete_document(args.document_id)
    out.emit(
        {"document_id": args.document_id, "chunks_deleted": deleted}, f"deleted {args.document_id} ({deleted} chunks)"
    )
    return EXIT_OK


def _job_lines(job: ingest_pb2.IngestJob) -> Iterator[str]:
    yield f"job {job.job_id}: {'done' if job.done else 'running'}"
    for progress in job.documents:
        event = convert.progress_from_pb(job.job_id, progress)
        error = f"\t{event.error_code}: {event.error_message}" if event.error_message else ""
        yield (
            f"  [{event.index}] {event.document_id}\t{event.stage}\t{event.state}\t{event.chunk_count} chunks{error}"
        )
    if job.HasField("summary"):
        s = job.summary
        yield (
            f"succeeded {s.succeeded}, failed {s.failed}, unchanged {s.unchanged}, "
            f"chunks written {s.chunks_written}, {s.elapsed_seconds:.2f} s"
        )


def cmd_job_get(args: argparse.Namespace, out: Output) -> int:
    with ingest_client(args) as client:
        job = client.get_job(args.job_id)
    out.emit(message_dict(job), "\n".join(_job_lines(job)))
    return EXIT_OK


def cmd_health(args: argparse.Namespace, out: Output) -> int:
    target = args.target or args.ingest_target
    settings = ChannelSettings(target=target, api_key=args.api_key or None)
    status, error = wait_until_serving(
        settings,
        max(args.wait, 0.0) or (args.timeout or 5.0),
        service=args.service,
        poll_s=0.25 if args.wait else 3600.0,
    )
    detail = f" ({error})" if error is not None and status != "SERVING" else ""
    out.emit(
        {
            "target": target,
            "service": args.service,
            "status": status,
            "error": error.to_dict() if isinstance(error, RagrpcClientError) else None,
        },
        f"{target} {args.service or '(server)'}: {status}{detail}",
    )
    return EXIT_OK if status == "SERVING" else EXIT_ERROR
