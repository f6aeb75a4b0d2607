"""Authentication (API key -> tenant), tenant isolation over gRPC, TLS and mutual TLS, the
plaintext-on-loopback rule, and configured limits answering with the right codes."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ragrpc.config import Settings
from ragrpc.security import server_credentials
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc
from tests.conftest import FakeStack, running_stack

KEYS = "acme=key-acme-123,globex=key-globex-456"


def stores() -> FakeStack:
    return FakeStack(HashingEmbedder(), InMemoryChunkStore(), InMemoryDocumentRegistry())


def auth(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


async def upload(stub, name: str, content: bytes, metadata=(), **spec):  # type: ignore[no-untyped-def]
    async def messages():  # type: ignore[no-untyped-def]
        yield ingest_pb2.UploadDocumentRequest(header=ingest_pb2.DocumentSpec(file_name=name, **spec))
        yield ingest_pb2.UploadDocumentRequest(data=content)

    return await stub.UploadDocument(messages(), metadata=metadata)


async def test_api_keys_and_tenant_isolation(settings: Settings) -> None:
    secured = dataclasses.replace(settings, api_keys=KEYS)
    async with (
        running_stack(secured, stores()) as stack,
        grpc.aio.insecure_channel(stack.ingest_address) as ingest_channel,
        grpc.aio.insecure_channel(stack.query_address) as query_channel,
    ):
        ingest = ingest_pb2_grpc.IngestServiceStub(ingest_channel)
        health = health_pb2_grpc.HealthStub(ingest_channel)
        reply = await health.Check(health_pb2.HealthCheckRequest())  # health needs no key
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        for metadata in ((), auth("wrong"), (("authorization", "Basic abc"),)):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await upload(ingest, "a.txt", b"secret plans of acme", metadata=metadata)
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        await upload(
            ingest, "a.txt", b"secret plans of acme corporation", document_id="plans", metadata=auth("key-acme-123")
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await ingest.GetDocument(
                ingest_pb2.GetDocumentRequest(document_id="plans"), metadata=auth("key-globex-456")
            )
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        query = retrieve_pb2_grpc.RetrieveServiceStub(query_channel)
        request = retrieve_pb2.RetrieveRequest(
            query="secret plans",
            options=retrieve_pb2.RetrievalOptions(filter=retrieve_pb2.MetadataFilter(document_ids=["plans"])),
        )
        theirs = [r async for r in query.Retrieve(request, metadata=auth("key-globex-456"))]
        assert not [r for r in theirs if r.HasField("chunk")]
        ours = [r async for r in query.Retrieve(request, metadata=auth("key-acme-123"))]
        assert [r.chunk.chunk.document_id for r in ours if r.HasField("chunk")] == ["plans"]


def _certificate(tmp: Path, name: str, issuer: tuple | None = None) -> tuple[Path, Path, object, object]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signer_name, signer_key = (issuer[0], issuer[1]) if issuer else (subject, key)
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(signer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            False,
        )
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), True)
        .sign(signer_key, hashes.SHA256())
    )
    cert_path, key_path = tmp / f"{name}.crt", tmp / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path, subject, key


async def _health(channel: grpc.aio.Channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status


async def test_tls_and_mutual_tls(settings: Settings, tmp_path: Path) -> None:
    ca_cert, _, ca_name, ca_key = _certificate(tmp_path, "ca")
    server_cert, server_key, _, _ = _certificate(tmp_path, "server", (ca_name, ca_key))
    client_cert, client_key, _, _ = _certificate(tmp_path, "client", (ca_name, ca_key))
    mtls = dataclasses.replace(
        settings, tls_cert_file=str(server_cert), tls_key_file=str(server_key), tls_client_ca_file=str(ca_cert)
    )
    async with running_stack(mtls, stores()) as stack:
        with_cert = grpc.ssl_channel_credentials(
            ca_cert.read_bytes(), client_key.read_bytes(), client_cert.read_bytes()
        )
        async with grpc.aio.secure_channel(stack.query_address, with_cert) as channel:
            assert await _health(channel) == health_pb2.HealthCheckResponse.SERVING
        for credentials in (grpc.ssl_channel_credentials(ca_cert.read_bytes()), None):
            channel = (
                grpc.aio.secure_channel(stack.query_address, credentials)
                if credentials
                else grpc.aio.insecure_channel(stack.query_address)
            )
            async with channel:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await _health(channel)
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


def test_plaintext_only_on_loopback() -> None:
    assert server_credentials(Settings(host="127.0.0.1")) is None
    with pytest.raises(ValueError, match="RAGRPC_TLS_CERT_FILE"):
        server_credentials(Settings(host="0.0.0.0"))
    assert server_credentials(Settings(host="0.0.0.0", allow_plaintext_remote=True)) is None


async def test_limits_name_themselves(settings: Settings) -> None:
    tight = dataclasses.replace(
        settings, max_upload_bytes=1000, max_query_chars=50, max_pending_documents=2, max_batch_documents=3
    )
    async with (
        running_stack(tight, stores()) as stack,
        grpc.aio.insecure_channel(stack.ingest_address) as ingest_channel,
        grpc.aio.insecure_channel(stack.query_address) as query_channel,
    ):
        ingest = ingest_pb2_grpc.IngestServiceStub(ingest_channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await upload(ingest, "big.txt", b"x" * 5000)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "RAGRPC_MAX_UPLOAD_BYTES" in caught.value.details()
        docs = [
            ingest_pb2.InlineDocument(spec=ingest_pb2.DocumentSpec(file_name=f"{i}.txt"), content=b"hi")
            for i in range(3)
        ]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            [e async for e in ingest.IngestDocuments(ingest_pb2.IngestDocumentsRequest(documents=docs))]
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "RAGRPC_MAX_PENDING_DOCUMENTS" in caught.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            [e async for e in ingest.IngestDocuments(ingest_pb2.IngestDocumentsRequest(documents=docs * 2))]
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "RAGRPC_MAX_BATCH_DOCUMENTS" in caught.value.details()
        query = retrieve_pb2_grpc.RetrieveServiceStub(query_channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            [r async for r in query.Retrieve(retrieve_pb2.RetrieveRequest(query="why " * 40))]
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "RAGRPC_MAX_QUERY_CHARS" in caught.value.details()


async def test_server_side_deadline(settings: Settings) -> None:
    hurried = dataclasses.replace(settings, query_call_timeout_s=0.000001)
    async with running_stack(hurried, stores()) as stack, grpc.aio.insecure_channel(stack.query_address) as channel:
        query = retrieve_pb2_grpc.RetrieveServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            [r async for r in query.Ask(retrieve_pb2.AskRequest(query="anything at all"))]
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
