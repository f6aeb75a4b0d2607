"""ONNX files of a sentence-transformers model: exported once into a cache directory, in a child process.

    prepare_onnx_model_isolated(source, cache_dir, quantization=...)   what services call
      -> files already there: (model directory, file name), nothing loaded
      -> else `python -m ragrpc.onnx_export` does prepare_onnx_model() in a child process and
         exits, so the caller never holds the export's memory (loading the torch model, tracing it,
         optimising and quantising the graph take hundreds of MiB that the allocator does not give
         back; docs/benchmarks.md)

Files: <cache>/<model slug>-<digest>/onnx/model.onnx (fp32 export), model_O2.onnx (graph
optimised at level O2: fused attention, layer norm and GELU, numerics unchanged) and
model_O2_qint8_<config>.onnx (MatMul and Attention weights dynamically quantised to signed int8
per output channel; 7-bit on x86 CPUs without VNNI, full 8 bits with avx512_vnni and on ARM).
Exports are guarded by a file lock (two services starting together export once) and every file
appears whole or not at all (written aside, then renamed). No network is needed for a local
model directory.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)

QUANTIZATION_CONFIGS = ("avx512_vnni", "avx512", "avx2", "arm64")
EXPORT_TIMEOUT_S = 900.0


def default_onnx_cache_dir() -> Path:
    """~/.cache/ragrpc/onnx (XDG_CACHE_HOME respected), or <tmp>/ragrpc-onnx when not writable."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ragrpc" / "onnx"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / "ragrpc-onnx"


def cpu_quantization_config(cpuinfo: str | None = None) -> str:
    """The dynamic-quantisation config this CPU runs fastest: avx512_vnni when its flags have
    it, arm64 on ARM, else avx2."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "arm64"
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[-1].split())
    return "avx512_vnni" if "avx512_vnni" in flags else "avx2"


def quantized_file_name(quantization: str) -> str:
    return f"model_O2_qint8_{quantization}.onnx"


def export_directory(source: str, cache_dir: Path) -> Path:
    """Where the ONNX files of `source` (a model directory or hub name) live in `cache_dir`."""
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(source).name)[:60] or "model"
    digest = hashlib.sha256(str(Path(source).resolve() if Path(source).exists() else source).encode())
    return cache_dir / f"{slug}-{digest.hexdigest()[:12]}"


def _file_name(quantization: str | None) -> str:
    if quantization is not None and quantization not in QUANTIZATION_CONFIGS:
        raise ValueError(f"unknown quantization config {quantization!r}; use one of {QUANTIZATION_CONFIGS}")
    return "model.onnx" if quantization is None else quantized_file_name(quantization)


def prepare_onnx_model_isolated(source: str, cache_dir: Path, *, quantization: str | None = None) -> tuple[str, str]:
    """prepare_onnx_model's result; when a file is missing, the export runs in a child process.
    Raises RuntimeError with the child's last output when it fails."""
    target = export_directory(source, cache_dir)
    name = _file_name(quantization)
    if (target / "onnx" / "model.onnx").exists() and (target / "onnx" / name).exists():
        return str(target), f"onnx/{name}"
    command = [sys.executable, "-m", "ragrpc.onnx_export", source, str(cache_dir)]
    if quantization is not None:
        command += ["--quantization", quantization]
    logger.info("exporting %s to ONNX (%s) in a child process", source, name)
    done = subprocess.run(command, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"ONNX export of {source} failed (exit {done.returncode}): " + " | ".join(tail))
    directory, file_name = json.loads(done.stdout.strip().splitlines()[-1])
    return str(directory), str(file_name)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on `path` (created if missing) between processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepare_onnx_model(source: str, cache_dir: Path, *, quantization: str | None = None) -> tuple[str, str]:
    """Exports `source` (a model directory or hub name) to ONNX in `cache_dir` unless already
    there; with `quantization` (a config of QUANTIZATION_CONFIGS) also writes the int8 file.
    Returns (model directory, ONNX file name relative to it) to load with backend="onnx"."""
    from sentence_transformers import SentenceTransformer

    name = _file_name(quantization)
    target = export_directory(source, cache_dir)
    with file_lock(cache_dir / f"{target.name}.lock"):
        if not (target / "onnx" / "model.onnx").exists():
            logger.info("exporting %s to ONNX in %s", source, target)
            staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache_dir))
            try:
                SentenceTransformer(source, backend="onnx", device="cpu").save_pretrained(str(staging))
                staging.chmod(0o755)  # mkdtemp makes it owner-only
                if target.exists():
                    shutil.rmtree(target)
                staging.rename(target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        if quantization is not None and not (target / "onnx" / name).exists():
            _optimise_and_quantise(target, quantization, name)
        return str(target), f"onnx/{name}"


def _optimise_and_quantise(target: Path, quantization: str, name: str) -> None:
    """Writes target/onnx/<name>: the O2-optimised graph of target/onnx/model.onnx with MatMul and
    Attention weights dynamically quantised (signed, per channel). Without VNNI, x86 int8 kernels
    multiply unsigned activations by signed weights with a 16-bit intermediate sum that saturates;
    7-bit weights (reduce_range) keep it exact (without them the vectors drift far from fp32's:
    docs/benchmarks.md)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from sentence_transformers import SentenceTransformer, export_optimized_onnx_model

    onnx_dir = target / "onnx"
    optimised = onnx_dir / "model_O2.onnx"
    if not optimised.exists():
        logger.info("optimising %s (O2)", target)
        staging = Path(tempfile.mkdtemp(prefix=".optimise-", dir=target.parent))
        try:
            fp32 = SentenceTransformer(
                str(target), backend="onnx", device="cpu", model_kwargs={"file_name": "onnx/model.onnx"}
            )
            export_optimized_onnx_model(fp32, "O2", str(staging))
            (staging / "onnx" / "model_O2.onnx").replace(optimised)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("quantising %s to int8 (%s)", optimised, quantization)
    partial = onnx_dir / f".{name}.partial"
    quantize_dynamic(
        str(optimised),
        str(partial),
        weight_type=QuantType.QInt8,
        per_channel=True,
        reduce_range=quantization not in ("avx512_vnni", "arm64"),
        op_types_to_quantize=["MatMul", "Attention"],
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},  # types of the fused operators' outputs
    )
    partial.replace(onnx_dir / name)


def main(argv: list[str] | None = None) -> int:
    """python -m ragrpc.onnx_export SOURCE CACHE_DIR [--quantization CONFIG]: prepares the files and
    prints [model directory, file name] as JSON on the last line."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("source", help="model directory or hub name")
    parser.add_argument("cache_dir", help="cache directory of the ONNX files")
    parser.add_argument("--quantization", choices=QUANTIZATION_CONFIGS, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    result = prepare_onnx_model(args.source, Path(args.cache_dir), quantization=args.quantization)
    print(json.dumps(list(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
