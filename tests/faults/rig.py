"""The rig of the fault-matrix tests: a real ingest service over gRPC whose stores are the in-memory
fakes (or a milvus-lite server's collections) behind the fault harness, reset between runs, and the
steps a user takes once a fault has cleared (wait for the service to settle, retry)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from ingest_service.app import IngestComponents, build_components, start_ingest_server
from ragrpc.config import Settings
from ragrpc.server import RunningServer
from ragrpc.testing import HashingEmbedder, InMemoryChunkStore, InMemoryDocumentRegistry
from ragrpc.testing.faults import FaultKind, FaultPlan, FaultyChunkStore, FaultyRegistry, fault_matrix
from ragrpc.testing.invariants import InvariantReport, check_store
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc

TENANT = "default"


def sentences(word: str, count: int = 14) -> str:
    return " ".join(f"Sentence {i} says that the {word} number {i} waits by the water." for i in range(count))


V1 = sentences("heron")
V2 = sentences("crane")
OTHERS = {name: sentences(name) for name in ("ibis", "stork", "egret")}
ALL_TEXTS = [V1, V2, *OTHERS.values()]
CONTENTS = {hashlib.sha256(text.encode()).hexdigest(): text for text in ALL_TEXTS}
# words of a pymilvus refusal that name internal objects; a caller must never see them
INTERNAL_WORDS = ("ragrpc_chunks", "expr", "injected", "MilvusException")


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def upload_messages(document_id: str, text: str) -> list[ingest_pb2.UploadDocumentRequest]:
    header = ingest_pb2.DocumentSpec(document_id=document_id, file_name=f"{document_id}.txt")
    return [ingest_pb2.UploadDocumentRequest(header=header), ingest_pb2.UploadDocumentRequest(data=text.encode())]


@dataclass
class Outcome:
    """What the caller saw of one call: its answer or its gRPC error."""

    response: Any = None
    code: grpc.StatusCode = grpc.StatusCode.OK
    details: str = ""

    @property
    def ok(self) -> bool:
        return self.code is grpc.StatusCode.OK


async def call(make: Callable[[], Awaitable[Any]]) -> Outcome:
    try:
        return Outcome(response=await make())
    except grpc.aio.AioRpcError as exc:
        return Outcome(code=exc.code(), details=exc.details() or "")


@dataclass
class IngestRig:
    settings: Settings
    chunks: FaultyChunkStore
    registry: FaultyRegistry
    components: IngestComponents | None = None
    server: RunningServer | None = None
    channel: grpc.aio.Channel | None = None
    stub: Any = None
    make_stores: Callable[[bool], tuple[Any, Any]] = field(default=lambda keep: _fakes(keep))

    @classmethod
    async def start(
        cls, make_stores: Callable[[bool], tuple[Any, Any]] | None = None, *, replaced_grace_s: float = 0.01
    ) -> IngestRig:
        settings = dataclasses.replace(
            Settings(),
            workers=2,
            chunk_size_tokens=40,
            chunk_overlap_tokens=0,
            embedding_call_size=4,
            embedding_batch_size=4,
            ingest_port=0,
            document_timeout_s=30.0,
            replaced_version_grace_s=replaced_grace_s,
            registry_change_journal="on",  # the in-memory store is no milvus-lite: auto would leave it off
        )
        maker = make_stores or _fakes
        inner_chunks, inner_registry = maker(True)
        plan = FaultPlan.counting()
        rig = cls(settings, FaultyChunkStore(inner_chunks, plan), FaultyRegistry(inner_registry, plan))
        rig.make_stores = maker
        rig.components = build_components(
            settings, HashingEmbedder(dimension=32), rig.chunks, rig.registry, settle_delays_s=(0.01, 0.02, 0.05)
        )
        rig.server = await start_ingest_server(settings, rig.components, "127.0.0.1:0")
        rig.channel = grpc.aio.insecure_channel(f"127.0.0.1:{rig.server.port}")
        rig.stub = ingest_pb2_grpc.IngestServiceStub(rig.channel)
        return rig

    async def stop(self) -> None:
        assert self.components is not None and self.server is not None and self.channel is not None
        await self.channel.close()
        await self.components.stop(5.0)
        await self.server.stop(0)
        self.components.shutdown()

    def reset(self, *, upsert_keeps_partitions: bool = True) -> None:
        """Fresh, empty stores and no fault (between runs of a matrix)."""
        self.chunks.inner, self.registry.inner = self.make_stores(upsert_keeps_partitions)
        self.arm(FaultPlan.counting())

    def arm(self, plan: FaultPlan) -> None:
        self.chunks.plan = self.registry.plan = plan

    @property
    def plan(self) -> FaultPlan:
        return self.chunks.plan

    async def settled(self, timeout_s: float = 20.0) -> None:
        """Until the service has nothing left in flight: ingestions, background settling, admissions."""
        assert self.components is not None
        deadline = time.monotonic() + timeout_s
        while self.components.lifecycle.unsettled or self.components.ingestions.running or self.components.gate.pending:
            assert time.monotonic() < deadline, (
                f"the service did not settle: {self.components.lifecycle.unsettled} unsettled, "
                f"{self.components.ingestions.running} ingestions, {self.components.gate.pending} admitted"
            )
            await asyncio.sleep(0.005)

    async def upload(self, document_id: str, text: str) -> Outcome:
        return await call(lambda: self.stub.UploadDocument(iter(upload_messages(document_id, text))))

    def check(self, *, fields: bool = False) -> InvariantReport:
        return check_store(
            self.chunks.inner, self.registry.inner, TENANT, contents=CONTENTS, fields=fields, settled=True
        )

    def stored(self, document_id: str) -> Any:
        return self.registry.inner.get(TENANT, document_id)


def _fakes(upsert_keeps_partitions: bool) -> tuple[Any, Any]:
    return InMemoryChunkStore(upsert_keeps_partitions=upsert_keeps_partitions), InMemoryDocumentRegistry()


Step = Callable[[IngestRig], Awaitable[Any]]


@dataclass
class Scenario:
    """setup (no fault), then the action under a fault, then what a user does once it cleared
    (`recover`: retry, or restart), then `expect` (raises AssertionError naming what is wrong)."""

    name: str
    setup: Step
    action: Callable[[IngestRig], Awaitable[Outcome]]
    recover: Callable[[IngestRig, Outcome], Awaitable[None]]
    expect: Callable[[IngestRig], Awaitable[None]]
    upsert_keeps_partitions: bool = True
    fields: bool = False


@dataclass
class MatrixResult:
    runs: int = 0
    calls: int = 0
    faults: int = 0
    violations: list[str] = field(default_factory=list)


async def run_matrix(rig: IngestRig, scenario: Scenario, kinds: tuple[FaultKind, ...]) -> MatrixResult:
    """Counts the scenario's store calls, then runs it once for every call and failure class: the
    k-th call fails, the fault clears, the user's recovery runs, and the invariants are checked."""
    result = MatrixResult()
    rig.reset(upsert_keeps_partitions=scenario.upsert_keeps_partitions)
    await scenario.setup(rig)
    await rig.settled()
    counting = FaultPlan.counting()
    rig.arm(counting)
    clean = await scenario.action(rig)
    assert clean.ok, f"{scenario.name} fails without a fault: {clean.code} {clean.details}"
    await rig.settled()
    calls = list(counting.calls[: len(counting.calls)])
    result.calls = len(calls)
    for number, call_name, kind in fault_matrix(calls, kinds):
        rig.reset(upsert_keeps_partitions=scenario.upsert_keeps_partitions)
        await scenario.setup(rig)
        await rig.settled()
        plan = FaultPlan.at(number, kind)
        rig.arm(plan)
        outcome = await scenario.action(rig)
        result.runs += 1
        where = f"{scenario.name}: call {number} ({call_name}) {kind.value}"
        try:
            if not outcome.ok:
                for word in INTERNAL_WORDS:
                    assert word not in outcome.details, f"the error names an internal object: {outcome.details!r}"
            await rig.settled()  # still armed: the k-th call may be one the service makes after answering
            plan.clear()
            result.faults += len(plan.fired)
            await scenario.recover(rig, outcome)
            await rig.settled()
            rig.check(fields=scenario.fields).assert_ok()
            await scenario.expect(rig)
        except AssertionError as exc:
            result.violations.append(f"{where}: {exc}")
    return result
