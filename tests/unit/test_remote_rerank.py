"""The remote rerank provider against a real local HTTP rerank server (tests/support/rerank_server.py):
both request shapes, ordering and scores, top_n, every failure (with its cause, warning and count),
the time limit and the RPC deadline, and the settings' validation."""

from __future__ import annotations

import dataclasses
import functools
import logging
import socket
import time
from collections.abc import Iterator

import pytest

from query_service.app import build_reranker, reranker_provider
from query_service.remote_rerank import RemoteRerankConfig, RemoteReranker
from query_service.rerank import Reranker, RerankUnavailableError
from ragrpc.config import Settings
from ragrpc.metrics import Metrics
from ragrpc.models import ChunkRecord, ScoredChunk, StageScores
from tests.support.rerank_server import Behaviour, RerankServer

QUERY = "milvus vector database search"
TEXTS = [
    "Paris is the capital of France.",  # 0 of the query's 4 words
    "Milvus is a vector database.",  # 3
    "A vector search engine.",  # 2
    "Database search with a vector database and Milvus search.",  # 4
    "Search tips.",  # 1
]
EXPECTED_ORDER = ["c3", "c1", "c2", "c4", "c0"]
EXPECTED_SCORES = [1.0, 0.75, 0.5, 0.25, 0.0]


def hit(chunk_id: str, text: str, score: float) -> ScoredChunk:
    chunk = ChunkRecord(
        chunk_id=chunk_id,
        document_id="d",
        tenant="t",
        collection="c",
        generation="g",
        text=text,
        vector=[],
        chunk_index=0,
        chunker="test",
    )
    return ScoredChunk(chunk=chunk, score=score, scores=StageScores(dense=score, fused=score))


def fused_hits() -> list[ScoredChunk]:
    return [hit(f"c{i}", text, 1.0 - i / 10) for i, text in enumerate(TEXTS)]


@pytest.fixture
def server() -> Iterator[RerankServer]:
    with RerankServer() as running:
        yield running


def remote(url: str, api: str = "cohere", *, failures: list[str] | None = None, **options: object) -> RemoteReranker:
    config = RemoteRerankConfig(url=url, api=api, model=str(options.pop("model", "rerank-test")))
    config = dataclasses.replace(config, **options)  # type: ignore[arg-type]
    return RemoteReranker(config, on_failure=failures.append if failures is not None else None)


def endpoint(server: RerankServer, api: str) -> str:
    return server.url + ("/rerank" if api == "tei" else "/v1/rerank")


@pytest.mark.parametrize("api", ["cohere", "tei"])
def test_the_servers_order_and_scores_are_applied(server: RerankServer, api: str) -> None:
    reranker: Reranker = remote(endpoint(server, api), api)
    hits = fused_hits()
    ranked = reranker.rerank(QUERY, hits, top_n=5)
    assert [h.chunk.chunk_id for h in ranked] == EXPECTED_ORDER
    assert [h.score for h in ranked] == EXPECTED_SCORES
    for h in ranked:
        original = hits[int(h.chunk.chunk_id[1:])]
        assert h.scores.rerank == h.score and h.chunk is original.chunk
        assert (h.scores.dense, h.scores.fused) == (original.score, original.score)  # earlier stages kept
    assert hits[0].scores.rerank is None  # inputs untouched
    (request,) = server.requests
    if api == "cohere":
        assert request.path == "/v1/rerank"
        assert request.body == {
            "model": "rerank-test",
            "query": QUERY,
            "documents": TEXTS,
            "top_n": 5,
            "return_documents": False,
        }
    else:
        assert request.path == "/rerank"
        assert request.body == {"query": QUERY, "texts": TEXTS, "truncate": True}
    assert request.headers["content-type"] == "application/json"
    assert "authorization" not in request.headers


@pytest.mark.parametrize("api", ["cohere", "tei"])
def test_top_n_is_respected(server: RerankServer, api: str) -> None:
    reranker = remote(endpoint(server, api), api)
    ranked = reranker.rerank(QUERY, fused_hits(), top_n=2)
    assert [h.chunk.chunk_id for h in ranked] == EXPECTED_ORDER[:2]
    everything = reranker.rerank(QUERY, fused_hits(), top_n=50)  # more than there are: all of them
    assert [h.chunk.chunk_id for h in everything] == EXPECTED_ORDER
    if api == "cohere":
        assert [r.body["top_n"] for r in server.requests] == [2, 5]
    assert reranker.rerank(QUERY, fused_hits(), top_n=0) == []
    assert reranker.rerank(QUERY, [], top_n=3) == []
    assert len(server.requests) == 2  # nothing to rerank: no call


