"""Reindexing a collection into a new generation (meshkit.domain.collections), for the ingestion API's
``ReindexCollection``.

A reindex is three phases, each kept in the collection record so any crash resumes it:

1. **Start**: the record gets ``pending_generation`` = serving + 1 (compare-and-set). From then on
   the API submits every new version and delete to both generations, and the workers record the
   new generation's embedder on its first write.
2. **Build**: each call compares the next page of the serving generation's documents with the
   new one's (services/ingestion/reindex_pass.py: passes in doc id order over the API's status
   index, from a cursor, so a call costs its page, never the collection) and submits what the
   new one lacks through the normal pipeline: the stored bytes are copied to a key of the new
   generation (so deleting the old generation later never touches them) and requested like any
   submission, a bounded batch per call. When a whole pass found every document indexed in the
   serving generation indexed at the same version in the new one, nothing waiting, nothing
   failed there and neither generation changed meanwhile, the record switches ``generation`` in
   one compare-and-set: readers (gateway, API) move to it within their cache period.
3. **Retire**: once ``reindex_retire_delay_s`` has passed since the switch (no reader can still
   be searching the old generation), the old generation's documents are deleted through the
   pipeline (their stores' chunks and their own copies of the bytes), a page per call from a
   cursor; once its counts show none left, the record forgets it.

A pass's cursor lives in the API process (a restarted API begins a new pass: the next call
costs one page, as any); the reindex's phases live in the collection record.

Documents whose latest version failed in the serving generation are not carried (there is no
indexed version to carry that the status can name): replay them first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
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
from services.ingestion.events import DELETE_TARGET, IngestEvent, new_request_id, object_key_for
from services.ingestion.lifecycle.entries import DocStatus
from services.ingestion.lifecycle.machine import DELETED, FAILED, INDEXED, PENDING_STATES
from services.ingestion.lifecycle.requests import PENDING, UNCHANGED, RequestOutcome, unneeded
from services.ingestion.lifecycle.rows import Row
from services.ingestion.lifecycle.view import StatusView
from services.ingestion.reindex_pass import SCAN_ROWS, Page, Tally, Walk, make_page

log = logging.getLogger(__name__)

BUILDING, RETIRING, DONE = "building", "retiring", "done"
PHASE_PB = {
    BUILDING: ingestion_pb2.REINDEX_PHASE_BUILDING,
    RETIRING: ingestion_pb2.REINDEX_PHASE_RETIRING,
    DONE: ingestion_pb2.REINDEX_PHASE_DONE,
}
COPY_CONCURRENCY = 16

Request = Callable[[IngestEvent], Awaitable[RequestOutcome]]
# Reads a document's status from the status bucket (None: no entry), by its key.
ReadStatus = Callable[[str], Awaitable[DocStatus | None]]


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


def plan_build(source: Iterable[DocStatus], target: Mapping[str, DocStatus], new_physical: str) -> _Plan:
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
        read_status: ReadStatus,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.view = view
        self.objects = objects
        self.request = request
        self.read_status = read_status
        self._slots = asyncio.Semaphore(COPY_CONCURRENCY)
        # The pass under way per (collection, generation built); the retire cursor per old one.
        self._walks: dict[tuple[str, int], Walk] = {}
        self._retire_after: dict[str, str] = {}

    async def step(self, collection: str, start: bool) -> Progress:
        record, _ = await self.registry.get(collection)
        if record is None:
            if not self.view.has_documents(collection):
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
        pair = (record.physical, new_physical)
        walk = self._walks.get((record.collection, record.pending_generation))
        if walk is None:
            walk = Walk(self._changes(pair))
        batch = self.settings.reindex_batch_documents
        page = make_page(
            self.view.rows_after(record.physical, walk.after, SCAN_ROWS),
            self.view.rows_after(new_physical, walk.after, SCAN_ROWS),
            SCAN_ROWS,
            batch,
        )
        tally = page.tally + await self._plan_page(page, record.physical, new_physical)
        walk.record(page.end, tally)
        if page.end is None:
            if walk.found.complete and self._changes(pair) == walk.changes_at_start:
                self._walks.pop((record.collection, record.pending_generation), None)
                record = await self._switch(record)
                return await self._retire(record)
            walk = walk.next_pass(self._changes(pair))
        self._walks[(record.collection, record.pending_generation)] = walk
        counts = self.view.counts(record.physical)
        estimate = walk.estimate(counts.by_state[INDEXED] if counts else 0)
        progress = _progress(record, BUILDING, record.pending_generation)
        progress.documents, progress.indexed = estimate.documents, estimate.indexed
        progress.pending, progress.failed = estimate.pending, estimate.failed
        return progress

    def _changes(self, pair: tuple[str, str]) -> int:
        return sum(self.view.changes(collection) for collection in pair)

    async def _plan_page(self, page: Page, serving: str, new_physical: str) -> Tally:
        """Read the page's undecided documents from the status bucket, plan them, submit what
        the plan says; their tally."""
        if not page.to_plan:
            return Tally()
        sources = await self._read(serving, page.to_plan, page.serving)
        targets = await self._read(new_physical, page.to_plan, page.building)
        plan = plan_build(sources.values(), targets, new_physical)
        batch = self.settings.reindex_batch_documents
        copies, deletes = plan.copies[:batch], plan.deletes[:batch]
        await asyncio.gather(*(self._copy(status, new_physical) for status in copies))
        for doc_id in deletes:
            await self.request(_delete_event(new_physical, doc_id))
        return Tally(plan.documents, plan.indexed, plan.pending, plan.failed, len(copies) + len(deletes))

    async def _read(
        self, collection: str, doc_ids: list[str], rows: Mapping[str, Row]
    ) -> dict[str, DocStatus]:
        """The statuses of those of ``doc_ids`` the index holds a row of in ``collection``."""
        held = [doc_id for doc_id in doc_ids if doc_id in rows]
        found = await asyncio.gather(*(self.read_status(doc_key(collection, doc_id)) for doc_id in held))
        return {doc_id: status for doc_id, status in zip(held, found, strict=True) if status is not None}

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
        counts = self.view.counts(old_physical)
        progress.retiring = sum(counts.by_state.values()) - counts.by_state[DELETED] if counts else 0
        if time.time() - record.switched_at < self.settings.reindex_retire_delay_s:
            return progress  # readers may still be searching it
        if progress.retiring:
            await self._delete_page(old_physical)
            return progress

        def forget(current: CollectionRecord | None) -> CollectionRecord:
            assert current is not None
            return replace(current, retired_generation=0, updated_at=time.time())

        self._retire_after.pop(old_physical, None)
        record = await self.registry.update(record.collection, forget)
        log.info("reindex complete", extra={"collection": record.collection, "generation": record.generation})
        return _progress(record, DONE, 0)

    async def _delete_page(self, old_physical: str) -> None:
        """Request the deletion of the next ``reindex_batch_documents`` documents of the old
        generation that are neither deleted nor being deleted, from the retire cursor (back to
        the start once it reached the end)."""
        batch = self.settings.reindex_batch_documents
        rows = self.view.rows_after(old_physical, self._retire_after.get(old_physical, ""), SCAN_ROWS)
        todo = [row for row in rows if not _leaving(row)][:batch]
        if len(todo) == batch:
            self._retire_after[old_physical] = todo[-1].doc_id
        else:
            self._retire_after[old_physical] = rows[-1].doc_id if len(rows) >= SCAN_ROWS else ""
        for row in todo:
            await self.request(_delete_event(old_physical, row.doc_id))


def _leaving(row: Row) -> bool:
    """Deleted, or its delete already requested (``unneeded`` would say absent or pending)."""
    return row.state == DELETED or (row.state in PENDING_STATES and row.target_sha256 == DELETE_TARGET)
