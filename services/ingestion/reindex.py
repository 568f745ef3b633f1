"""Reindexing a collection into a new generation (meshkit.domain.collections), for the ingestion API's
``ReindexCollection``.

A reindex is three phases, each kept in the collection record so any crash resumes it:

1. **Start**: the record gets ``pending_generation`` = serving + 1 (compare-and-set). From then on
   the API submits every new version and delete to both generations, and the workers record the
   new generation's embedder on its first write.
2. **Build**: each call compares the serving generation's documents with the new one's (the
   status view, no KV reads) and submits what the new one lacks through the normal pipeline:
   the stored bytes are copied to a key of the new generation (so deleting the old generation
   later never touches them) and requested like any submission, a bounded batch per call.
   When every document indexed in the serving generation is indexed at the same version in the
   new one, nothing waits and nothing failed there, the record switches ``generation`` in one
   compare-and-set: readers (gateway, API) move to it within their cache period.
3. **Retire**: once ``reindex_retire_delay_s`` has passed since the switch (no reader can still
   be searching the old generation), the old generation's documents are deleted through the
   pipeline (their stores' chunks and their own copies of the bytes); then the record forgets it.

Documents whose latest version failed in the serving generation are not carried (there is no
indexed version to carry that the status can name): replay them first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from meshkit.core.errors import failed_precondition, invalid_argument, not_found
from meshkit.domain.collections import (
    CollectionRecord,
    CollectionRegistry,
    physical_name,
    reserved_name_problem,
)
from meshkit.domain.ids import MAX_COLLECTION_CHARS, doc_key, sha256_hex, validate_collection
from meshkit.settings import IngestionSettings
from meshkit.storage.objectstore import ObjectNotFound, ObjectStore
from ragmesh.ingestion.v1 import ingestion_pb2
from services.ingestion.events import IngestEvent, new_request_id, object_key_for
from services.ingestion.lifecycle_entries import DocStatus
from services.ingestion.lifecycle_requests import PENDING, UNCHANGED, RequestOutcome, unneeded
from services.ingestion.lifecycle_states import DELETED, FAILED, INDEXED, PENDING_STATES
from services.ingestion.status_view import StatusView

log = logging.getLogger(__name__)

BUILDING, RETIRING, DONE = "building", "retiring", "done"
PHASE_PB = {
    BUILDING: ingestion_pb2.REINDEX_PHASE_BUILDING,
    RETIRING: ingestion_pb2.REINDEX_PHASE_RETIRING,
    DONE: ingestion_pb2.REINDEX_PHASE_DONE,
}
COPY_CONCURRENCY = 16

Request = Callable[[IngestEvent], Awaitable[RequestOutcome]]


@dataclass
class Progress:
    collection: str
    phase: str
    serving_generation: int
    other_generation: int = 0
    documents: int = 0
    indexed: int = 0
    pending: int = 0
    failed: int = 0
    retiring: int = 0
    serving_model: str = ""
    building_model: str = ""


@dataclass
class _Plan:
    """One build pass: what to submit to the new generation and how far it is."""

    copies: list[DocStatus]
    deletes: list[str]
    documents: int = 0
    indexed: int = 0
    pending: int = 0
    failed: int = 0


async def generations(registry: CollectionRegistry, name: str) -> list[str]:
    """The store collections a request for collection ``name`` goes to: the serving generation
    first, then the one a reindex is building (every change is submitted to it too)."""
    collection = validate_collection(name)
    reserved = reserved_name_problem(collection)
    if reserved:
        raise invalid_argument(reserved)
    record, _ = await registry.get(collection)
    if record is None:
        return [collection]
    building = [physical_name(collection, record.pending_generation)] if record.pending_generation else []
    return [record.physical, *building]


def to_response(progress: Progress) -> ingestion_pb2.ReindexCollectionResponse:
    return ingestion_pb2.ReindexCollectionResponse(
        collection=progress.collection,
        phase=PHASE_PB[progress.phase],
        serving_generation=progress.serving_generation,
        other_generation=progress.other_generation,
        documents=progress.documents,
        indexed=progress.indexed,
        pending=progress.pending,
        failed=progress.failed,
        retiring=progress.retiring,
        serving_model=progress.serving_model,
        building_model=progress.building_model,
    )


def _progress(record: CollectionRecord, phase: str, other: int) -> Progress:
    return Progress(
        collection=record.collection,
        phase=phase,
        serving_generation=record.generation,
        other_generation=other,
        serving_model=record.embedder.model if record.embedder else "",
        building_model=record.pending_embedder.model if record.pending_embedder else "",
    )


def _delete_event(collection: str, doc_id: str) -> IngestEvent:
    return IngestEvent(
        op="delete",
        collection=collection,
        doc_id=doc_id,
        submitted_at=time.time(),
        request_id=new_request_id(),
    )


def plan_build(source: list[DocStatus], target: dict[str, DocStatus], new_physical: str) -> _Plan:
    """Compare the serving generation's documents (``source``) with the new generation's
    (``target``, by doc id): what must be copied or deleted there, and the counts."""
    plan = _Plan(copies=[], deletes=[])
    carried: set[str] = set()
    for status in source:
        if status.state != DELETED:
            # Kept in the new generation whatever it holds there (a failed version here may be
            # one the API also submitted there, where it can succeed).
            carried.add(status.doc_id)
        if status.state in PENDING_STATES:
            plan.pending += 1  # settling in the serving generation: the next pass looks again
            continue
        if status.state != INDEXED or status.request is None or status.request.op != "upsert":
            continue
        plan.documents += 1
        wanted = replace(status.request, collection=new_physical)
        there = target.get(status.doc_id)
        outcome = unneeded(there, wanted)
        if outcome == UNCHANGED:
            plan.indexed += 1
        elif outcome == PENDING:
            plan.pending += 1
        elif there is not None and there.state == FAILED and there.target_sha256 == wanted.content_sha256:
            plan.failed += 1
        else:
            plan.pending += 1
            plan.copies.append(status)
    for doc_id, there in target.items():
        if doc_id not in carried and there.state != DELETED:
            plan.pending += 1
            if unneeded(there, _delete_event(new_physical, doc_id)) is None:
                plan.deletes.append(doc_id)
    return plan


class Reindexer:
    def __init__(
        self,
        settings: IngestionSettings,
        registry: CollectionRegistry,
        view: StatusView,
        objects: ObjectStore,
        request: Request,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.view = view
        self.objects = objects
        self.request = request
        self._slots = asyncio.Semaphore(COPY_CONCURRENCY)

    async def step(self, collection: str, start: bool) -> Progress:
        record, _ = await self.registry.get(collection)
        if record is None:
            if not self.view.statuses(collection):
                raise not_found(f"collection {collection!r} has no documents to reindex")
            # Indexed before collections had records: its generation 1 is what it holds.
            record = await self.registry.update(
                collection, lambda current: current or CollectionRecord(collection)
            )
        if record.retired_generation:
            return await self._retire(record)
        if not record.pending_generation:
            if not start:
                return _progress(record, DONE, 0)
            record = await self._begin(record)
        return await self._build(record)

    async def _begin(self, record: CollectionRecord) -> CollectionRecord:
        generation = record.generation + 1
        physical = physical_name(record.collection, generation)
        if len(physical) > MAX_COLLECTION_CHARS:
            raise failed_precondition(
                f"collection {record.collection!r} is too long a name to reindex: its generation "
                f"{physical!r} would exceed {MAX_COLLECTION_CHARS} characters"
            )

        def begin(current: CollectionRecord | None) -> CollectionRecord:
            assert current is not None
            if current.pending_generation or current.retired_generation:
                return current  # another caller began (or finished) meanwhile
            return replace(
                current,
                pending_generation=current.generation + 1,
                pending_embedder=None,
                updated_at=time.time(),
            )

        updated = await self.registry.update(record.collection, begin)
        log.info("reindex started", extra={"collection": record.collection, "generation": generation})
        return updated

    async def _build(self, record: CollectionRecord) -> Progress:
        new_physical = physical_name(record.collection, record.pending_generation)
        target = {s.doc_id: s for s in self.view.statuses(new_physical)}
        plan = plan_build(self.view.statuses(record.physical), target, new_physical)
        batch = self.settings.reindex_batch_documents
        await asyncio.gather(*(self._copy(status, new_physical) for status in plan.copies[:batch]))
        for doc_id in plan.deletes[:batch]:
            await self.request(_delete_event(new_physical, doc_id))
        if plan.pending == 0 and plan.failed == 0 and plan.indexed == plan.documents:
            record = await self._switch(record)
            return await self._retire(record)
        progress = _progress(record, BUILDING, record.pending_generation)
        progress.documents, progress.indexed = plan.documents, plan.indexed
        progress.pending, progress.failed = plan.pending, plan.failed
        return progress

    async def _copy(self, status: DocStatus, new_physical: str) -> None:
        """Submit the serving generation's indexed version of a document to the new one, from a
        copy of its stored bytes."""
        source = status.request
        assert source is not None
        async with self._slots:
            try:
                content = await self.objects.get(self.settings.documents_bucket, source.object_key)
            except ObjectNotFound:
                # Superseded and cleaned up meanwhile: the next pass sees the newer version.
                log.info("reindex source gone; next pass", extra={"doc_id": status.doc_id})
                return
            request_id = new_request_id()
            key = doc_key(new_physical, status.doc_id)
            event = replace(
                source,
                collection=new_physical,
                object_key=object_key_for(new_physical, key, source.content_sha256, request_id),
                request_id=request_id,
                submitted_at=time.time(),
            )
            await self.objects.put(
                self.settings.documents_bucket,
                event.object_key,
                content,
                metadata={"doc-id-sha256": sha256_hex(status.doc_id.encode())},
            )
            await self.request(event)

    async def _switch(self, record: CollectionRecord) -> CollectionRecord:
        building = record.pending_generation

        def switch(current: CollectionRecord | None) -> CollectionRecord:
            assert current is not None
            if current.pending_generation != building:
                return current  # switched by another caller already
            return replace(
                current,
                generation=building,
                embedder=current.pending_embedder or current.embedder,
                pending_generation=0,
                pending_embedder=None,
                retired_generation=current.generation,
                switched_at=time.time(),
                updated_at=time.time(),
            )

        updated = await self.registry.update(record.collection, switch)
        log.info(
            "reindex switched readers",
            extra={"collection": record.collection, "generation": updated.generation},
        )
        return updated

    async def _retire(self, record: CollectionRecord) -> Progress:
        old = record.retired_generation
        progress = _progress(record, RETIRING, old)
        old_physical = physical_name(record.collection, old)
        left = [s for s in self.view.statuses(old_physical) if s.state != DELETED]
        progress.retiring = len(left)
        if time.time() - record.switched_at < self.settings.reindex_retire_delay_s:
            return progress  # readers may still be searching it
        if left:
            for status in left[: self.settings.reindex_batch_documents]:
                event = _delete_event(old_physical, status.doc_id)
                if unneeded(status, event) is None:
                    await self.request(event)
            return progress

        def forget(current: CollectionRecord | None) -> CollectionRecord:
            assert current is not None
            return replace(current, retired_generation=0, updated_at=time.time())

        record = await self.registry.update(record.collection, forget)
        log.info("reindex complete", extra={"collection": record.collection, "generation": record.generation})
        return _progress(record, DONE, 0)
