"""What the hostile-input tests share: the corpus files that can only be refused, the generated
inputs as upload items, and the deadline of one call."""

from __future__ import annotations

import functools
import time

import pytest

from ragrpc.v1 import ingest_pb2
from tests.support import hostile_inputs as hi

CALL_DEADLINE_S = 300.0  # generous: 2 shared cores; a hang is far beyond this
# Files that can only be refused, whatever the implementation (no text, empty, unsupported).
MUST_REFUSE = {
    "pdf/pdfplumber__empty.pdf": "INVALID_ARGUMENT",
    "docx/docling__Strict.docx": "INVALID_ARGUMENT",
    "other/docling__powerpoint_sample.pptx": "INVALID_ARGUMENT",
    "other/docling__xlsx_01.xlsx": "INVALID_ARGUMENT",
    "pdf/docling__ocr_test.pdf": "INVALID_ARGUMENT",
    "pdf/docling__nemotron_multipage.pdf": "INVALID_ARGUMENT",
}

needs_corpus = pytest.mark.skipif(not hi.CORPUS.is_dir(), reason=f"corpus {hi.CORPUS} is missing")

UploadItem = tuple[str, str, str, bytes, ingest_pb2.DocumentSpec]  # label, document id, expected, content, spec


def hostile_items(inputs: list[hi.HostileInput]) -> list[UploadItem]:
    return [
        (
            h.name,
            h.document_id,
            h.expect,
            h.content,
            ingest_pb2.DocumentSpec(
                file_name=h.file_name, media_type=h.media_type, document_id=h.document_id, password=h.password
            ),
        )
        for h in inputs
    ]


@functools.cache
def generate(tier: str) -> list[hi.HostileInput]:
    started = time.monotonic()
    inputs = hi.generated_inputs(seed=20240611, tier=tier)
    print(
        f"\ngenerated {len(inputs)} hostile inputs, tier {tier} ({sum(len(h.content) for h in inputs) / 1e6:.1f} MB)"
        f" in {time.monotonic() - started:.1f}s"
    )
    return inputs
