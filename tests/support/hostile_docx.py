"""Hostile .docx files built from scratch: decompression bombs (honest and lying about their size),
bad CRCs, unsupported compression, encrypted entries, broken XML, a zip without a document, and
20,000 entries. Part of the generated hostile inputs (tests/support/hostile_inputs.py)."""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Iterator

from tests.support.hostile_types import MEDIA_DOCX, HostileInput

_CONTENT_TYPES = (
    b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    b'<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
    b'<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
    b'<Default Extension="xml" ContentType="application/xml"/>'
    b'<Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-'
    b'officedocument.wordprocessingml.document.main+xml"/></Types>'
)
_RELS = (
    b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    b'<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
    b'<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/'
    b'officeDocument" Target="word/document.xml"/></Relationships>'
)
_DOC_HEAD = (
    b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>'
)
_DOC_TAIL = b"</w:body></w:document>"


def _docx(document_xml_parts: Iterator[bytes] | list[bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", _CONTENT_TYPES)
        archive.writestr("_rels/.rels", _RELS)
        with archive.open("word/document.xml", "w", force_zip64=True) as member:
            for part in document_xml_parts:
                member.write(part)
    return out.getvalue()


def docx_bomb(uncompressed_mb: int = 400) -> HostileInput:
    """A .docx whose word/document.xml inflates to `uncompressed_mb` MiB of one repeated
    paragraph (ratio ~1000:1): the decompression-bomb guard must refuse it."""
    paragraph = b"<w:p><w:r><w:t>" + b"A" * 4000 + b"</w:t></w:r></w:p>"
    block = paragraph * 256  # ~1 MiB

    def parts() -> Iterator[bytes]:
        yield _DOC_HEAD
        for _ in range(uncompressed_mb):
            yield block
        yield _DOC_TAIL

    return HostileInput(
        f"docx-bomb-{uncompressed_mb}MiB.docx", _docx(parts()), "bomb.docx", MEDIA_DOCX, expect="refuse"
    )


def _patch_zip_entry(
    data: bytes, name: str, *, uncompressed_size: int | None = None, method: int | None = None, flags: int | None = None
) -> bytes:
    """Rewrites fields of one entry in both its local header and the central directory,
    so the archive lies about it consistently (zipfile trusts these fields)."""
    patched = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = archive.getinfo(name)
    local = info.header_offset
    assert patched[local : local + 4] == b"PK\x03\x04"
    central = patched.find(b"PK\x01\x02")
    while central != -1:
        name_length = struct.unpack_from("<H", patched, central + 28)[0]
        if bytes(patched[central + 46 : central + 46 + name_length]) == name.encode():
            break
        central = patched.find(b"PK\x01\x02", central + 4)
    assert central != -1
    for _field, local_field, central_field, fmt, value in (
        ("size", 22, 24, "<I", uncompressed_size),
        ("method", 8, 10, "<H", method),
        ("flags", 6, 8, "<H", flags),
    ):
        if value is not None:
            struct.pack_into(fmt, patched, local + local_field, value)
            struct.pack_into(fmt, patched, central + central_field, value)
    return bytes(patched)


def docx_lying_bomb(uncompressed_mb: int = 300, declared_bytes: int = 5000) -> HostileInput:
    """A bomb whose zip headers claim word/document.xml is `declared_bytes` long while its
    deflate stream inflates to `uncompressed_mb` MiB: the size guard sees a tiny archive, so
    the reader itself must stop at the declared size (zipfile then fails the CRC check)."""
    paragraph = b"<w:p><w:r><w:t>" + b"A" * 4000 + b"</w:t></w:r></w:p>"
    block = paragraph * 256
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", _CONTENT_TYPES)
        archive.writestr("_rels/.rels", _RELS)
        with archive.open("word/document.xml", "w") as member:
            member.write(_DOC_HEAD)
            for _ in range(uncompressed_mb):
                member.write(block)
            member.write(_DOC_TAIL)
    data = _patch_zip_entry(out.getvalue(), "word/document.xml", uncompressed_size=declared_bytes)
    return HostileInput(f"docx-lying-bomb-{uncompressed_mb}MiB.docx", data, "lying.docx", MEDIA_DOCX, expect="refuse")


def docx_bad_crc() -> HostileInput:
    """A small .docx whose document.xml fails its CRC check (one flipped byte of the entry's data)."""
    data = small_docx("Grebes build floating nests. " * 200)
    return HostileInput(
        "docx-lying-size.docx",
        _patch_zip_entry(data, "word/document.xml", uncompressed_size=100),
        "crc.docx",
        MEDIA_DOCX,
        expect="refuse",
    )


def docx_unsupported_compression() -> HostileInput:
    """word/document.xml claims compression method 99 (AES), which zipfile cannot read."""
    data = _patch_zip_entry(small_docx("Coots dive for weeds."), "word/document.xml", method=99)
    return HostileInput("docx-method-99.docx", data, "method.docx", MEDIA_DOCX, expect="refuse")


def docx_encrypted_entry() -> HostileInput:
    """word/document.xml flagged as encrypted (general-purpose flag bit 0)."""
    data = _patch_zip_entry(small_docx("Rails hide in reeds."), "word/document.xml", flags=0x1)
    return HostileInput("docx-encrypted-entry.docx", data, "encrypted.docx", MEDIA_DOCX, expect="refuse")


def small_docx(text: str) -> bytes:
    return _docx([_DOC_HEAD, b"<w:p><w:r><w:t>" + text.encode() + b"</w:t></w:r></w:p>", _DOC_TAIL])


def zip_named_docx_without_document() -> HostileInput:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("hello.txt", "not a word document")
    return HostileInput("zip-without-word.docx", out.getvalue(), "fake.docx", MEDIA_DOCX, expect="refuse")


def docx_with_broken_xml() -> HostileInput:
    return HostileInput(
        "docx-broken-xml.docx",
        _docx([_DOC_HEAD, b"<w:p><w:r><w:t>unclosed"]),
        "broken.docx",
        MEDIA_DOCX,
        expect="refuse",
    )


def docx_many_entries(entries: int = 20_000) -> HostileInput:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("[Content_Types].xml", _CONTENT_TYPES)
        archive.writestr("_rels/.rels", _RELS)
        archive.writestr("word/document.xml", _DOC_HEAD + b"<w:p><w:r><w:t>few words</w:t></w:r></w:p>" + _DOC_TAIL)
        for i in range(entries):
            archive.writestr(f"word/media/x{i}.bin", b"")
    return HostileInput(f"docx-{entries}-entries.docx", out.getvalue(), "entries.docx", MEDIA_DOCX, expect="either")


def empty_body_docx() -> bytes:
    """A well-formed .docx whose body holds nothing."""
    return _docx([_DOC_HEAD, _DOC_TAIL])
