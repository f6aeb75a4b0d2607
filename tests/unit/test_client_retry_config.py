"""The clients' gRPC service config (clients.channel): every RPC of every service the clients
call has exactly one rule, only idempotent methods have a retry policy, only UNAVAILABLE is
retried and retries are throttled. The services and methods come from the generated
descriptors, so a new RPC fails here until someone decides whether it may be retried."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from grpc_health.v1 import health_pb2

from clients.channel import ChannelSettings, channel_options, service_config
from ragrpc.v1 import common_pb2, ingest_pb2, retrieve_pb2

# Decided independently of clients.channel (its docstring has the reasons): calls that must
# never be repeated automatically.
NOT_IDEMPOTENT = {"ragrpc.v1.IngestService.UpdateDocument"}
NEVER_RETRIED_SERVICES = {"grpc.health.v1.Health"}  # probes


def _services() -> list[ServiceDescriptor]:
    services: list[ServiceDescriptor] = []
    for module in (common_pb2, ingest_pb2, retrieve_pb2, health_pb2):
        services.extend(module.DESCRIPTOR.services_by_name.values())
    return services


def _methods() -> list[MethodDescriptor]:
    return [method for service in _services() for method in service.methods]


def _matches(name: dict[str, str], method: MethodDescriptor) -> bool:
    """gRPC's matching of a service-config name: service (+ method) or, when empty, everything."""
    if not name.get("service"):
        return True
    return name["service"] == method.containing_service.full_name and name.get("method", method.name) == method.name


def _rules_for(method: MethodDescriptor) -> list[dict[str, Any]]:
    return [rule for rule in service_config()["methodConfig"] for name in rule["name"] if _matches(name, method)]


def test_every_rpc_has_exactly_one_rule() -> None:
    assert {s.full_name for s in _services()} >= {
        "ragrpc.v1.IngestService",
        "ragrpc.v1.RetrieveService",
        "grpc.health.v1.Health",
    }
    for method in _methods():
        assert len(_rules_for(method)) == 1, f"{method.full_name}: {len(_rules_for(method))} rules"


def test_every_named_method_exists() -> None:
    known = {method.full_name for method in _methods()}
    services = {service.full_name for service in _services()}
    for rule in service_config()["methodConfig"]:
        for name in rule["name"]:
            assert name["service"] in services, name
            if "method" in name:
                assert f"{name['service']}.{name['method']}" in known, f"stale rule for {name}"


def test_the_ragrpc_services_are_decided_method_by_method() -> None:
    # A service-wide rule would silently cover an RPC added later.
    for rule in service_config()["methodConfig"]:
        for name in rule["name"]:
            if name["service"].startswith("ragrpc."):
                assert name.get("method"), f"service-wide rule for {name['service']}"


def test_non_idempotent_calls_and_probes_are_never_retried() -> None:
    for method in _methods():
        (rule,) = _rules_for(method)
        never = method.full_name in NOT_IDEMPOTENT or method.containing_service.full_name in NEVER_RETRIED_SERVICES
        if never:
            assert "retryPolicy" not in rule and "hedgingPolicy" not in rule, method.full_name
    assert NOT_IDEMPOTENT <= {method.full_name for method in _methods()}


def test_idempotent_calls_are_retried_on_unavailable_only() -> None:
    retried = []
    for method in _methods():
        (rule,) = _rules_for(method)
        policy = rule.get("retryPolicy")
        if policy is None:
            continue
        retried.append(method.full_name)
        assert policy["retryableStatusCodes"] == ["UNAVAILABLE"], method.full_name
        assert 2 <= policy["maxAttempts"] <= 5  # gRPC caps attempts at 5
        assert policy["initialBackoff"].endswith("s") and policy["maxBackoff"].endswith("s")
        assert policy["backoffMultiplier"] > 0
    assert "ragrpc.v1.RetrieveService.Retrieve" in retried
    assert "ragrpc.v1.IngestService.GetDocument" in retried
    assert "ragrpc.v1.IngestService.UploadDocument" in retried  # re-sending identical content is a no-op


def test_retries_are_throttled() -> None:
    throttling = service_config()["retryThrottling"]
    assert 0 < throttling["maxTokens"] <= 1000  # the range gRPC accepts
    assert 0 < throttling["tokenRatio"] <= 1
    assert round(throttling["tokenRatio"], 3) == throttling["tokenRatio"]  # gRPC keeps 3 decimals


def test_channels_carry_the_config_with_retries_enabled() -> None:
    options = dict(channel_options(ChannelSettings(target="127.0.0.1:1")))
    assert options["grpc.enable_retries"] == 1
    assert json.loads(options["grpc.service_config"]) == service_config()
