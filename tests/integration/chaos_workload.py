"""The chaos run's workload (tests/integration/chaos.py): clients that submit, edit, delete and
re-submit documents (and a few poison ones) through the ingestion API while processes die,
retrying what a client retries, and keeping what each document is expected to end as (formats
and final states)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc import aio

from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc

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
