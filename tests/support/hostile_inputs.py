"""Generators of hostile documents for the reliability tests (tests/reliability).

Every generator is deterministic for a given seed and returns `HostileInput`s: bytes plus
what a caller would declare about them (file name, media type) and what the service is
allowed to do with them:

    expect = "refuse"   the document must be refused (INVALID_ARGUMENT / RESOURCE_EXHAUSTED /
                        FAILED_PRECONDITION with a message), nothing of it stored
    expect = "either"   ACTIVE or a clean refusal are both acceptable (a truncated PDF may still
                        have a readable first page; invalid UTF-8 is still text)

Never allowed, whatever the input: INTERNAL, UNKNOWN, a crashed or hung server, a document left
PROCESSING/PENDING, or a chunk of a refused document left in the store.

The real-world corpus lives in ../shared/eval/docs (see `corpus_files`).
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.hostile_docx import (
    docx_bad_crc,
    docx_bomb,
    docx_encrypted_entry,
    docx_lying_bomb,
    docx_many_entries,
    docx_unsupported_compression,
    docx_with_broken_xml,
    empty_body_docx,
    small_docx,
    zip_named_docx_without_document,
)
from tests.support.hostile_types import MEDIA_DOCX, MEDIA_HTML, MEDIA_MARKDOWN, MEDIA_PDF, MEDIA_TEXT, HostileInput

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO.parent / "shared" / "eval" / "docs"

# --- the real corpus -------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusFile:
    path: Path
    relative: str  # e.g. "pdf/pypdf__encrypted-file.pdf"
    facts: dict  # the inventory.jsonl row

    @property
    def password(self) -> str:
        return str(self.facts.get("password", "") or "")

    @property
    def encrypted(self) -> bool:
        return bool(self.facts.get("encrypted"))

    @property
    def document_id(self) -> str:
        stem = self.relative.replace("/", "-")
        return "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in stem)[:128]


def corpus_inventory() -> dict[str, dict]:
    path = CORPUS / "inventory.jsonl"
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["file"]: row for row in rows}


def corpus_files(kinds: tuple[str, ...] = ("pdf", "docx", "html", "markdown", "other")) -> list[CorpusFile]:
    """Every document of the shared corpus (groundtruth/ is reference text, not a document)."""
    inventory = corpus_inventory()
    found: list[CorpusFile] = []
    for kind in kinds:
        folder = CORPUS / kind
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.is_file():
                relative = f"{kind}/{path.name}"
                found.append(CorpusFile(path, relative, inventory.get(relative, {})))
    return found


# --- PDFs ---------------------------------------------------------------------------------


def _pdf_object_stream(objects: list[bytes]) -> bytes:
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(f"{number} 0 obj\n".encode() + body + b"\nendobj\n")
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    for offset in offsets:
        out.write(f"{offset:010d} 00000 n \n".encode())
    out.write(f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode())
    return out.getvalue()


def minimal_pdf(lines: list[str]) -> bytes:
    """A valid one-page PDF with the given text lines (Helvetica), built by hand."""
    text_ops = ["BT", "/F1 11 Tf", "14 TL", "72 760 Td"]
    for line in lines:
        escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        text_ops.append(f"({escaped}) Tj T*")
    text_ops.append("ET")
    stream = "\n".join(text_ops).encode("latin-1", "replace")
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        f"<< /Length {len(stream)} >>\nstream\n".encode() + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    return _pdf_object_stream(objects)


SAMPLE_LINES = [f"Line {i}: the pelican survey counted birds near the northern lake shore." for i in range(40)]


def truncated_pdfs(source: bytes, fractions: tuple[float, ...] = (0.05, 0.3, 0.6, 0.95)) -> Iterator[HostileInput]:
    for fraction in fractions:
        cut = max(9, int(len(source) * fraction))
        yield HostileInput(f"truncated-{int(fraction * 100)}pct.pdf", source[:cut], "truncated.pdf", MEDIA_PDF)


def corrupted_pdfs(source: bytes, seed: int, count: int = 6) -> Iterator[HostileInput]:
    """Random byte flips, zeroed ranges and shuffled blocks after the header."""
    rng = random.Random(seed)
    for index in range(count):
        data = bytearray(source)
        mode = index % 3
        if mode == 0:
            for _ in range(max(1, len(data) // 50)):
                data[rng.randrange(16, len(data))] = rng.randrange(256)
        elif mode == 1:
            start = rng.randrange(16, len(data) - 1)
            end = min(len(data), start + rng.randrange(1, max(2, len(data) // 4)))
            data[start:end] = bytes(end - start)
        else:
            blocks = [bytes(data[i : i + 97]) for i in range(16, len(data), 97)]
            rng.shuffle(blocks)
            data = bytearray(bytes(data[:16]) + b"".join(blocks))
        yield HostileInput(f"corrupted-{index}-mode{mode}.pdf", bytes(data), "corrupted.pdf", MEDIA_PDF)


def random_bytes_named_pdf(seed: int, sizes: tuple[int, ...] = (1, 100, 4096, 200_000)) -> Iterator[HostileInput]:
    rng = random.Random(seed)
    for size in sizes:
        yield HostileInput(f"random-{size}.pdf", rng.randbytes(size), "random.pdf", MEDIA_PDF, expect="refuse")
    # a PDF header followed by garbage: sniffed as PDF, must be refused as unreadable
    yield HostileInput(
        "pdf-header-garbage.pdf", b"%PDF-1.7\n" + rng.randbytes(50_000), "garbage.pdf", MEDIA_PDF, expect="refuse"
    )


def pdf_with_huge_page_tree(pages: int = 5000) -> HostileInput:
    """Many empty pages: no text anywhere (refused as NO_TEXT or over the page limit)."""
    kids = " ".join(f"{3 + i} 0 R" for i in range(pages))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", f"<< /Type /Pages /Kids [{kids}] /Count {pages} >>".encode()]
    objects += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>"] * pages
    return HostileInput(
        f"empty-pages-{pages}.pdf", _pdf_object_stream(objects), "pages.pdf", MEDIA_PDF, expect="refuse"
    )


# --- HTML, text -------------------------------------------------------------------------------


def deep_html(depth: int = 100_000) -> HostileInput:
    body = b"<div>" * depth + b"deep text about herons at the bottom" + b"</div>" * depth
    return HostileInput(
        f"html-depth-{depth}.html", b"<!DOCTYPE html><html><body>" + body + b"</body></html>", "deep.html", MEDIA_HTML
    )


def unclosed_deep_html(depth: int = 100_000) -> HostileInput:
    return HostileInput(
        f"html-unclosed-{depth}.html",
        b"<html><body>" + b"<span><b><i>" * (depth // 3) + b"x",
        "unclosed.html",
        MEDIA_HTML,
    )


def invalid_utf8() -> list[HostileInput]:
    text = b"Herons hunt fish in shallow water. " * 20
    return [
        HostileInput(
            "invalid-utf8-bytes.txt",
            text + b"\xff\xfe\xfd\xc3\x28\xa0\xa1\xe2\x28\xa1" * 50 + text,
            "bad.txt",
            MEDIA_TEXT,
        ),
        HostileInput("lone-surrogates.txt", text + b"\xed\xa0\x80\xed\xbf\xbf" * 30, "surrogates.txt", MEDIA_TEXT),
        HostileInput(
            "overlong-utf8.md", b"# Title\n\n" + b"\xc0\xaf\xe0\x80\xaf" * 100 + text, "overlong.md", MEDIA_MARKDOWN
        ),
        HostileInput(
            "invalid-utf8.html",
            b"<html><body><p>" + text + b"\xff\xfe\x80" * 40 + b"</p></body></html>",
            "bad.html",
            MEDIA_HTML,
        ),
    ]


def nul_bytes() -> list[HostileInput]:
    text = b"Storks migrate south in autumn. "
    return [
        HostileInput("nul-sprinkled.txt", (text + b"\x00") * 100, "nul.txt", MEDIA_TEXT),
        HostileInput("nul-only.txt", b"\x00" * 10_000, "nulls.txt", MEDIA_TEXT, expect="refuse"),
        HostileInput("nul-in-markdown.md", b"# Head\x00ing\n\n" + text * 10 + b"\x00\x00", "nul.md", MEDIA_MARKDOWN),
        HostileInput(
            "nul-in-html.html",
            b"<html><body><p>" + text.replace(b" ", b"\x00 ") * 10 + b"</p></body></html>",
            "nul.html",
            MEDIA_HTML,
        ),
    ]


def control_characters() -> HostileInput:
    junk = bytes(range(1, 32)) + b"\x7f" + "\u202e\u200b\ufeff\ufffe".encode()
    return HostileInput("control-chars.txt", (b"Cranes dance. " + junk) * 50, "ctrl.txt", MEDIA_TEXT)


def single_long_line(megabytes: int = 10) -> HostileInput:
    """One line of `megabytes` MiB: words but no newline (and no sentence end)."""
    unit = b"egret heron stork crane ibis spoonbill bittern "
    data = (unit * (megabytes * 1024 * 1024 // len(unit) + 1))[: megabytes * 1024 * 1024]
    return HostileInput(f"single-line-{megabytes}MiB.txt", data, "line.txt", MEDIA_TEXT)


def single_token_line(megabytes: int = 2) -> HostileInput:
    """No whitespace at all: one 'word' of `megabytes` MiB."""
    return HostileInput(f"single-token-{megabytes}MiB.txt", b"x" * (megabytes * 1024 * 1024), "token.txt", MEDIA_TEXT)


def empty_files() -> list[HostileInput]:
    return [
        HostileInput("empty.pdf", b"", "empty.pdf", MEDIA_PDF, expect="refuse"),
        HostileInput("empty.txt", b"", "empty.txt", MEDIA_TEXT, expect="refuse"),
        HostileInput("empty.docx", b"", "empty.docx", MEDIA_DOCX, expect="refuse"),
        HostileInput("empty.html", b"", "empty.html", MEDIA_HTML, expect="refuse"),
        HostileInput("whitespace-only.md", b" \n\t\r\n" * 1000, "blank.md", MEDIA_MARKDOWN, expect="refuse"),
        HostileInput(
            "empty-html-document.html", b"<html><body></body></html>", "blank.html", MEDIA_HTML, expect="refuse"
        ),
        HostileInput("empty-docx-body.docx", empty_body_docx(), "blank.docx", MEDIA_DOCX, expect="refuse"),
    ]


def wrong_media_types() -> list[HostileInput]:
    pdf = minimal_pdf(SAMPLE_LINES[:5])
    docx = small_docx("Kingfishers dive for small fish.")
    html = b"<!DOCTYPE html><html><body><h1>Owls</h1><p>Owls hunt at night.</p></body></html>"
    return [
        HostileInput("pdf-declared-html", pdf, "doc.html", MEDIA_HTML),
        HostileInput("pdf-declared-text", pdf, "doc.txt", MEDIA_TEXT),
        HostileInput("docx-declared-pdf", docx, "doc.pdf", MEDIA_PDF),
        HostileInput("html-declared-pdf", html, "doc.pdf", MEDIA_PDF),
        HostileInput("text-declared-docx", b"Plain words about swifts and swallows.", "doc.docx", MEDIA_DOCX),
        HostileInput("text-declared-image", b"Plain words about swifts and swallows.", "doc.png", "image/png"),
        HostileInput("png-declared-text", b"\x89PNG\r\n\x1a\n" + bytes(500), "img.txt", MEDIA_TEXT, expect="refuse"),
        HostileInput("garbage-media-type", b"Words about wrens.", "doc", "not a / media;; type"),
        HostileInput(
            "elf-declared-markdown", b"\x7fELF\x02\x01\x01" + bytes(300), "prog.md", MEDIA_MARKDOWN, expect="refuse"
        ),
        HostileInput("gzip-declared-html", b"\x1f\x8b\x08\x00" + bytes(100), "page.html", MEDIA_HTML, expect="refuse"),
    ]


def encrypted_pdf_wrong_password(corpus: list[CorpusFile]) -> list[HostileInput]:
    """Encrypted corpus PDFs with a wrong or missing password: refused (PDF_PASSWORD)."""
    found = []
    for item in corpus:
        if item.encrypted and item.password:
            data = item.path.read_bytes()
            found.append(
                HostileInput(
                    f"wrong-password-{item.path.stem}",
                    data,
                    item.path.name,
                    MEDIA_PDF,
                    expect="refuse",
                    password="definitely-not-it",
                )
            )
            found.append(
                HostileInput(f"no-password-{item.path.stem}", data, item.path.name, MEDIA_PDF, expect="refuse")
            )
    return found


def generated_inputs(seed: int = 1234, *, tier: str = "regular") -> list[HostileInput]:
    """The generated hostile inputs.

    tier "small":   everything cheap (no input over ~1 MB, no deep HTML), for the real stack and batches
    tier "regular": + HTML nested 100,000 deep, a 10 MiB single line, the DOCX bombs (the regular suite)
    tier "full":    + unclosed 100,000-deep HTML, a 2 MiB single token, 3,000 empty PDF pages, a DOCX
                    with 20,000 zip entries (--run-reliability)
    """
    pdf = minimal_pdf(SAMPLE_LINES)
    inputs: list[HostileInput] = [HostileInput("valid-control.pdf", pdf, "control.pdf", MEDIA_PDF)]
    inputs += truncated_pdfs(pdf)
    inputs += corrupted_pdfs(pdf, seed)
    inputs += random_bytes_named_pdf(seed)
    inputs += [
        zip_named_docx_without_document(),
        docx_with_broken_xml(),
        docx_bad_crc(),
        docx_unsupported_compression(),
        docx_encrypted_entry(),
    ]
    inputs += invalid_utf8() + nul_bytes() + [control_characters()] + empty_files() + wrong_media_types()
    corpus_pdfs = [c for c in corpus_files(("pdf",)) if c.encrypted and c.password]
    if corpus_pdfs:
        inputs += encrypted_pdf_wrong_password(corpus_pdfs[:2])
    if tier in ("regular", "full"):
        inputs += [deep_html(100_000), single_long_line(10), docx_bomb(400), docx_lying_bomb(300)]
    if tier == "full":
        inputs += [
            unclosed_deep_html(100_000),
            single_token_line(2),
            pdf_with_huge_page_tree(3000),
            docx_many_entries(20_000),
        ]
    return inputs
