"""A chaos run: both services in process over given stores, every store call of either behind the
fault harness failing at random (seeded), while workers upload, replace, update, delete and query
concurrently, as users would (retrying what UNAVAILABLE refused). Between rounds (and after each
restart of the store's server) the faults clear, the services settle, and the invariants are
checked: the store's (ragrpc.testing.invariants.check_store, settled, with the contents each
hash names) and the query service's view of it. The figures - operations by outcome, faults
injected, restarts, invariant checks and violations - are those of Milvus' chaos checkers
(success rates of each operation during the faults)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import field_mask_pb2

from ingest_service.app import build_components as build_ingest
from ingest_service.app import start_ingest_server
from query_service.app import build_components as build_query
from query_service.app import start_query_server
from ragrpc.config import Settings
from ragrpc.testing import HashingEmbedder
from ragrpc.testing.faults import FaultPlan, FaultyChunkStore, FaultyRegistry
from ragrpc.testing.invariants import check_query_view, check_store
from ragrpc.v1 import ingest_pb2, ingest_pb2_grpc, retrieve_pb2, retrieve_pb2_grpc

TENANT = "default"
WORDS = "heron crane ibis stork egret plover avocet curlew dunlin godwit knot snipe".split()
TEXTS = [
    " ".join(f"Sentence {i} notes that the {word} number {i} waits by the {other} shore." for i in range(10))
    for word, other in zip(WORDS, reversed(WORDS), strict=True)
]
CONTENTS = {hashlib.sha256(text.encode()).hexdigest(): text for text in TEXTS}
DOCUMENTS = [f"doc-{i}" for i in range(10)]
RETRIED = (grpc.StatusCode.UNAVAILABLE,)


@dataclass
class ChaosFigures:
    operations: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    faults: int = 0
    restarts: int = 0
    checks: int = 0
    violations: list[str] = field(default_factory=list)

    def table(self) -> str:
        lines = [f"{'operation':<10} {'calls':>6}  outcomes"]
        for op, count in sorted(self.operations.items()):
            codes = ", ".join(f"{code} {n}" for (o, code), n in sorted(self.outcomes.items()) if o == op)
            lines.append(f"{op:<10} {count:>6}  {codes}")
        lines.append(
            f"faults injected {self.faults}, store restarts {self.restarts}, invariant checks {self.checks}, "
            f"violations {len(self.violations)}"
        )
        return "\n".join(lines)


class ChaosRun:
    def __init__(
        self,
        chunks: Any,
        registry: Any,
        *,
        seed: int,
        fault_rate: float,
        query_stores: tuple[Any, Any] | None = None,
        settings: Settings | None = None,
    ) -> None:
        self._seed = seed
        self._rate = fault_rate
        self.ingest_plan = FaultPlan.random(seed, fault_rate)
        self.query_plan = FaultPlan.random(seed + 1, fault_rate)
        query_chunks, query_registry = query_stores or (chunks, registry)
        self.chunks, self.registry = chunks, registry
        self._ingest_stores = (FaultyChunkStore(chunks, self.ingest_plan), FaultyRegistry(registry, self.ingest_plan))
        self._query_stores = (
            FaultyChunkStore(query_chunks, self.query_plan),
            FaultyRegistry(query_registry, self.query_plan),
        )
        self.settings = dataclasses.replace(
            settings or Settings(),
            workers=2,
            chunk_size_tokens=40,
            chunk_overlap_tokens=0,
            embedding_call_size=8,
            embedding_batch_size=8,
            sparse_backend="rank_bm25",
            registry_follow_interval_s=0.1,
            replaced_version_grace_s=0.2,
            document_timeout_s=60.0,
            ingest_port=0,
            query_port=0,
        )
        self.figures = ChaosFigures()
        self._servers: list[Any] = []
        self._channels: list[grpc.aio.Channel] = []

    async def start(self) -> ChaosRun:
        embedder = HashingEmbedder(dimension=64)
        self.ingest = build_ingest(self.settings, embedder, *self._ingest_stores, settle_delays_s=(0.05, 0.1, 0.2, 0.5))
        self.query = build_query(self.settings, embedder, *self._query_stores, load=False)
        ingest_server = await start_ingest_server(self.settings, self.ingest, "127.0.0.1:0")
        query_server = await start_query_server(self.settings, self.query, "127.0.0.1:0")
        self._servers = [ingest_server, query_server]
        ingest_channel = grpc.aio.insecure_channel(f"127.0.0.1:{ingest_server.port}")
        query_channel = grpc.aio.insecure_channel(f"127.0.0.1:{query_server.port}")
        self._channels = [ingest_channel, query_channel]
        self.ingest_stub = ingest_pb2_grpc.IngestServiceStub(ingest_channel)
        self.query_stub = retrieve_pb2_grpc.RetrieveServiceStub(query_channel)
        deadline = time.monotonic() + 120
        while not self.query.follower.ready:  # the start-up load, itself under faults, retried
            assert time.monotonic() < deadline, "the query service never finished loading"
            await asyncio.sleep(0.05)
        return self

    async def stop(self) -> None:
        for channel in self._channels:
            await channel.close()
        await self.ingest.stop(5.0)
        for server in self._servers:
            await server.stop(0)
        self.ingest.shutdown()
        self.query.executor.shutdown(wait=False, cancel_futures=True)

    # ---- the operations --------------------------------------------------------------------------

    async def _call(self, op: str, make: Callable[[], Awaitable[Any]]) -> Any:
        self.figures.operations[op] += 1
        for attempt in range(3):
            try:
                result = await make()
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code in RETRIED and attempt < 2:
                    await asyncio.sleep(0.05)
                    continue
                self.figures.outcomes[(op, code.name)] += 1
                if code is grpc.StatusCode.INTERNAL and "fault" not in op:
                    self._internal(op, exc)
                return None
            self.figures.outcomes[(op, "OK")] += 1
            return result
        return None

    def _internal(self, op: str, exc: grpc.aio.AioRpcError) -> None:
        """INTERNAL is for a fault of the service; the harness injects refusals that the adapters map to
        INTERNAL (too large, refused reads), so those are counted, not failed, when faults fired."""
        if not (self.ingest_plan.fired or self.query_plan.fired):
            self.figures.violations.append(f"{op}: INTERNAL without an injected fault: {exc.details()}")

    async def _upload(self, rng: random.Random) -> None:
        document_id, text = rng.choice(DOCUMENTS), rng.choice(TEXTS)
        header = ingest_pb2.DocumentSpec(document_id=document_id, file_name=f"{document_id}.txt")
        messages = [
            ingest_pb2.UploadDocumentRequest(header=header),
            ingest_pb2.UploadDocumentRequest(data=text.encode()),
        ]
        await self._call("upload", lambda: self.ingest_stub.UploadDocument(iter(messages), timeout=30))

    async def _update(self, rng: random.Random) -> None:
        request = ingest_pb2.UpdateDocumentRequest(
            document=ingest_pb2.Document(document_id=rng.choice(DOCUMENTS), tags=[rng.choice(WORDS)]),
            update_mask=field_mask_pb2.FieldMask(paths=["tags"]),
        )
        await self._call("update", lambda: self.ingest_stub.UpdateDocument(request, timeout=30))

    async def _delete(self, rng: random.Random) -> None:
        request = ingest_pb2.DeleteDocumentRequest(document_id=rng.choice(DOCUMENTS))
        await self._call("delete", lambda: self.ingest_stub.DeleteDocument(request, timeout=30))

    async def _query(self, rng: random.Random) -> None:
        request = retrieve_pb2.RetrieveRequest(
            query=f"{rng.choice(WORDS)} {rng.choice(WORDS)} shore", options=retrieve_pb2.RetrievalOptions(top_k=5)
        )

        async def retrieve() -> list[Any]:
            return [message async for message in self.query_stub.Retrieve(request, timeout=30)]

        await self._call("query", retrieve)

    async def _worker(self, seed: int, until: float) -> None:
        rng = random.Random(seed)
        ops = (self._upload, self._upload, self._update, self._delete, self._query, self._query)
        while time.monotonic() < until:
            await rng.choice(ops)(rng)

    # ---- rounds, checks, restarts ----------------------------------------------------------------

    async def round(self, duration_s: float, workers: int = 4) -> None:
        self.ingest_plan.resume()
        self.query_plan.resume()
        until = time.monotonic() + duration_s
        round_seed = self._seed * 1000 + self.figures.checks * 10
        await asyncio.gather(*(self._worker(round_seed + i, until) for i in range(workers)))

    async def check(self, label: str) -> None:
        """The faults clear, the services settle, then the invariants of the store and of the view."""
        self.ingest_plan.clear()
        self.query_plan.clear()
        self.figures.faults = len(self.ingest_plan.fired) + len(self.query_plan.fired)
        self.figures.checks += 1
        deadline = time.monotonic() + 60
        while self.ingest.lifecycle.unsettled or self.ingest.ingestions.running or self.ingest.gate.pending:
            if time.monotonic() > deadline:
                self.figures.violations.append(f"{label}: the ingest service did not settle")
                return
            await asyncio.sleep(0.05)
        if self.ingest.gate.pending:
            self.figures.violations.append(f"{label}: {self.ingest.gate.pending} admissions never given back")
        store = await asyncio.to_thread(
            check_store, self.chunks, self.registry, TENANT, contents=CONTENTS, fields=True, settled=True
        )
        self.figures.violations += [f"{label}: {p}" for p in store.problems]
        follower = self.query.follower
        view: list[str] = []
        for _ in range(50):  # the follower's loop keeps polling; the view converges within a few polls
            indexes = {listener.__class__.__name__: listener for listener in follower.listeners}
            view = check_query_view(follower, self.registry, indexes).problems
            if not view and follower.lagging == 0:
                break
            await asyncio.sleep(0.1)
        self.figures.violations += [f"{label}: query view: {p}" for p in view]

    async def run(
        self,
        duration_s: float,
        *,
        rounds: int = 1,
        between: Callable[[int], Awaitable[None]] | None = None,
        workers: int = 4,
    ) -> ChaosFigures:
        """`rounds` rounds of `duration_s / rounds` seconds; after each, `between(i)` (e.g. a restart of
        the store's server, during which the workers of the next round see it down) and a check."""
        for number in range(rounds):
            await self.round(duration_s / rounds, workers)
            if between is not None:
                await between(number)
                self.figures.restarts += 1
            await self.check(f"round {number + 1}")
        return self.figures
