"""The `ragrpc` CLI, run in-process (`main([...])`) against the real services.

The services run on the test's event loop, so `main` runs in a worker thread."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from clients.cli import main
from ragrpc.config import Settings
from ragrpc.store.metadata_fields import MetadataFields
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry
from tests.conftest import FakeStack, running_stack
from tests.grpc.test_client_sync import BREAD_TXT, GARDEN_TXT, MILVUS_MD, PNG_BYTES
from tests.support.chat_server import Behaviour, ChatServer

REPO_ROOT = Path(__file__).resolve().parents[2]


def _corpus(root: Path) -> Path:
    (root / "sub").mkdir()
    (root / ".git").mkdir()
    (root / "milvus.md").write_text(MILVUS_MD)
    (root / "sub" / "bread.txt").write_text(BREAD_TXT)
    (root / "sub" / "garden.txt").write_text(GARDEN_TXT)
    (root / ".hidden.txt").write_text("hidden file, never ingested")
    (root / ".git" / "config.txt").write_text("hidden directory, never ingested")
    return root


async def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def test_ingest_search_ask_and_docs(fake_stack, tmp_path: Path, capsys) -> None:
    ingest, query = ("--ingest", fake_stack.ingest_address), ("--query", fake_stack.query_address)
    code, out, _ = await _cli(capsys, *ingest, "ingest", str(_corpus(tmp_path)), "--tag", "demo")
    assert code == 0
    await fake_stack.followed()
    lines = out.strip().splitlines()
    assert len(lines) == 3 and all("\tactive\t" in line for line in lines)
    assert not any("hidden" in line for line in lines)

    code, out, _ = await _cli(capsys, *query, "--json", "search", "Milvus vector database", "--top-k", "2")
    records = _json_lines(out)
    assert code == 0 and [r["type"] for r in records] == ["hit", "hit", "summary"]
    assert records[0]["chunk"]["source"].endswith("milvus.md") and records[0]["rank"] == 1

    code, out, _ = await _cli(capsys, *query, "search", "sourdough starter", "--mode", "sparse", "--tag", "demo")
    assert code == 0 and out.startswith("  1. ") and "bread.txt" in out.splitlines()[0]

    code, out, _ = await _cli(capsys, *query, "ask", "What does Milvus store?", "--top-k", "2")
    assert code == 0 and "Milvus" in out and "Sources:" in out and "model extractive" in out

    code, out, _ = await _cli(capsys, *query, "--json", "ask", "What does Milvus store?")
    events = _json_lines(out)
    assert code == 0 and events[0]["event"] == "source" and events[-1]["event"] == "final"
    assert events[-1]["data"]["model"] == "extractive"

    code, out, _ = await _cli(capsys, *ingest, "--json", "docs", "list", "--page-size", "1")
    documents = _json_lines(out)
    assert code == 0 and len(documents) == 3 and all(d["state"] == "DOCUMENT_STATE_ACTIVE" for d in documents)
    doc_id = documents[0]["document_id"]
    code, out, _ = await _cli(capsys, *ingest, "docs", "get", doc_id)
    assert code == 0 and f"document_id: {doc_id}" in out
    code, out, _ = await _cli(capsys, *ingest, "docs", "delete", doc_id)
    assert code == 0 and out.startswith(f"deleted {doc_id}")
    code, _, err = await _cli(capsys, *ingest, "docs", "get", doc_id)
    assert code == 3 and "NOT_FOUND" in err and doc_id in err


async def test_failed_documents_and_error_exit_codes(fake_stack, tmp_path: Path, capsys) -> None:
    ingest, query = ("--ingest", fake_stack.ingest_address), ("--query", fake_stack.query_address)
    (tmp_path / "ok.txt").write_text(BREAD_TXT)
    (tmp_path / "image.png").write_bytes(PNG_BYTES)
    code, out, _ = await _cli(capsys, *ingest, "--json", "ingest", str(tmp_path))
    records = {Path(r["file"]).name: r for r in _json_lines(out)}
    assert code == 1 and records["ok.txt"]["state"] == "active"
    assert records["image.png"]["error"]["code"] == "INVALID_ARGUMENT"

    code, _, err = await _cli(capsys, *query, "search", " ")
    assert code == 4 and "INVALID_ARGUMENT" in err and "query" in err
    code, out, _ = await _cli(capsys, *ingest, "--json", "job", "get", "no-such-job")
    assert code == 3 and _json_lines(out)[0]["error"]["code"] == "NOT_FOUND"
    assert (await _cli(capsys, *ingest, "ingest", str(tmp_path / "missing")))[0] == 2
    assert (await _cli(capsys, "search"))[0] == 2
    assert (await _cli(capsys, "frobnicate"))[0] == 2
    assert (await _cli(capsys, *query, "search", "x", "--mode", "semantic"))[0] == 2
    assert (await _cli(capsys, "--query", "127.0.0.1:1", "search", "milvus"))[0] == 5


def _filing(company: str, ticker: str, year: int) -> str:
    return (
        "UNITED STATES\nSECURITIES AND EXCHANGE COMMISSION\nFORM 10-K\n"
        f"For the fiscal year ended December 31, {year}\n{company}\n"
        "(Exact name of registrant as specified in its charter)\n"
        "Title of each class Trading Symbol(s) Name of each exchange on which registered\n"
        f"Common Stock, $0.01 par value {ticker} The Nasdaq Global Select Market\n\n"
        f"Net revenue for {year} was reported in the consolidated statements of operations.\n"
    )


FACT_KEYS = ("organization", "ticker", "document_type", "fiscal_period")


@pytest.fixture
async def filings_stack(settings: Settings) -> AsyncIterator[FakeStack]:
    """Both services with the filings enricher, over a collection that declares its facts' keys."""
    configured = dataclasses.replace(settings, enrichers="filings", metadata_filter_keys=",".join(FACT_KEYS))
    chunks = InMemoryChunkStore(metadata_fields=MetadataFields(FACT_KEYS))
    async with running_stack(configured, FakeStack(HashingEmbedder(), chunks, InMemoryDocumentRegistry())) as stack:
        yield stack


