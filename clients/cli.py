"""`ragrpc` command line: ingest files, search, ask, manage documents and jobs, check health.

    ragrpc [--ingest ADDR] [--query ADDR] [--target ADDR] [--api-key KEY] [--timeout S] [--json] COMMAND ...

Exit codes: 0 ok, 1 server or other error (and `ingest` when any document failed, `health`
when not SERVING), 2 usage error, 3 not found, 4 invalid argument, 5 unavailable, 130 interrupted.

Output cut short (`ragrpc --json search ... | head -1`) ends the command quietly, as Unix tools
end on SIGPIPE: no traceback, no error message, exit code 141 (128 + SIGPIPE, what a shell shows for
`yes | head -1`). Python ignores SIGPIPE in every program, so a closed pipe arrives as
BrokenPipeError, which `main` turns into that exit.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence

from clients import cli_commands as commands
from clients.errors import InvalidArgument, NotFound, RagrpcClientError, Unavailable
from ragrpc.v1 import ingest_pb2

EXIT_NOT_FOUND = 3
EXIT_INVALID_ARGUMENT = 4
EXIT_UNAVAILABLE = 5
EXIT_INTERRUPTED = 130
EXIT_OUTPUT_CLOSED = 128 + signal.SIGPIPE  # 141, as for a tool that SIGPIPE ended
Handler = Callable[[argparse.Namespace, commands.Output], int]


def _choices(enum_names: Sequence[str], prefix: str) -> list[str]:
    return [n.removeprefix(prefix).lower() for n in enum_names if not n.endswith("UNSPECIFIED")]


CHUNKING_CHOICES = _choices(ingest_pb2.ChunkingStrategy.keys(), "CHUNKING_STRATEGY_")
STATE_CHOICES = _choices(ingest_pb2.DocumentState.keys(), "DOCUMENT_STATE_")


def _add_global_options(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--ingest",
        dest="ingest_target",
        metavar="ADDR",
        default=env("RAGRPC_INGEST_TARGET", "127.0.0.1:50051"),
        help="IngestService address (env RAGRPC_INGEST_TARGET; default %(default)s)",
    )
    parser.add_argument(
        "--query",
        dest="query_target",
        metavar="ADDR",
        default=env("RAGRPC_QUERY_TARGET", "127.0.0.1:50052"),
        help="RetrieveService address (env RAGRPC_QUERY_TARGET; default %(default)s)",
    )
    parser.add_argument(
        "--target", metavar="ADDR", default=None, help="address checked by `health` (default: the --ingest address)"
    )
    parser.add_argument(
        "--api-key",
        default=env("RAGRPC_API_KEY", ""),
        help="API key sent as 'authorization: Bearer KEY' (env RAGRPC_API_KEY)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="deadline of each call (default 30 s for unary calls, 300 s for streams)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output: one JSON object per line")
    parser.add_argument(
        "--read-your-writes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="search and ask see what this user's earlier ingest and delete commands wrote, waiting for the "
        "query service to reflect them (the token is kept in RAGRPC_CLI_STATE_DIR or ~/.local/state/ragrpc; "
        "default on)",
    )


def _add_retrieval_options(parser: argparse.ArgumentParser, default_top_k: int) -> None:
    parser.add_argument("query", metavar="QUERY", help="the query text")
    parser.add_argument("--top-k", type=int, default=default_top_k, help="number of hits (default %(default)s)")
    parser.add_argument("--mode", choices=["hybrid", "dense", "sparse"], help="retrievers to run (default hybrid)")
    parser.add_argument("--fusion", choices=["rrf", "weighted"], help="fusion of dense and sparse (default rrf)")
    parser.add_argument("--mmr", type=float, metavar="LAMBDA", help="diversify with MMR (1 relevance .. 0 diversity)")
    parser.add_argument("--collection", default="", help="only this collection")
    parser.add_argument("--source", action="append", default=[], help="only this source (repeatable)")
    parser.add_argument("--tag", action="append", default=[], help="only documents with this tag (repeatable)")
    parser.add_argument("--document", action="append", default=[], metavar="ID", help="only this document (repeatable)")
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only chunks whose metadata KEY is VALUE, exactly; KEY must be one the collection declares "
        "(RAGRPC_METADATA_FILTER_KEYS). Repeatable: different keys must all match, a key given twice matches "
        "either value (--where language=de --where language=fr)",
    )
    facts = (  # the filings enricher's facts (RAGRPC_ENRICHERS=filings): the deprecated MetadataFilter fields
        ("--organization", "NAME", 'only documents of this organisation, as metadata shows it ("Amazon.com, Inc.")'),
        ("--ticker", "SYMBOL", 'only documents of this trading symbol ("AMD")'),
        ("--document-type", "TYPE", 'only documents of this type ("10-K", "10-Q", "earnings release", ...)'),
        ("--fiscal-period", "PERIOD", 'only documents of this fiscal period ("FY2017", "2018-Q2")'),
    )
    for flag, metavar, text in facts:
        key = flag.removeprefix("--").replace("-", "_")
        parser.add_argument(
            flag, action="append", default=[], metavar=metavar, help=f"{text}; like --where {key}=... (repeatable)"
        )
    parser.add_argument("--after", metavar="ISO_DATE", help="only documents dated at or after this")
    parser.add_argument("--before", metavar="ISO_DATE", help="only documents dated before this")


def _add_ingest_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ingest",
        help="upload files and directories (recursive, hidden files skipped)",
        description="Uploads each file with UploadDocument (--parallel at once) and prints id, state and chunks.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    p.add_argument("--collection", default="", help="logical collection (default: the server's 'default')")
    p.add_argument("--tag", action="append", default=[], help="tag to add (repeatable)")
    p.add_argument(
        "--chunking",
        choices=CHUNKING_CHOICES,
        default=None,
        metavar="STRATEGY",
        help=f"chunking strategy: {', '.join(CHUNKING_CHOICES)}",
    )
    p.add_argument("--password", default="", help="password of encrypted PDFs")
    p.add_argument(
        "--parallel",
        type=int,
        default=4,
        metavar="N",
        help="files uploaded at once (default 4; their embeddings share the model's batches)",
    )
    p.set_defaults(handler=commands.cmd_ingest)


def _add_query_commands(sub: argparse._SubParsersAction) -> None:
    search = sub.add_parser("search", help="ranked hits for a query", description="Streams ranked chunks.")
    _add_retrieval_options(search, default_top_k=10)
    search.set_defaults(handler=commands.cmd_search)
    ask = sub.add_parser(
        "ask",
        help="answer a question from the collection",
        description="Prints the answer as it streams, then sources, citations and timings.",
    )
    _add_retrieval_options(ask, default_top_k=5)
    ask.add_argument("--template", default="", help="default, conversational, analytical or creative")
    ask.add_argument("--max-answer-tokens", type=int, default=0, help="answer length limit (server default)")
    ask.add_argument("--temperature", type=float, default=None, help="sampling temperature for LLM generators")
    ask.set_defaults(handler=commands.cmd_ask)


def _add_resource_commands(sub: argparse._SubParsersAction) -> None:
    docs = sub.add_parser("docs", help="list, show or delete documents", description="Document resources.")
    docs_sub = docs.add_subparsers(dest="docs_command", metavar="{list,get,delete}", required=True)
    listing = docs_sub.add_parser("list", help="list documents (ordered by id)", description="Lists documents.")
    listing.add_argument("--state", choices=STATE_CHOICES, help="only documents in this state")
    listing.add_argument("--source", help="only documents with exactly this source")
    listing.add_argument("--collection", help="only documents in this collection")
    listing.add_argument("--page-size", type=int, default=100, help="documents per request (default %(default)s)")
    listing.add_argument("--limit", type=int, default=0, help="stop after this many documents (0: all)")
    listing.set_defaults(handler=commands.cmd_docs_list)
    for name, handler, text in (
        ("get", commands.cmd_docs_get, "show one document"),
        ("delete", commands.cmd_docs_delete, "delete a document and its chunks"),
    ):
        p = docs_sub.add_parser(name, help=text, description=text.capitalize() + ".")
        p.add_argument("document_id", metavar="ID", help="document id")
        p.set_defaults(handler=handler)
    job = sub.add_parser("job", help="show ingestion jobs", description="Ingestion jobs of IngestDocuments.")
    job_sub = job.add_subparsers(dest="job_command", metavar="{get}", required=True)
    get = job_sub.add_parser("get", help="show one job", description="Shows the state of one job.")
    get.add_argument("job_id", metavar="ID", help="job id")
    get.set_defaults(handler=commands.cmd_job_get)


def _add_health_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "health",
        help="grpc.health.v1 check of --target (exit 0 when SERVING)",
        description="Checks the standard gRPC health of --target (default: --ingest).",
    )
    p.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS", help="poll until SERVING or this many seconds passed"
    )
    p.add_argument("--service", default="", help="service name to check (default: the whole server)")
    p.set_defaults(handler=commands.cmd_health)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragrpc",
        description="Client of the ragrpc ingest and query services.",
        epilog="exit codes: 0 ok, 1 error, 2 usage, 3 not found, 4 invalid argument, 5 unavailable, "
        "130 interrupted, 141 output closed early",
    )
    _add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_ingest_command(sub)
    _add_query_commands(sub)
    _add_resource_commands(sub)
    _add_health_command(sub)
    return parser


def exit_code_for(error: RagrpcClientError) -> int:
    if isinstance(error, NotFound):
        return EXIT_NOT_FOUND
    if isinstance(error, InvalidArgument):
        return EXIT_INVALID_ARGUMENT
    if isinstance(error, Unavailable):
        return EXIT_UNAVAILABLE
    return commands.EXIT_ERROR


def _report(out: commands.Output, message: str, record: dict[str, object]) -> None:
    if out.as_json:
        out.emit({"error": record}, "")
    print(f"ragrpc: error: {message}", file=sys.stderr)


def _run(handler: Handler, args: argparse.Namespace, out: commands.Output) -> int:
    try:
        return handler(args, out)
    except RagrpcClientError as err:
        _report(out, str(err), err.to_dict())
        return exit_code_for(err)
    except (commands.UsageError, ValueError) as err:
        _report(out, str(err), {"code": "USAGE", "message": str(err)})
        return commands.EXIT_USAGE
    except BrokenPipeError:
        raise  # the reader of our output left: not an error to report (main ends quietly)
    except OSError as err:
        _report(out, str(err), {"code": "OS_ERROR", "message": str(err)})
        return commands.EXIT_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; returns the exit code (also for usage errors, --help and output cut short)."""
    try:
        code = _parse_and_run(argv)
        sys.stdout.flush()  # here, not at exit, so that a closed pipe is seen while it can be handled
        return code
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_OUTPUT_CLOSED
    except KeyboardInterrupt:
        print("ragrpc: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _parse_and_run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else commands.EXIT_USAGE
    return _run(args.handler, args, commands.Output(args.json))


def _discard_stdout() -> None:
    """Points stdout's descriptor at /dev/null, so that the interpreter's flush of what is still
    buffered at exit cannot fail a second time (and print "Exception ignored ... BrokenPipeError")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a non-file stream (tests capture it)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
