"""Memory of the ingest service under many large uploads at once: 16 concurrent uploads of
100 MiB each (the default RAGRPC_MAX_UPLOAD_BYTES) into a real ingest service process (with a
milvus-lite server), the resident memory of that process sampled every 50 ms.

Two runs of the same load: the defaults (uploads spooled to disk past RAGRPC_UPLOAD_MEMORY_BYTES,
at most RAGRPC_EXTRACTION_MEMORY_BYTES read back for extraction at once) and everything held in
memory (both settings above the load), which is how uploads were handled before spooling.

The uploads are random bytes, refused (UNSUPPORTED_MEDIA_TYPE) once read back: what is measured is
receiving, holding and reading back 1.6 GiB at once, not parsing; a parser's own memory comes on
top for the documents extracted at once (bounded by the extraction budget).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc
from scripts.bench.common import BenchConfig, SectionResult
from scripts.processes import Stack

MIB = 1 << 20


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def _upload(address: str, index: int, content: bytes) -> str:
    def messages() -> Iterator[ingest_pb2.UploadDocumentRequest]:
        header = ingest_pb2.DocumentSpec(document_id=f"big-{index}", file_name=f"big-{index}.bin")
        yield ingest_pb2.UploadDocumentRequest(header=header)
        for start in range(0, len(content), MIB):
            yield ingest_pb2.UploadDocumentRequest(data=content[start : start + MIB])

    options = [("grpc.max_send_message_length", 8 * MIB)]
    with grpc.insecure_channel(address, options=options) as channel:
        try:
            ingest_pb2_grpc.IngestServiceStub(channel).UploadDocument(messages(), timeout=600)
            return "OK"
        except grpc.RpcError as exc:
            return exc.code().name


def _one_run(config: BenchConfig, name: str, env: dict[str, str], uploads: int, size: int) -> dict[str, float]:
    root = config.bench_dir / f"uploads-{name}"
    shutil.rmtree(root, ignore_errors=True)
    with Stack(root, env={"RAGRPC_COLLECTION_PREFIX": "bench_uploads", **env}) as stack:
        stack.start_milvus()
        address = stack.start_ingest()
        pid = stack.processes["ingest"].pid
        time.sleep(2.0)
        baseline = _rss_kib(pid)
        peak = baseline
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, _rss_kib(pid))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        content = os.urandom(size)
        started = time.perf_counter()
        with ThreadPoolExecutor(uploads) as pool:
            codes = list(pool.map(lambda i: _upload(address, i, content), range(uploads)))
        elapsed = time.perf_counter() - started
        done.set()
        sampler.join()
    return {
        "baseline_mib": baseline / 1024,
        "peak_mib": peak / 1024,
        "growth_mib": (peak - baseline) / 1024,
        "seconds": elapsed,
        "refused_as_expected": float(all(code == "INVALID_ARGUMENT" for code in codes)),
    }


def run(config: BenchConfig) -> SectionResult:
    result = SectionResult("uploads")
    uploads, size = (4, 20 * MIB) if config.quick else (16, 100 * MIB - 4096)
    runs = {
        "spooled": {},
        "in_memory": {
            "RAGRPC_UPLOAD_MEMORY_BYTES": str(2 * size),
            "RAGRPC_EXTRACTION_MEMORY_BYTES": str(uploads * size * 2),
        },
    }
    for name, env in runs.items():
        figures = _one_run(config, name, env, uploads, size)
        result.data[name] = figures
        result.add(f"{name}: peak RSS", figures["peak_mib"], "MiB", note=f"{uploads} x {size / MIB:.0f} MiB at once")
        result.add(f"{name}: RSS growth", figures["growth_mib"], "MiB", note=f"baseline {figures['baseline_mib']:.0f}")
        result.add(f"{name}: all uploads", figures["seconds"], "s")
        if not figures["refused_as_expected"]:
            result.notes.append(f"{name}: not every upload was refused as UNSUPPORTED_MEDIA_TYPE")
    spooled, in_memory = result.data["spooled"]["growth_mib"], result.data["in_memory"]["growth_mib"]
    if spooled > 0:
        result.notes.append(f"spooling holds {in_memory / spooled:.1f}x less memory for the same load")
    return result