async def test_search_by_the_facts_of_filings(filings_stack, tmp_path: Path, capsys) -> None:
    fake_stack = filings_stack
    ingest, query = ("--ingest", fake_stack.ingest_address), ("--query", fake_stack.query_address)
    (tmp_path / "amd-2022.txt").write_text(_filing("ADVANCED MICRO DEVICES, INC.", "AMD", 2022))
    (tmp_path / "amd-2021.txt").write_text(_filing("ADVANCED MICRO DEVICES, INC.", "AMD", 2021))
    (tmp_path / "nvda-2022.txt").write_text(_filing("NVIDIA CORPORATION", "NVDA", 2022))
    code, out, _ = await _cli(capsys, *ingest, "--json", "ingest", str(tmp_path))
    names = {r["document_id"]: Path(r["file"]).stem for r in _json_lines(out)}
    assert code == 0 and len(names) == 3
    await fake_stack.followed()

    async def documents(*flags: str) -> set[str]:
        code, out, err = await _cli(capsys, *query, "--json", "search", "net revenue", "--top-k", "10", *flags)
        assert code == 0, err
        return {names[r["chunk"]["document_id"]] for r in _json_lines(out) if r["type"] == "hit"}

    assert await documents() == {"amd-2022", "amd-2021", "nvda-2022"}
    assert await documents("--ticker", "amd") == {"amd-2022", "amd-2021"}
    assert await documents("--ticker", "AMD", "--fiscal-period", "FY2022") == {"amd-2022"}
    assert await documents("--organization", "Nvidia Corporation", "--document-type", "10-K") == {"nvda-2022"}
    assert await documents("--ticker", "NVDA", "--ticker", "AMD", "--fiscal-period", "FY2021") == {"amd-2021"}
    assert await documents("--document-type", "10-Q") == set()
    # the generic form: keys AND'ed, a key given twice takes either value
    assert await documents("--where", "ticker=AMD", "--where", "fiscal_period=FY2022") == {"amd-2022"}
    assert await documents("--where", "ticker=NVDA", "--where", "ticker=AMD") == {"amd-2022", "amd-2021", "nvda-2022"}
    assert await documents("--where", "organization=Nvidia Corporation") == {"nvda-2022"}
    code, _, err = await _cli(capsys, *query, "search", "net revenue", "--where", "department=sales")
    assert code == 4 and "INVALID_ARGUMENT" in err and "'department' is not declared" in err and "ticker" in err
    code, _, err = await _cli(capsys, *query, "search", "net revenue", "--where", "ticker")
    assert code == 2 and "KEY=VALUE" in err


