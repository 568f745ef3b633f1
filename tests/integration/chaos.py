"""Chaos for the write path: documents submitted, edited, deleted and re-submitted while a fault
injector SIGKILLs a random process of the mesh on a schedule, with production timings (lease,
ack_wait, max_deliver as shipped). When the schedule ends and every document has settled, the
verifier checks the invariants the write path promises:

- every document is in its last submitted version (or deleted) in every store and every replica:
  the same chunk ids, computed here independently from the submitted bytes with the worker's own
  normalisation and chunking, the same fences across replicas of a shard;
- nothing is left in a non-final state, nothing accepted is lost;
- no chunk id is held twice (checked directly on every replica's listing);
- the dead-letter stream holds exactly the poison documents that were injected, once each.

``test_chaos.py`` runs a short schedule in CI; ``make chaos`` runs ten minutes of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import signal
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc
from grpc import aio

from meshkit.ids import chunk_id_for, shard_of
from meshkit.settings import IngestionSettings
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from ragmesh_cli.stack import Stack
from services.ingestion.chunking import Chunker
from services.ingestion.normalize import normalize

from .meshclients import Mesh

MD = ingestion_pb2.DOCUMENT_FORMAT_MARKDOWN
PDF = ingestion_pb2.DOCUMENT_FORMAT_PDF
INDEXED = ingestion_pb2.DOCUMENT_STATE_INDEXED
DELETED = ingestion_pb2.DOCUMENT_STATE_DELETED
FAILED = ingestion_pb2.DOCUMENT_STATE_FAILED
FINAL_STATES = {INDEXED, DELETED, FAILED}
# Codes a client of the ingestion API retries: the API or what it depends on is restarting.
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
TOPICS = (
    "basalt lava flows and magma chambers",
    "sourdough starters and long fermentation",
    "ocean tides under the moon",
    "glacier ice cores and old air",
    "desert dunes moved by wind",
    "coral reefs and warm water",
)


# ----------------------------------------------------------------------------- the workload


def marker(doc_id: str) -> str:
    """A word only this document contains, so a search can find it and nothing else."""
    return "mk" + hashlib.sha256(doc_id.encode()).hexdigest()[:12]


def document_text(doc_id: str, version: int, sections: int) -> str:
    """Version ``version`` of a document: its sections change one at a time across versions, so an
    edit keeps some chunks and replaces others (the record manager's keep path)."""
    parts = [f"# Document {doc_id}\n"]
    for s in range(sections):
        # Section s changes whenever version passes one of its steps: section 0 every version,
        # section 1 every second version...
        edition = version // (s + 1)
        topic = TOPICS[(s + edition) % len(TOPICS)]
        sentences = " ".join(
            f"Ragmesh note {marker(doc_id)} section {s} edition {edition} is about {topic}, point {j}."
            for j in range(14)
        )
        parts.append(f"## Section {s}\n\n{sentences}\n")
    return "\n".join(parts)


# A PDF with a valid header that no parser can read: the worker fails it permanently.
POISON_PDF = b"%PDF-1.7\n" + b"\x00garbage that is not a PDF object graph\n" * 50


@dataclass
class Expected:
    """What the last accepted request for a document asks for."""

    state: int  # INDEXED, DELETED or FAILED (poison)
    content: bytes | None = None
    version: int = 0


@dataclass
class OpLog:
    submitted: int = 0
    unchanged: int = 0
    deleted: int = 0
    retried_calls: int = 0
    by_code: Counter[str] = field(default_factory=Counter)


class Workload:
    """Clients of the ingestion API: each document's requests are sequential (a client waits for
    the answer), documents are worked on concurrently, and a request is retried until the API
    accepts it, as a real client would; only an accepted request changes what is expected."""

    def __init__(
        self,
        ingestion: ingestion_pb2_grpc.IngestionServiceStub,
        collection: str,
        rng: random.Random,
        documents: int,
        poison: int,
    ) -> None:
        self.ingestion = ingestion
        self.collection = collection
        self.rng = rng
        self.doc_ids = [f"doc-{i:03d}.md" for i in range(documents)]
        self.poison_ids = [f"poison-{i:02d}.pdf" for i in range(poison)]
        self.sections = {d: 1 + i % 3 for i, d in enumerate(self.doc_ids)}
        self.expected: dict[str, Expected] = {}
        self.log = OpLog()
        self._busy: set[str] = set()

    async def run(self, stop: asyncio.Event, concurrency: int = 4, pause_s: float = 0.3) -> None:
        await self._submit_poison()
        await asyncio.gather(*(self._client(stop, pause_s) for _ in range(concurrency)))

    async def _client(self, stop: asyncio.Event, pause_s: float) -> None:
        while not stop.is_set():
            idle = [d for d in self.doc_ids if d not in self._busy]
            if idle:
                doc_id = self.rng.choice(idle)
                self._busy.add(doc_id)
                try:
                    await self._step(doc_id)
                finally:
                    self._busy.discard(doc_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause_s * (0.5 + self.rng.random()))

    async def _step(self, doc_id: str) -> None:
        current = self.expected.get(doc_id)
        roll = self.rng.random()
        if current is not None and current.state == INDEXED and roll < 0.2:
            await self._delete(doc_id)
        elif current is not None and current.state == INDEXED and roll < 0.35:
            # The same bytes again: recognised as unchanged, or queued behind a newer request.
            await self._submit(doc_id, current.version)
        else:
            version = (current.version + 1) if current is not None else 0
            await self._submit(doc_id, version)

    async def _submit(self, doc_id: str, version: int) -> None:
        content = document_text(doc_id, version, self.sections[doc_id]).encode()
        request = ingestion_pb2.IngestDocumentsRequest(
            collection=self.collection,
            documents=[ingestion_pb2.Document(doc_id=doc_id, format=MD, content=content)],
        )
        reply = await self._call(self.ingestion.IngestDocuments, request)
        outcome = reply.results[0].outcome
        if outcome == ingestion_pb2.SUBMIT_OUTCOME_UNCHANGED:
            self.log.unchanged += 1
        self.log.submitted += 1
        self.expected[doc_id] = Expected(INDEXED, content, version)

    async def _delete(self, doc_id: str) -> None:
        request = ingestion_pb2.DeleteDocumentsRequest(collection=self.collection, doc_ids=[doc_id])
        await self._call(self.ingestion.DeleteDocuments, request)
        self.log.deleted += 1
        self.expected[doc_id] = Expected(DELETED, None, self.expected[doc_id].version)

    async def _submit_poison(self) -> None:
        request = ingestion_pb2.IngestDocumentsRequest(
            collection=self.collection,
            documents=[
                ingestion_pb2.Document(doc_id=doc_id, format=PDF, content=POISON_PDF + doc_id.encode())
                for doc_id in self.poison_ids
            ],
        )
        await self._call(self.ingestion.IngestDocuments, request)
        for doc_id in self.poison_ids:
            self.expected[doc_id] = Expected(FAILED)

    async def _call(self, method: Any, request: Any) -> Any:
        """Until accepted. A retried request is the same request, so whether an earlier attempt
        was applied (its answer lost) does not change what is expected."""
        while True:
            try:
                return await method(request, timeout=15)
            except aio.AioRpcError as exc:
                self.log.by_code[exc.code().name] += 1
                if exc.code() not in RETRYABLE:
                    raise
                self.log.retried_calls += 1
                await asyncio.sleep(0.5 + self.rng.random())


# ----------------------------------------------------------------------------- the faults


@dataclass
class Fault:
    victim: str
    kind: str
    killed_at: float
    down_s: float
    restart_s: float = 0.0
    error: str = ""


class FaultInjector:
    """SIGKILL one random victim every ``interval_s`` (jittered), leave it down for a moment, then
    start it again (its recorded ports and data: a crash, not a new machine) and wait until it is
    healthy, as an orchestrator would."""

    def __init__(
        self,
        stack: Stack,
        victims: Sequence[str],
        rng: random.Random,
        interval_s: tuple[float, float] = (6.0, 12.0),
        down_s: tuple[float, float] = (0.5, 4.0),
    ) -> None:
        self.stack = stack
        self.victims = list(victims)
        self.rng = rng
        self.interval_s = interval_s
        self.down_s = down_s
        self.faults: list[Fault] = []
        self.started = time.monotonic()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.uniform(*self.interval_s))
            if stop.is_set():
                break
            await self.strike(self._pick())

    def _pick(self) -> str:
        """A kind first, then one of its processes: each kind is hit as often, however many
        replicas it runs (four index replicas must not crowd out NATS)."""
        kinds = sorted({self.stack.component(v).kind for v in self.victims})
        kind = self.rng.choice(kinds)
        return self.rng.choice([v for v in self.victims if self.stack.component(v).kind == kind])

    async def strike(self, victim: str) -> None:
        fault = Fault(
            victim,
            self.stack.component(victim).kind,
            round(time.monotonic() - self.started, 2),
            round(self.rng.uniform(*self.down_s), 2),
        )
        self.faults.append(fault)
        if self.stack.component(victim).pid is not None:
            with contextlib.suppress(Exception):  # it may have died of an earlier failed restart
                await asyncio.to_thread(self.stack.kill, victim, signal.SIGKILL)
        await asyncio.sleep(fault.down_s)
        began = time.monotonic()
        try:
            await self.stack.start_async(victim)
        except Exception as exc:  # a restart that fails is a finding: report it, keep going
            fault.error = str(exc)[:500]
        fault.restart_s = round(time.monotonic() - began, 2)

    def summary(self) -> dict[str, Any]:
        return {
            "kills": len(self.faults),
            "by_kind": dict(Counter(f.kind for f in self.faults)),
            "failed_restarts": [asdict(f) for f in self.faults if f.error],
            "faults": [asdict(f) for f in self.faults],
        }


