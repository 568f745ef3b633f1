"""IngestionService: validates documents, stores their bytes in the object store, records
each submission or delete as the document's current request (services/ingestion/lifecycle/:
the status write is the commit point) and announces it on the ingest stream; reports
lifecycle and manages dead letters. The checks of submitted documents are in
services/ingestion/submissions.py, the status messages in services/ingestion/status_messages.py.

Collection status, the listings and reindex read the status index (services/ingestion/lifecycle/
view.py: SQLite in the API's data dir, following the status bucket); until it has caught up
with the bucket after a start, those calls answer UNAVAILABLE with a retry hint. Document status
reads the bucket itself.

Errors returned to callers say what failed and what to do, with the request id; the
exception itself is logged under that id, never sent."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

import grpc
import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from prometheus_client import Counter

from meshkit.core.errors import ServiceError, invalid_argument, not_found, resource_exhausted, unavailable
from meshkit.core.logs import current_request_id
from meshkit.domain.collections import CollectionRegistry, open_collections_bucket, split_physical
from meshkit.domain.ids import doc_key, sha256_hex, validate_collection, validate_doc_id
from meshkit.rpc.auth import READ, WRITE, Rule, readable
from meshkit.settings import IngestionSettings
from meshkit.storage.natsconn import connect_options
from meshkit.storage.objectstore import UNAVAILABLE_ERRORS, ObjectStore
from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from services.ingestion.calibration import CalibrationCalls
from services.ingestion.deadletters import DeadLetter, DeadLetters
from services.ingestion.events import IngestEvent, new_request_id, object_key_for
from services.ingestion.lifecycle.entries import DocStatus
from services.ingestion.lifecycle.machine import DELETED, DELETING, FAILED, INDEXED, PROCESSING, QUEUED
from services.ingestion.lifecycle.requests import REQUESTED, REQUEUED, UNCHANGED, RequestOutcome, unneeded
from services.ingestion.lifecycle.retry import STATE_STORE_ERRORS, Contended
from services.ingestion.lifecycle.store import Lifecycle
from services.ingestion.lifecycle.view import StatusView
from services.ingestion.reindex import Reindexer, generations, to_response
from services.ingestion.status_messages import STATE_TO_PROTO, status_message, timestamp
from services.ingestion.submissions import Submission, validate_documents
from services.ingestion.topology import ensure_topology, publish_event

log = logging.getLogger("ingestion.api")

SUBMITTED = Counter("ragmesh_ingest_submitted_total", "Documents submitted, by outcome.", ["outcome"])
MAX_STATUS_IDS = 1000
SUBMIT_CONCURRENCY = 32
DEFAULT_LIST_LIMIT = 1000
MAX_LIST_LIMIT = 10_000


def _collection(request: Any) -> str:
    return str(request.collection)


# What an API key needs for each method (meshkit.rpc.auth). ListCollections answers with the
# collections the key may read; the dead-letter calls without a collection span them all ('*').
ACCESS = {
    "IngestDocuments": Rule(WRITE, _collection),
    "DeleteDocuments": Rule(WRITE, _collection),
    "GetDocumentStatus": Rule(READ, _collection),
    "GetCollectionStatus": Rule(READ, _collection),
    "ListCollections": Rule(READ),
    "ListDocuments": Rule(READ, _collection),
    "ListDeadLetters": Rule(READ, _collection, all_when_empty=True),
    "ReplayDeadLetters": Rule(WRITE, _collection, all_when_empty=True),
    "ReindexCollection": Rule(WRITE, _collection),
    "SetCollectionCalibration": Rule(WRITE, _collection),
}


def unavailable_error(doing: str, exc: BaseException, **context: Any) -> ServiceError:
    """UNAVAILABLE for an infrastructure failure while ``doing`` something: which part failed
    and the request id for the caller, the exception for the log."""
    if isinstance(exc, Contended):
        part = "the document is being changed concurrently"
    elif isinstance(exc, STATE_STORE_ERRORS):
        part = "the state store (NATS) is unavailable"
    elif isinstance(exc, UNAVAILABLE_ERRORS):
        part = "the object store is unavailable"
    else:
        part = "an internal error occurred"
    log.warning(
        f"{doing} failed", extra={**context, "error": repr(exc)}, exc_info=not isinstance(exc, Contended)
    )
    return unavailable(f"could not {doing}: {part}; retry the call (request id {current_request_id()})")


class IngestionServicer(CalibrationCalls, ingestion_pb2_grpc.IngestionServiceServicer):
    def __init__(self, settings: IngestionSettings) -> None:
        self.settings = settings
        self.view = StatusView(settings)
        self.nc: NATS | None = None
        self.js: JetStreamContext | None = None
        self.lifecycle: Lifecycle | None = None
        self.dead_letters: DeadLetters | None = None
        self.objects = ObjectStore.from_settings(settings)
        self._submit_slots = asyncio.Semaphore(SUBMIT_CONCURRENCY)
        self._pending_drops: set[asyncio.Task[None]] = set()
        self.collections: CollectionRegistry | None = None
        self.reindexer: Reindexer | None = None

    async def start(self) -> None:
        self.nc = await nats.connect(
            **connect_options(self.settings),
            name="ingestion-api",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
        )
        self.js = self.nc.jetstream()
        await ensure_topology(self.js, self.settings)
        self.lifecycle = await Lifecycle.open(self.js, self.settings)
        self.dead_letters = DeadLetters(self.js, self.settings)
        await self.objects.ensure_bucket(self.settings.documents_bucket)
        await self.view.start(self.js)
        bucket = await open_collections_bucket(self.js, self.settings.nats_stream_replicas)
        self.collections = CollectionRegistry(bucket)
        self.reindexer = Reindexer(
            self.settings, self.collections, self.view, self.objects, self._request, self._read_status
        )

    async def stop(self) -> None:
        await self.view.stop()
        if self.nc:
            await self.nc.drain()

    async def _read_status(self, key: str) -> DocStatus | None:
        assert self.lifecycle is not None
        return (await self.lifecycle.status(key)).value

    def _index_ready(self) -> None:
        """Refuse a call answered from the status index while it catches up after a start."""
        reason = self.view.not_ready_reason()
        if reason:
            raise unavailable(f"{reason}; retry in a moment (request id {current_request_id()})")

    # --- collections and their generations (meshkit.domain.collections) ----------------------------

    async def _generations(self, name: str) -> list[str]:
        """The store collections a request for collection ``name`` goes to (serving first)."""
        assert self.collections is not None
        try:
            return await generations(self.collections, name)
        except ServiceError:
            raise
        except Exception as exc:
            raise unavailable_error("read the collection record", exc, collection=name) from exc

    async def ReindexCollection(
        self, request: ingestion_pb2.ReindexCollectionRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.ReindexCollectionResponse:
        assert self.reindexer is not None
        collection = (await self._generations(request.collection))[0]
        self._index_ready()
        logical = split_physical(collection)[0]
        try:
            progress = await self.reindexer.step(logical, request.start)
        except ServiceError:
            raise
        except Exception as exc:
            raise unavailable_error("advance the reindex", exc, collection=logical) from exc
        return to_response(progress)

    # --- IngestDocuments --------------------------------------------------------------------

    async def IngestDocuments(
        self, request: ingestion_pb2.IngestDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.IngestDocumentsResponse:
        serving, *building = await self._generations(request.collection)
        checked = validate_documents(request, self.settings)
        accepted = [item for item in checked if isinstance(item, Submission)]
        submitted = await asyncio.gather(*(self._submit(serving, s) for s in accepted))
        for collection in building:
            await asyncio.gather(*(self._submit(collection, s) for s in accepted))
        queue = iter(submitted)
        # One result per document, in request order: rejected ones in place of their submission.
        results = [item if isinstance(item, ingestion_pb2.SubmitResult) else next(queue) for item in checked]
        return ingestion_pb2.IngestDocumentsResponse(results=results)

    async def _submit(self, collection: str, submission: Submission) -> ingestion_pb2.SubmitResult:
        assert self.lifecycle is not None
        doc = submission.doc
        key = doc_key(collection, doc.doc_id)
        request_id = new_request_id()
        event = IngestEvent(
            op="upsert",
            collection=collection,
            doc_id=doc.doc_id,
            content_sha256=submission.sha,
            object_key=object_key_for(collection, key, submission.sha, request_id),
            format=submission.fmt,
            title=doc.title,
            source_uri=doc.source_uri,
            metadata=dict(doc.metadata),
            submitted_at=time.time(),
            request_id=request_id,
        )
        async with self._submit_slots:
            try:
                current = (await self.lifecycle.status(key)).value
            except Exception as exc:
                raise unavailable_error(f"queue {doc.doc_id!r}", exc, doc_id=doc.doc_id) from exc
            # Checked again when the request is recorded; this spares storing the bytes.
            outcome = unneeded(current, event)
            if outcome is None:
                try:
                    # Bytes first, under a key of their own: the request must never point at an
                    # object that does not exist, and no cleanup knows this key yet.
                    await self.objects.put(
                        self.settings.documents_bucket,
                        event.object_key,
                        doc.content,
                        metadata={"doc-id-sha256": sha256_hex(doc.doc_id.encode())},
                    )
                except Exception as exc:
                    raise unavailable_error(f"store {doc.doc_id!r}", exc, doc_id=doc.doc_id) from exc
                outcome = await self._request(event)
        SUBMITTED.labels(outcome).inc()
        return ingestion_pb2.SubmitResult(
            doc_id=doc.doc_id,
            outcome=ingestion_pb2.SUBMIT_OUTCOME_UNCHANGED
            if outcome == UNCHANGED
            else ingestion_pb2.SUBMIT_OUTCOME_QUEUED,
            content_sha256=submission.sha,
        )

    async def _request(self, event: IngestEvent) -> RequestOutcome:
        """Record ``event`` as the current request (the commit point), then publish it. A
        publish that fails after the commit is left to the reconciler: the request stands."""
        assert self.lifecycle is not None
        try:
            requested = await self.lifecycle.request(event)
        except Exception as exc:
            # The bytes stay: the write may have landed with only its reply lost. Unrecorded,
            # they are an orphan that costs storage only.
            raise unavailable_error(f"queue {event.doc_id!r}", exc, doc_id=event.doc_id) from exc
        if requested.outcome != REQUESTED:
            self._drop_unused(event)
            return requested.outcome
        self.view.apply(event.key, requested.revision, requested.status)
        try:
            await publish_event(self.js, self.settings, event, f"ev-{event.request_id}")  # type: ignore[arg-type]
        except Exception as exc:
            log.warning(
                "publish failed after the request was recorded; the reconciler will publish it",
                extra={"doc_id": event.doc_id, "error": repr(exc)},
            )
        return requested.outcome

    def _drop_unused(self, event: IngestEvent) -> None:
        """The bytes stored for a request that was decided against (the version is indexed or
        pending already): nothing refers to their key."""
        if not event.object_key:
            return

        async def drop() -> None:
            try:
                await self.objects.delete(self.settings.documents_bucket, event.object_key)
            except Exception as exc:
                log.warning(
                    "could not remove an unused object", extra={"doc_id": event.doc_id, "error": repr(exc)}
                )

        task = asyncio.create_task(drop())
        self._pending_drops.add(task)
        task.add_done_callback(self._pending_drops.discard)

    # --- DeleteDocuments --------------------------------------------------------------------

    async def DeleteDocuments(
        self, request: ingestion_pb2.DeleteDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.DeleteDocumentsResponse:
        collection, *building = await self._generations(request.collection)
        if not request.doc_ids:
            raise invalid_argument("no doc_ids in the request")
        if len(request.doc_ids) > self.settings.ingest_max_documents_per_request:
            raise resource_exhausted(
                f"{len(request.doc_ids)} ids, the limit is {self.settings.ingest_max_documents_per_request}"
            )
        ids = [validate_doc_id(doc_id) for doc_id in request.doc_ids]
        statuses = await self._statuses(collection, ids, "delete documents")
        unknown = [i for i, s in zip(ids, statuses, strict=True) if s is None or s.state == DELETED]
        if unknown:
            raise not_found(f"no such documents in {request.collection!r}: {', '.join(unknown[:20])}")
        for doc_id in ids:
            event = IngestEvent(
                op="delete",
                collection=collection,
                doc_id=doc_id,
                submitted_at=time.time(),
                request_id=new_request_id(),
            )
            await self._request(event)
            for other in building:
                await self._request(replace(event, collection=other, request_id=new_request_id()))
        return ingestion_pb2.DeleteDocumentsResponse(queued=len(ids))

    # --- status -----------------------------------------------------------------------------

    async def _statuses(self, collection: str, ids: list[str], doing: str) -> list[DocStatus | None]:
        assert self.lifecycle is not None
        lifecycle = self.lifecycle
        try:
            found = await asyncio.gather(*(lifecycle.status(doc_key(collection, i)) for i in ids))
        except Exception as exc:
            raise unavailable_error(doing, exc, collection=collection) from exc
        return [v.value for v in found]

    async def GetDocumentStatus(
        self, request: ingestion_pb2.GetDocumentStatusRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.GetDocumentStatusResponse:
        collection = (await self._generations(request.collection))[0]
        if not request.doc_ids:
            raise invalid_argument("no doc_ids in the request")
        if len(request.doc_ids) > MAX_STATUS_IDS:
            raise resource_exhausted(f"{len(request.doc_ids)} ids, the limit is {MAX_STATUS_IDS}")
        ids = [validate_doc_id(doc_id) for doc_id in request.doc_ids]
        statuses = await self._statuses(collection, ids, "read document status")
        unknown = [i for i, s in zip(ids, statuses, strict=True) if s is None]
        if unknown:
            raise not_found(f"no such documents in {request.collection!r}: {', '.join(unknown[:20])}")
        return ingestion_pb2.GetDocumentStatusResponse(
            documents=[status_message(s) for s in statuses if s is not None]
        )

    async def GetCollectionStatus(
        self, request: ingestion_pb2.GetCollectionStatusRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.GetCollectionStatusResponse:
        collection = (await self._generations(request.collection))[0]
        self._index_ready()
        counts = self.view.counts(collection)
        if counts is None:
            raise not_found(f"collection {request.collection!r} has no documents")
        states = counts.by_state
        return ingestion_pb2.GetCollectionStatusResponse(
            collection=request.collection,
            queued=states[QUEUED],
            processing=states[PROCESSING],
            indexed=states[INDEXED],
            failed=states[FAILED],
            deleting=states[DELETING],
            chunks=counts.chunks,
            calibration=await self.recorded_calibration(collection),
        )

    async def ListCollections(
        self, request: ingestion_pb2.ListCollectionsRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.ListCollectionsResponse:
        # A collection is listed once, whichever generations of it hold documents.
        self._index_ready()
        names = sorted({split_physical(name)[0] for name in self.view.collections()})
        return ingestion_pb2.ListCollectionsResponse(collections=readable(names))

    async def ListDocuments(
        self, request: ingestion_pb2.ListDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.ListDocumentsResponse:
        # The serving generation's documents (after a reindex they live under C__g<n>).
        collection = (await self._generations(request.collection))[0]
        self._index_ready()
        limit = min(request.limit or DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)
        prefix = request.source_uri_prefix
        if request.by_source_uri:
            page, more = self.view.documents_by_source(
                collection, prefix, request.after_source_uri, request.after_doc_id, limit
            )
        else:
            page, more = self.view.documents(collection, prefix, request.after_doc_id, limit)
        last = page[-1] if more and page else None
        return ingestion_pb2.ListDocumentsResponse(
            documents=[
                ingestion_pb2.DocumentSummary(
                    doc_id=row.doc_id,
                    state=STATE_TO_PROTO.get(row.state, ingestion_pb2.DOCUMENT_STATE_UNSPECIFIED),
                    source_uri=row.source_uri,
                    content_sha256=row.content_sha256,
                )
                for row in page
            ],
            next_after_doc_id=last.doc_id if last else "",
            next_after_source_uri=last.source_uri if last and request.by_source_uri else "",
        )

    # --- dead letters -----------------------------------------------------------------------

    async def ListDeadLetters(
        self, request: ingestion_pb2.ListDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.ListDeadLettersResponse:
        assert self.dead_letters is not None
        collection = validate_collection(request.collection) if request.collection else ""
        limit = min(request.limit or DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)
        try:
            letters, cursor = await self.dead_letters.page(collection, request.after_sequence, limit)
        except Exception as exc:
            raise unavailable_error("list dead letters", exc, collection=collection) from exc
        return ingestion_pb2.ListDeadLettersResponse(
            dead_letters=[
                ingestion_pb2.DeadLetter(
                    sequence=letter.sequence,
                    collection=letter.event.collection if letter.event else "",
                    doc_id=letter.event.doc_id if letter.event else "",
                    reason=letter.reason,
                    attempts=letter.attempts,
                    failed_at=timestamp(letter.failed_at),
                )
                for letter in letters
            ],
            next_after_sequence=cursor,
        )

    async def ReplayDeadLetters(
        self, request: ingestion_pb2.ReplayDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.ReplayDeadLettersResponse:
        collection = validate_collection(request.collection) if request.collection else ""
        letters, cursor = await self._letters_to_replay(request, collection)
        replayed = superseded = 0
        for letter in letters:
            if letter.event is None:
                continue  # undecodable: kept for an operator to read, never replayable
            try:
                if await self._replay(letter):
                    replayed += 1
                else:
                    superseded += 1
            except Exception as exc:
                raise unavailable_error(
                    f"replay dead letter {letter.sequence} ({replayed} replayed before it)",
                    exc,
                    sequence=letter.sequence,
                ) from exc
        return ingestion_pb2.ReplayDeadLettersResponse(
            replayed=replayed, superseded=superseded, next_after_sequence=cursor
        )

    async def _letters_to_replay(
        self, request: ingestion_pb2.ReplayDeadLettersRequest, collection: str
    ) -> tuple[list[DeadLetter], int]:
        """One bounded batch: the requested sequences, or the next page after the cursor."""
        assert self.dead_letters is not None
        dead_letters = self.dead_letters
        batch = self.settings.ingest_replay_batch
        wanted = list(dict.fromkeys(request.sequences))
        if len(wanted) > batch:
            raise resource_exhausted(
                f"{len(wanted)} sequences in one call, the limit is {batch}; replay them in batches"
            )
        try:
            if not wanted:
                return await dead_letters.page(collection, request.after_sequence, batch)
            found = await asyncio.gather(*(dead_letters.get(seq, collection) for seq in wanted))
        except Exception as exc:
            raise unavailable_error("read dead letters", exc, collection=collection) from exc
        missing = [seq for seq, letter in zip(wanted, found, strict=True) if letter is None]
        if missing:
            where = f" in {collection!r}" if collection else ""
            raise not_found(f"no dead letters{where} with sequence {', '.join(map(str, missing[:20]))}")
        return [letter for letter in found if letter is not None], 0

    async def _replay(self, letter: DeadLetter) -> bool:
        """One compare-and-set decides: still the current request -> requeued and published;
        else superseded. Either way the letter is then forgotten. True if requeued."""
        assert self.lifecycle is not None and self.dead_letters is not None and letter.event is not None
        result = await self.lifecycle.replay(letter.event, new_request_id())
        if result.outcome == REQUEUED and result.event is not None:
            self.view.apply(result.event.key, result.revision, result.status)
            try:
                await publish_event(self.js, self.settings, result.event, f"ev-{result.event.request_id}")  # type: ignore[arg-type]
            except Exception as exc:
                log.warning(
                    "publish failed after the replay was recorded; the reconciler will publish it",
                    extra={"doc_id": result.event.doc_id, "error": repr(exc)},
                )
            await self.dead_letters.forget(letter.sequence)
            return True
        await self.dead_letters.forget(letter.sequence)
        # The superseded request's bytes, unless the current request or record still uses them.
        if letter.event.object_key and not await self.lifecycle.object_in_use(
            letter.event.key, letter.event.object_key
        ):
            try:
                await self.objects.delete(self.settings.documents_bucket, letter.event.object_key)
            except Exception as exc:
                log.warning("could not remove a superseded object", extra={"error": repr(exc)})
        return False
