"""The language enricher: a document's language (stated by its file, or guessed from its stop words) as
chunk metadata `language`, which a collection declaring the key filters on."""

from __future__ import annotations

import dataclasses

from ingest_service.app import build_components
from ingest_service.requests import DocumentSpecInput, IngestItem
from ragrpc.config import Settings
from ragrpc.enrich import DocumentSample
from ragrpc.enrich.language import LanguageEnricher
from ragrpc.store.metadata_fields import MetadataFields
from ragrpc.store.request_filter import MetadataCondition, filter_from_request
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry

GERMAN = "Die Kinder spielen im Garten, und der Hund ist nicht bei ihnen. Es ist ein schöner Tag für die Familie. " * 3
ENGLISH = "The children play in the garden and the dog is not with them. It is a fine day for the family. " * 3


def test_the_language_is_a_lower_case_code_or_nothing() -> None:
    enricher = LanguageEnricher()
    assert dict(enricher.enrich(DocumentSample("x", language="de")).facts) == {"language": "de"}
    assert dict(enricher.enrich(DocumentSample("x", language="en-US")).facts) == {"language": "en"}
    assert dict(enricher.enrich(DocumentSample("x", language="pt_BR")).facts) == {"language": "pt"}
    for unknown in ("", "  ", "x", "english language", "日本"):
        assert dict(enricher.enrich(DocumentSample("x", language=unknown)).facts) == {}, unknown
    assert enricher.header_terms({"language": "de"}, "Title") == ""


async def test_documents_are_filtered_by_the_language_they_are_written_in() -> None:
    fields = MetadataFields(("language",))
    chunks, registry = InMemoryChunkStore(metadata_fields=fields), InMemoryDocumentRegistry()
    settings = dataclasses.replace(Settings(), workers=2, enrichers="language", metadata_filter_keys="language")
    ingest = build_components(settings, HashingEmbedder(), chunks, registry)
    html = b'<html lang="fr-CA"><head><title>Jardin</title></head><body><p>Les enfants jouent.</p></body></html>'
    for document_id, file_name, content in (
        ("de", "garten.txt", GERMAN.encode()),
        ("en", "garden.txt", ENGLISH.encode()),
        ("fr", "jardin.html", html),
        ("short", "note.txt", b"Ok."),
    ):
        await ingest.pipeline.ingest(
            IngestItem("t1", DocumentSpecInput(document_id=document_id, file_name=file_name), content)
        )
    record = registry.get("t1", "fr")
    assert record is not None and record.language == "fr" and record.metadata["language"] == "fr"

    def documents(*languages: str) -> set[str]:
        expr = filter_from_request("t1", metadata=[MetadataCondition("language", languages)], fields=fields)
        return {c.document_id for c in chunks.query_chunks(expr, limit=100)}

    assert documents("de") == {"de"} and documents("en", "fr") == {"en", "fr"} and documents("it") == set()
    ingest.shutdown()