async def test_parallel_uploads_report_every_file(fake_stack, tmp_path: Path, capsys) -> None:
    ingest = ("--ingest", fake_stack.ingest_address)
    for number in range(6):
        (tmp_path / f"note{number}.txt").write_text(f"Note {number}. {BREAD_TXT}")
    (tmp_path / "image.png").write_bytes(PNG_BYTES)
    code, out, _ = await _cli(capsys, *ingest, "--json", "ingest", "--parallel", "3", str(tmp_path))
    records = {Path(r["file"]).name: r for r in _json_lines(out)}
    assert code == 1 and len(records) == 7
    assert all(records[f"note{number}.txt"]["state"] == "active" for number in range(6))
    assert records["image.png"]["error"]["code"] == "INVALID_ARGUMENT"
    assert len({records[f"note{number}.txt"]["document_id"] for number in range(6)}) == 6
    code, _, err = await _cli(capsys, *ingest, "ingest", "--parallel", "0", str(tmp_path))
    assert code == 2 and "--parallel" in err


async def test_health(fake_stack, capsys) -> None:
    code, out, _ = await _cli(capsys, "--target", fake_stack.query_address, "health", "--wait", "5")
    assert code == 0 and "SERVING" in out
    code, out, _ = await _cli(
        capsys, "--ingest", fake_stack.ingest_address, "--json", "health", "--service", "ragrpc.v1.IngestService"
    )
    assert code == 0 and _json_lines(out)[0]["status"] == "SERVING"
    code, out, _ = await _cli(capsys, "--target", "127.0.0.1:1", "health", "--wait", "0.5")
    assert code == 1 and "UNREACHABLE" in out


def test_every_command_has_help() -> None:
    commands = [
        [],
        ["ingest"],
        ["search"],
        ["ask"],
        ["docs"],
        ["docs", "list"],
        ["docs", "get"],
        ["docs", "delete"],
        ["job"],
        ["job", "get"],
        ["health"],
    ]
    for command in commands:
        assert main([*command, "--help"]) == 0, command
    result = subprocess.run(
        [sys.executable, "-m", "clients.cli", "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "--ingest" in result.stdout and "--query" in result.stdout


class TestAskRetraction:
    @pytest.fixture
    def chat_server(self) -> Iterator[ChatServer]:
        with ChatServer(default=Behaviour.die(after_tokens=3)) as server:
            yield server

    @pytest.fixture
    def settings(self, settings: Settings, chat_server: ChatServer) -> Settings:
        return dataclasses.replace(settings, llm_endpoints=f"{chat_server.url}|flaky-model")

    async def test_ask_prints_a_notice_and_starts_over(self, fake_stack, tmp_path: Path, capsys) -> None:
        (tmp_path / "milvus.md").write_text(MILVUS_MD)
        assert (await _cli(capsys, "--ingest", fake_stack.ingest_address, "ingest", str(tmp_path)))[0] == 0
        query = ("--query", fake_stack.query_address)
        code, out, _ = await _cli(capsys, *query, "ask", "What does Milvus store?")
        assert code == 0
        before, notice, after = out.partition("[answer withdrawn: flaky-model failed (")
        assert notice and before.strip() and "starting over]" in after
        assert "Sources:" in after and "model extractive" in after


async def test_ingest_then_search_at_once_finds_the_note_across_cli_runs(
    settings: Settings, fake_stores: FakeStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 43's new user: `ragrpc ingest note.md`, then at once `ragrpc search` for its words. The
    query service's follower polls once an hour here: only the CLI's read-your-writes token (kept
    between the two runs) makes the note searchable by BM25 at once."""
    slow = dataclasses.replace(settings, registry_follow_interval_s=3600.0)
    async with running_stack(slow, fake_stores) as stack:
        ingest, query = ("--ingest", stack.ingest_address), ("--query", stack.query_address)
        note = tmp_path / "note.md"
        note.write_text("# Note\n\nThe quokka named Pemberton eats fennel on Tuesdays.\n")
        code, _, _ = await _cli(capsys, *ingest, "ingest", str(note))
        assert code == 0
        code, out, _ = await _cli(capsys, *query, "search", "quokka Pemberton fennel", "--mode", "sparse")
        assert code == 0 and "note.md" in out.splitlines()[0]
        code, out, _ = await _cli(
            capsys, *query, "--no-read-your-writes", "search", "quokka Pemberton fennel", "--mode", "sparse"
        )
        assert code == 0  # the token was already reflected: the same answer without waiting
