"""The .docx archive guard: decompression bombs, damaged entries and unsupported
compression are refused before python-docx inflates anything; Strict OOXML is recognised
for the error message."""

from __future__ import annotations

import io
import zipfile
import zlib

from ingest_service.extract.base import ExtractionLimits
from ragrpc.errors import DocumentParseError, LimitExceededError

_STRICT_W = "http://purl.oclc.org/ooxml/wordprocessingml/main"
_RATIO_GUARD_FROM_BYTES = 20 * 1024 * 1024  # small archives cannot be bombs, whatever their ratio


def check_zip_limits(data: bytes, limits: ExtractionLimits) -> None:
    """Reject decompression bombs before anything is inflated (declared sizes are enforced
    by zipfile when reading, so checking them is sound)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise DocumentParseError(f"the .docx file is not a valid zip archive: {exc}") from exc
    if len(infos) > limits.max_zip_entries:
        raise LimitExceededError(f"the .docx archive has {len(infos)} entries (limit {limits.max_zip_entries})")
    total = sum(info.file_size for info in infos)
    packed = max(1, sum(info.compress_size for info in infos))
    if total > limits.max_docx_uncompressed_bytes:
        raise LimitExceededError(
            f"the .docx file would inflate to {total} bytes (limit {limits.max_docx_uncompressed_bytes}); "
            "refusing a possible decompression bomb"
        )
    if total > _RATIO_GUARD_FROM_BYTES and total / packed > limits.max_docx_compression_ratio:
        raise LimitExceededError(
            f"the .docx file has a compression ratio of {total / packed:.0f} "
            f"(limit {limits.max_docx_compression_ratio:.0f}); refusing a possible decompression bomb"
        )
    _verify_entries(data)


_VERIFY_PIECE = 1024 * 1024


def _verify_entries(data: bytes) -> None:
    """Inflates every entry in bounded pieces, checking its CRC. An archive whose headers lie
    about an entry's size would otherwise be inflated in one piece of up to 2 GiB by
    `ZipFile.read` (python-docx reads whole parts) before its CRC check fails; entries with an
    unsupported compression method or encryption are refused here too."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for info in archive.infolist():
                with archive.open(info) as member:
                    while member.read(_VERIFY_PIECE):
                        pass
    except (
        zipfile.BadZipFile,
        zlib.error,
        NotImplementedError,
        RuntimeError,
        EOFError,
        ValueError,
        OSError,
    ) as exc:
        raise DocumentParseError(f"the .docx archive is damaged: {type(exc).__name__}: {exc}") from exc


def is_strict_ooxml(data: bytes) -> bool:
    """Whether word/document.xml uses the Strict namespace (only a hint for the error message:
    reading the archive again may fail the same way, which must not escape)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            if "word/document.xml" not in archive.namelist():
                return False
            with archive.open("word/document.xml") as member:
                return _STRICT_W.encode() in member.read(4096)
    except Exception:  # noqa: BLE001
        return False