def test_model_is_left_out_when_empty_and_the_key_is_sent(server: RerankServer) -> None:
    settings = dataclasses.replace(
        Settings(), reranker_url=endpoint(server, "cohere"), reranker_api_key_env="TEST_RERANK_KEY"
    )
    config = RemoteRerankConfig.from_settings(settings, env={"TEST_RERANK_KEY": "sk-secret"})
    assert config.api_key == "sk-secret" and "sk-secret" not in repr(config)
    RemoteReranker(config).rerank(QUERY, fused_hits(), top_n=3)
    (request,) = server.requests
    assert request.headers["authorization"] == "Bearer sk-secret"
    assert "model" not in request.body and request.body["top_n"] == 3


FAILURES = [
    (Behaviour.error(500), "cohere", "http_status", "HTTP 500: "),
    (Behaviour.error(503), "tei", "http_status", "HTTP 503: "),
    (Behaviour.error(401), "cohere", "http_status", "HTTP 401: "),
    (Behaviour.malformed("not_json"), "cohere", "malformed", "response is not JSON"),
    (Behaviour.malformed("no_results"), "cohere", "malformed", "results is not a list"),
    (Behaviour.malformed("no_results"), "tei", "malformed", "response is not a list"),
    (Behaviour.malformed("bad_score"), "cohere", "malformed", "no finite relevance_score"),
    (Behaviour.malformed("bad_score"), "tei", "malformed", "no finite score"),
    (Behaviour.wrong_indexes("out_of_range"), "cohere", "bad_indexes", "index 10 for 5 documents"),
    (Behaviour.wrong_indexes("duplicate"), "tei", "bad_indexes", "appears twice"),
    (Behaviour.wrong_indexes("missing"), "cohere", "bad_indexes", "4 results where 5 were asked for"),
    (Behaviour.wrong_indexes("missing"), "tei", "bad_indexes", "4 results where 5 were asked for"),
    (Behaviour.drop(), "cohere", "connection", "RemoteDisconnected"),
]


@pytest.mark.parametrize(("behaviour", "api", "cause", "detail"), FAILURES)
def test_failures_raise_with_their_cause_are_logged_and_counted(
    server: RerankServer, caplog: pytest.LogCaptureFixture, behaviour: Behaviour, api: str, cause: str, detail: str
) -> None:
    server.set_default(behaviour)
    failures: list[str] = []
    reranker = remote(endpoint(server, api), api, failures=failures)
    with caplog.at_level(logging.WARNING, logger="query_service.remote_rerank"):
        with pytest.raises(RerankUnavailableError) as caught:
            reranker.rerank(QUERY, fused_hits(), top_n=5)
    error = caught.value
    assert error.cause == cause and detail in error.detail, error.detail
    assert error.summary == f"rerank failed ({cause}): {error.detail}; fused order kept"
    assert failures == [cause]
    (record,) = [r for r in caplog.records if r.name == "query_service.remote_rerank"]
    assert record.levelno == logging.WARNING and cause in record.getMessage() and server.url in record.getMessage()
    assert len(server.requests) == 1


def test_connection_refused_is_a_connection_failure() -> None:
    with socket.socket() as probe:  # a port that nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    failures: list[str] = []
    with pytest.raises(RerankUnavailableError) as caught:
        remote(f"http://127.0.0.1:{port}/v1/rerank", failures=failures).rerank(QUERY, fused_hits(), top_n=5)
    assert caught.value.cause == "connection" and "ConnectionRefusedError" in caught.value.detail
    assert failures == ["connection"]


