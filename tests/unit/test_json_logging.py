"""JsonLogFormatter: one valid JSON object per line, with the request id of the call."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import grpc
import pytest

from ragrpc.logging_setup import JsonLogFormatter
from ragrpc.request_context import FixedTenantResolver, RequestContextInterceptor, RequestIdLogFilter


@pytest.fixture
def captured() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLogFormatter("query"))
    handler.addFilter(RequestIdLogFilter())
    logger = logging.getLogger("tests.json_logging")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield logger, stream
    finally:
        logger.removeHandler(handler)
        logger.propagate = True


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_record_is_one_json_line_with_every_field(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    logger.info("embedded %d chunks\nin %s", 3, "0.2s", extra={"document_id": "doc-1"})
    [line] = _lines(stream)
    assert line["message"] == "embedded 3 chunks\nin 0.2s"
    assert (line["level"], line["service"], line["logger"]) == ("INFO", "query", "tests.json_logging")
    assert line["request_id"] == "-"  # outside a call
    assert line["document_id"] == "doc-1"
    assert str(line["ts"]).endswith("+00:00") and "T" in str(line["ts"])
    assert "exception" not in line


def test_an_exception_is_carried_as_text(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured
    try:
        raise ValueError("bad chunk")
    except ValueError:
        logger.exception("ingest failed")
    [line] = _lines(stream)
    assert line["level"] == "ERROR"
    assert "Traceback" in str(line["exception"]) and "ValueError: bad chunk" in str(line["exception"])


async def test_a_record_inside_a_call_carries_its_request_id(captured: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = captured

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        logger.warning("handling %r", request)
        return request

    server = grpc.aio.server(interceptors=[RequestContextInterceptor(FixedTenantResolver("default"))])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.v1.EchoService", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/test.v1.EchoService/Echo")
            assert await call(b"hi", metadata=(("x-request-id", "req-42"),)) == b"hi"
    finally:
        await server.stop(0)
    [line] = _lines(stream)
    assert line["request_id"] == "req-42"
    assert line["message"] == "handling b'hi'"