# ----------------------------------------------------------------------------- verification


class Violation(AssertionError):
    pass


class Verifier:
    """Reads every store and replica directly (``ListDocuments``, as the ``ops`` identity on a
    secure stack) and compares it with what the workload's accepted requests imply."""

    def __init__(self, mesh: Mesh, workload: Workload, settings: IngestionSettings) -> None:
        self.stack = mesh.stack
        self.mesh = mesh
        self.workload = workload
        self.collection = workload.collection
        self.chunker = Chunker.from_settings(settings)

    def _channel(self, name: str) -> aio.Channel:
        return self.mesh.channel(name)

    # --- what should be there -------------------------------------------------------------

    def expected_chunks(self) -> dict[str, set[str]]:
        """doc_id -> chunk ids of its expected version (indexed documents only)."""
        out: dict[str, set[str]] = {}
        for doc_id, want in self.workload.expected.items():
            if want.state != INDEXED:
                continue
            assert want.content is not None
            normalized = normalize(want.content, MD, "")
            drafts = self.chunker.chunk(normalized.markdown, normalized.title)
            out[doc_id] = {chunk_id_for(self.collection, doc_id, d.text) for d in drafts}
        return out

    # --- waiting --------------------------------------------------------------------------

    async def settle(self, timeout_s: float) -> float:
        """Seconds until every document is final and as expected; raises on timeout."""
        ingestion = self.mesh.ingestion
        ids = list(self.workload.expected)
        started = time.monotonic()
        last: dict[str, str] = {}
        while True:
            try:
                reply = await ingestion.GetDocumentStatus(
                    ingestion_pb2.GetDocumentStatusRequest(collection=self.collection, doc_ids=ids),
                    timeout=10,
                )
                last = {
                    d.doc_id: ingestion_pb2.DocumentState.Name(d.state)
                    for d in reply.documents
                    if not self._final_as_expected(d)
                }
                if not last:
                    return round(time.monotonic() - started, 1)
            except aio.AioRpcError as exc:
                last = {"(ingestion API)": exc.code().name}
            if time.monotonic() - started > timeout_s:
                raise Violation(f"not settled after {timeout_s:.0f}s: {dict(list(last.items())[:15])}")
            await asyncio.sleep(1.0)

    def _final_as_expected(self, status: ingestion_pb2.DocumentStatus) -> bool:
        want = self.workload.expected[status.doc_id]
        if status.state not in FINAL_STATES:
            return False
        if want.state == INDEXED:
            assert want.content is not None
            return (
                status.state == INDEXED and status.content_sha256 == hashlib.sha256(want.content).hexdigest()
            )
        return status.state == want.state

    # --- the checks -----------------------------------------------------------------------

    async def verify(self) -> dict[str, Any]:
        expected = self.expected_chunks()
        report: dict[str, Any] = {"documents": len(self.workload.expected), "indexed": len(expected)}
        report["statuses"] = await self._check_statuses()
        report["index"] = await self._check_index(expected)
        report["sparse"] = await self._check_sparse(expected)
        report["dead_letters"] = await self._check_dead_letters()
        report["collection_counts"] = await self._check_counts(expected)
        return report

    async def _check_statuses(self) -> dict[str, int]:
        ingestion = self.mesh.ingestion
        ids = list(self.workload.expected)
        reply = await ingestion.GetDocumentStatus(
            ingestion_pb2.GetDocumentStatusRequest(collection=self.collection, doc_ids=ids), timeout=10
        )
        wrong = {
            d.doc_id: ingestion_pb2.DocumentState.Name(d.state)
            for d in reply.documents
            if not self._final_as_expected(d)
        }
        if wrong:
            raise Violation(f"documents not in their last submitted version: {wrong}")
        return dict(Counter(ingestion_pb2.DocumentState.Name(d.state) for d in reply.documents))

    async def _list(self, stub: Any, request_type: Any) -> dict[str, tuple[int, list[str]]]:
        """doc_id -> (fence, chunk ids) of one replica, every page; a duplicate chunk id anywhere
        in the listing is a violation."""
        out: dict[str, tuple[int, list[str]]] = {}
        token = ""
        seen: Counter[str] = Counter()
        while True:
            request = request_type(collection=self.collection, page_token=token)
            try:
                reply = await stub.ListDocuments(request, timeout=30)
            except aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return out
                raise
            for doc in reply.documents:
                out[doc.doc_id] = (doc.fence, list(doc.chunk_ids))
                seen.update(doc.chunk_ids)
            token = reply.next_page_token
            if not token:
                break
        duplicates = [c for c, n in seen.items() if n > 1]
        if duplicates:
            raise Violation(f"chunk ids held twice: {duplicates[:10]}")
        return out

    def _replicas(self, kind: str) -> list[str]:
        return [n for n in self.stack.names() if self.stack.component(n).kind == kind]

    async def _check_index(self, expected: dict[str, set[str]]) -> dict[str, Any]:
        replicas = self._replicas("index")
        shard_count = self.stack.index_shards
        by_shard: dict[int, list[tuple[str, dict[str, tuple[int, list[str]]]]]] = {}
        for name in replicas:
            shard = int(self.stack.component(name).env["RAGMESH_INDEX_SHARD"])
            stub = index_pb2_grpc.IndexServiceStub(self._channel(name))
            by_shard.setdefault(shard, []).append(
                (name, await self._list(stub, index_pb2.ListDocumentsRequest))
            )
        for shard, listings in by_shard.items():
            want = {
                doc_id: {c for c in chunks if shard_of(c, shard_count) == shard}
                for doc_id, chunks in expected.items()
            }
            want = {d: c for d, c in want.items() if c}
            for name, listing in listings:
                self._compare(f"{name} (index shard {shard})", listing, want)
            self._same_fences([(n, lst) for n, lst in listings], f"index shard {shard}")
        return {"replicas": len(replicas), "shards": sorted(by_shard)}

    async def _check_sparse(self, expected: dict[str, set[str]]) -> dict[str, Any]:
        replicas = self._replicas("sparse")
        listings = []
        for name in replicas:
            stub = sparse_pb2_grpc.SparseServiceStub(self._channel(name))
            listing = await self._list(stub, sparse_pb2.ListDocumentsRequest)
            self._compare(f"{name} (sparse)", listing, expected)
            listings.append((name, listing))
        self._same_fences(listings, "sparse")
        return {"replicas": len(replicas)}

    @staticmethod
    def _compare(where: str, listing: dict[str, tuple[int, list[str]]], want: dict[str, set[str]]) -> None:
        got = {d: set(chunks) for d, (_fence, chunks) in listing.items() if chunks}
        extra = sorted(set(got) - set(want))
        missing = sorted(set(want) - set(got))
        differ = sorted(d for d in set(got) & set(want) if got[d] != want[d])
        if extra or missing or differ:
            raise Violation(
                f"{where}: documents it should not hold {extra[:10]}, missing {missing[:10]}, "
                f"with other chunks {differ[:10]}"
            )

    @staticmethod
    def _same_fences(listings: list[tuple[str, dict[str, tuple[int, list[str]]]]], where: str) -> None:
        if len(listings) < 2:
            return
        first_name, first = listings[0]
        for name, other in listings[1:]:
            fences = {d: f for d, (f, chunks) in first.items() if chunks}
            other_fences = {d: f for d, (f, chunks) in other.items() if chunks}
            if fences != other_fences:
                diff = {d for d in set(fences) | set(other_fences) if fences.get(d) != other_fences.get(d)}
                raise Violation(f"{where}: {first_name} and {name} disagree on fences of {sorted(diff)[:10]}")

    async def _check_dead_letters(self) -> dict[str, Any]:
        ingestion = self.mesh.ingestion
        reply = await ingestion.ListDeadLetters(
            ingestion_pb2.ListDeadLettersRequest(collection=self.collection, limit=1000), timeout=30
        )
        letters = Counter(letter.doc_id for letter in reply.dead_letters)
        want = Counter(self.workload.poison_ids)
        if letters != want:
            raise Violation(f"dead letters {dict(letters)} are not exactly the poison documents {dict(want)}")
        return {
            "letters": sum(letters.values()),
            "reasons": sorted({d.reason[:80] for d in reply.dead_letters}),
        }

    async def _check_counts(self, expected: dict[str, set[str]]) -> dict[str, int]:
        ingestion = self.mesh.ingestion
        counts = await ingestion.GetCollectionStatus(
            ingestion_pb2.GetCollectionStatusRequest(collection=self.collection), timeout=10
        )
        stuck = (counts.queued, counts.processing, counts.deleting)
        if any(stuck):
            raise Violation(f"documents stuck: queued/processing/deleting = {stuck}")
        return {
            "indexed": counts.indexed,
            "failed": counts.failed,
            "chunks": counts.chunks,
            "expected_chunks": sum(len(c) for c in expected.values()),
        }