def test_a_slow_server_times_out_after_the_configured_timeout(server: RerankServer) -> None:
    server.set_default(Behaviour.slow(10.0))
    reranker = remote(endpoint(server, "cohere"), timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(RerankUnavailableError) as caught:
        reranker.rerank(QUERY, fused_hits(), top_n=5)
    elapsed = time.monotonic() - started
    assert caught.value.cause == "timeout" and "RAGRPC_RERANKER_TIMEOUT_S" in caught.value.detail
    assert 0.25 <= elapsed < 1.5, elapsed


def test_the_rpc_deadline_caps_the_timeout(server: RerankServer) -> None:
    server.set_default(Behaviour.slow(10.0))
    config = RemoteRerankConfig(url=endpoint(server, "cohere"), timeout_s=30.0)
    reranker = RemoteReranker(config, time_left=lambda: 0.5, deadline_reserve_s=0.1)
    started = time.monotonic()
    with pytest.raises(RerankUnavailableError) as caught:
        reranker.rerank(QUERY, fused_hits(), top_n=5)
    elapsed = time.monotonic() - started
    assert caught.value.cause == "deadline" and "the request's deadline" in caught.value.detail
    assert 0.35 <= elapsed < 0.5, elapsed  # 0.5s left less the 0.1s reserve


def test_no_call_when_the_deadline_leaves_no_time(server: RerankServer) -> None:
    config = RemoteRerankConfig(url=endpoint(server, "cohere"))
    for left in (0.05, -1.0):
        reranker = RemoteReranker(config, time_left=functools.partial(float, left), deadline_reserve_s=0.1)
        with pytest.raises(RerankUnavailableError) as caught:
            reranker.rerank(QUERY, fused_hits(), top_n=5)
        assert caught.value.cause == "deadline" and "left before the request's deadline" in caught.value.detail
    assert server.requests == []
    plenty = RemoteReranker(config, time_left=lambda: 60.0)  # far deadline: the configured timeout applies
    assert [h.chunk.chunk_id for h in plenty.rerank(QUERY, fused_hits(), top_n=5)] == EXPECTED_ORDER


def env_settings(**env: str) -> Settings:
    return Settings.from_env(env)


def test_provider_is_inferred_and_built() -> None:
    assert Settings().reranker_provider == "auto" and reranker_provider(Settings()) == "none"
    assert build_reranker(Settings()) is None
    url = "http://127.0.0.1:9/v1/rerank"
    assert reranker_provider(env_settings(RAGRPC_RERANKER_URL=url)) == "remote"
    assert reranker_provider(env_settings(RAGRPC_RERANKER_MODEL="cross-encoder/ms-marco")) == "local"
    both = env_settings(RAGRPC_RERANKER_URL=url, RAGRPC_RERANKER_MODEL="rerank-v3.5")
    assert reranker_provider(both) == "remote"  # the model is the name sent to the API
    none = env_settings(RAGRPC_RERANKER_PROVIDER="none", RAGRPC_RERANKER_URL=url)
    assert build_reranker(none) is None
    built = build_reranker(
        env_settings(RAGRPC_RERANKER_URL=url, RAGRPC_RERANKER_API="TEI", RAGRPC_RERANKER_TIMEOUT_S="1.5"), Metrics()
    )
    assert isinstance(built, RemoteReranker)
    assert (built.config.url, built.config.api, built.config.timeout_s) == (url, "tei", 1.5)


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"RAGRPC_RERANKER_PROVIDER": "cloud"}, "RAGRPC_RERANKER_PROVIDER"),
        ({"RAGRPC_RERANKER_PROVIDER": "remote"}, "RAGRPC_RERANKER_URL"),
        ({"RAGRPC_RERANKER_PROVIDER": "local"}, "RAGRPC_RERANKER_MODEL"),
        ({"RAGRPC_RERANKER_URL": "ftp://reranker/rerank"}, "RAGRPC_RERANKER_URL"),
        ({"RAGRPC_RERANKER_URL": "reranker:8080/rerank"}, "RAGRPC_RERANKER_URL"),
        ({"RAGRPC_RERANKER_URL": "http://r/rerank", "RAGRPC_RERANKER_API": "openai"}, "RAGRPC_RERANKER_API"),
        ({"RAGRPC_RERANKER_URL": "http://r/rerank", "RAGRPC_RERANKER_TIMEOUT_S": "0"}, "RAGRPC_RERANKER_TIMEOUT_S"),
        (
            {"RAGRPC_RERANKER_URL": "http://r/rerank", "RAGRPC_RERANKER_API_KEY_ENV": "RAGRPC_TEST_UNSET_KEY"},
            "RAGRPC_TEST_UNSET_KEY",
        ),
    ],
)
def test_invalid_settings_name_the_variable(env: dict[str, str], names: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAGRPC_TEST_UNSET_KEY", raising=False)
    with pytest.raises(ValueError, match=names):
        build_reranker(Settings.from_env(env))


def test_a_non_number_timeout_names_the_variable() -> None:
    with pytest.raises(ValueError, match="RAGRPC_RERANKER_TIMEOUT_S"):
        env_settings(RAGRPC_RERANKER_TIMEOUT_S="soon")