# ----------------------------------------------------------------------------- one run


@dataclass
class ChaosConfig:
    duration_s: float
    documents: int = 40
    poison: int = 3
    seed: int = 0
    settle_timeout_s: float = 600.0


async def run_chaos(
    stack: Stack, victims: Sequence[str], config: ChaosConfig, collection: str
) -> dict[str, Any]:
    """The workload and the fault injector side by side for ``duration_s``, then settle and verify.
    Returns the report (raises Violation when an invariant does not hold)."""
    rng = random.Random(config.seed)
    mesh = Mesh(stack)
    workload = Workload(mesh.ingestion, collection, rng, config.documents, config.poison)
    injector = FaultInjector(stack, victims, random.Random(config.seed + 1))
    stop = asyncio.Event()
    started = time.monotonic()
    tasks = [asyncio.create_task(workload.run(stop)), asyncio.create_task(injector.run(stop))]
    try:
        await asyncio.sleep(config.duration_s)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    chaos_s = round(time.monotonic() - started, 1)
    verifier = Verifier(mesh, workload, IngestionSettings())
    try:
        settle_s = await verifier.settle(config.settle_timeout_s)
        checks = await verifier.verify()
    finally:
        await mesh.close()
    return {
        "seed": config.seed,
        "secure": stack.secure,
        "chaos_seconds": chaos_s,
        "settle_seconds": settle_s,
        "operations": {
            "submitted": workload.log.submitted,
            "unchanged": workload.log.unchanged,
            "deleted": workload.log.deleted,
            "poison": len(workload.poison_ids),
            "retried_calls": workload.log.retried_calls,
            "errors_by_code": dict(workload.log.by_code),
        },
        "injected": injector.summary(),
        "verified": checks,
    }


def write_report(report: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2, sort_keys=True)
