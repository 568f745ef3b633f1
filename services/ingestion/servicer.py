"""IngestionService: validates documents, stores them in the object store, records them as
queued and announces them on the ingest stream; reports lifecycle and manages dead letters."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import grpc
import nats
from google.protobuf.timestamp_pb2 import Timestamp
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from prometheus_client import Counter

from meshkit.auth import READ, WRITE, Rule, readable
from meshkit.errors import ServiceError, invalid_argument, not_found, resource_exhausted, unavailable
from meshkit.ids import doc_id_problem, doc_key, sha256_hex, validate_collection, validate_doc_id
from meshkit.natsconn import connect_options
from meshkit.objectstore import ObjectStore
from meshkit.settings import IngestionSettings
from ragmesh.ingestion.v1 import ingestion_pb2, ingestion_pb2_grpc
from services.ingestion.deadletters import DeadLetters
from services.ingestion.events import IngestEvent, object_key_for
from services.ingestion.normalize import detect_format, document_problem
from services.ingestion.state import (
    DELETE_TARGET,
    DELETING,
    FAILED,
    INDEXED,
    PROCESSING,
    QUEUED,
    Conflict,
    DocStatus,
    StateStore,
    open_buckets,
)
from services.ingestion.status_view import StatusView
from services.ingestion.topology import ensure_topology

log = logging.getLogger("ingestion.api")

SUBMITTED = Counter("ragmesh_ingest_submitted_total", "Documents submitted, by outcome.", ["outcome"])
MAX_TITLE_CHARS = 1000
MAX_METADATA_ENTRIES = 64
MAX_METADATA_CHARS = 4096
MAX_PROBLEMS_REPORTED = 10
SUBMIT_CONCURRENCY = 32
CAS_RETRIES = 5


def _collection(request: Any) -> str:
    return str(request.collection)


# What an API key needs for each method (meshkit.auth). ListCollections answers with the
# collections the key may read; the dead-letter calls without a collection span them all ('*').
ACCESS = {
    "IngestDocuments": Rule(WRITE, _collection),
    "DeleteDocuments": Rule(WRITE, _collection),
    "GetDocumentStatus": Rule(READ, _collection),
    "GetCollectionStatus": Rule(READ, _collection),
    "ListCollections": Rule(READ),
    "ListDeadLetters": Rule(READ, _collection, all_when_empty=True),
    "ReplayDeadLetters": Rule(WRITE, _collection, all_when_empty=True),
}

STATE_TO_PROTO = {
    QUEUED: ingestion_pb2.DOCUMENT_STATE_QUEUED,
    PROCESSING: ingestion_pb2.DOCUMENT_STATE_PROCESSING,
    INDEXED: ingestion_pb2.DOCUMENT_STATE_INDEXED,
    FAILED: ingestion_pb2.DOCUMENT_STATE_FAILED,
    DELETING: ingestion_pb2.DOCUMENT_STATE_DELETING,
    "deleted": ingestion_pb2.DOCUMENT_STATE_DELETED,
}


@dataclass(frozen=True)
class Submission:
    doc: ingestion_pb2.Document
    fmt: int
    sha: str


def _timestamp(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


class IngestionServicer(ingestion_pb2_grpc.IngestionServiceServicer):
    def __init__(self, settings: IngestionSettings) -> None:
        self.settings = settings
        self.view = StatusView()
        self.nc: NATS | None = None
        self.js: JetStreamContext | None = None
        self.state: StateStore | None = None
        self.dead_letters: DeadLetters | None = None
        self.objects = ObjectStore.from_settings(settings)
        self._submit_slots = asyncio.Semaphore(SUBMIT_CONCURRENCY)

    async def start(self) -> None:
        self.nc = await nats.connect(
            **connect_options(self.settings),
            name="ingestion-api",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
        )
        self.js = self.nc.jetstream()
        await ensure_topology(self.js, self.settings)
        status_kv, records_kv = await open_buckets(self.js)
        self.state = StateStore(status_kv, records_kv)
        self.dead_letters = DeadLetters(self.nc, self.js, self.settings)
        await self.dead_letters.watch_max_deliveries(self._last_reason)
        await self.objects.ensure_bucket(self.settings.documents_bucket)
        await self.view.start(status_kv)

    async def stop(self) -> None:
        await self.view.stop()
        if self.nc:
            await self.nc.drain()

    async def _last_reason(self, event: IngestEvent) -> str:
        assert self.state is not None
        current = await self.state.get_status(doc_key(event.collection, event.doc_id))
        reason = current.value.reason if current.value else ""
        return (
            f"exceeded {self.settings.ingest_max_deliver} deliveries; last error: {reason or 'worker lost'}"
        )

    # --- IngestDocuments --------------------------------------------------------------------

    async def IngestDocuments(
        self, request: ingestion_pb2.IngestDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.IngestDocumentsResponse:
        collection = validate_collection(request.collection)
        submissions = self._validate_documents(request)
        results = await asyncio.gather(*(self._submit(collection, s) for s in submissions))
        return ingestion_pb2.IngestDocumentsResponse(results=results)

    def _validate_documents(self, request: ingestion_pb2.IngestDocumentsRequest) -> list[Submission]:
        """All-or-nothing: every problem is collected and reported before anything is written."""
        docs = request.documents
        if not docs:
            raise invalid_argument("no documents in the request")
        limit = self.settings.ingest_max_documents_per_request
        if len(docs) > limit:
            raise resource_exhausted(f"{len(docs)} documents in one request, the limit is {limit}")
        problems: list[str] = []
        too_large: list[str] = []
        seen: set[str] = set()
        submissions = []
        for index, doc in enumerate(docs):
            label = f"document {index} ({doc.doc_id[:80]!r})"
            problem = doc_id_problem(doc.doc_id)
            if problem is None and doc.doc_id in seen:
                problem = "doc_id appears twice in the request"
            seen.add(doc.doc_id)
            if problem is None and len(doc.content) > self.settings.ingest_max_document_bytes:
                too_large.append(
                    f"{label}: {len(doc.content)} bytes, "
                    f"the limit is {self.settings.ingest_max_document_bytes}"
                )
                continue
            fmt = doc.format or (detect_format(doc.source_uri or doc.doc_id, doc.content) or 0)
            problem = problem or self._metadata_problem(doc) or self._content_problem(doc, fmt)
            if problem:
                problems.append(f"{label}: {problem}")
                continue
            submissions.append(Submission(doc, fmt, sha256_hex(doc.content)))
        if too_large:
            raise resource_exhausted(self._summarise(too_large))
        if problems:
            raise invalid_argument(self._summarise(problems))
        return submissions

    @staticmethod
    def _summarise(problems: list[str]) -> str:
        shown = "; ".join(problems[:MAX_PROBLEMS_REPORTED])
        more = len(problems) - MAX_PROBLEMS_REPORTED
        return f"nothing was ingested: {shown}" + (f"; and {more} more" if more > 0 else "")

    @staticmethod
    def _metadata_problem(doc: ingestion_pb2.Document) -> str | None:
        if len(doc.title) > MAX_TITLE_CHARS:
            return f"title is {len(doc.title)} chars, the limit is {MAX_TITLE_CHARS}"
        if len(doc.metadata) > MAX_METADATA_ENTRIES:
            return f"{len(doc.metadata)} metadata entries, the limit is {MAX_METADATA_ENTRIES}"
        size = sum(len(k) + len(v) for k, v in doc.metadata.items()) + len(doc.source_uri)
        if size > MAX_METADATA_CHARS:
            return f"metadata and source_uri take {size} chars, the limit is {MAX_METADATA_CHARS}"
        return None

    @staticmethod
    def _content_problem(doc: ingestion_pb2.Document, fmt: int) -> str | None:
        if fmt == ingestion_pb2.DOCUMENT_FORMAT_UNSPECIFIED:
            return "unknown format: set format or use a .md, .txt, .html or .pdf name"
        if fmt not in ingestion_pb2.DocumentFormat.values():
            return f"unknown format {fmt}"
        if not doc.content:
            return "document is empty"
        if fmt == ingestion_pb2.DOCUMENT_FORMAT_PDF:
            # Full parsing happens in the worker; an unparseable PDF is dead-lettered there.
            return None if doc.content.startswith(b"%PDF-") else "content is not a PDF (no %PDF- header)"
        return document_problem(doc.content, fmt)

    async def _submit(self, collection: str, submission: Submission) -> ingestion_pb2.SubmitResult:
        assert self.state is not None and self.js is not None
        doc = submission.doc
        key = doc_key(collection, doc.doc_id)
        async with self._submit_slots:
            try:
                current = await self.state.get_status(key)
                status: DocStatus | None = current.value
                if (
                    status is not None
                    and status.state == INDEXED
                    and status.indexed_sha256 == submission.sha
                    and status.target_sha256 == submission.sha
                ):
                    SUBMITTED.labels("unchanged").inc()
                    return ingestion_pb2.SubmitResult(
                        doc_id=doc.doc_id,
                        outcome=ingestion_pb2.SUBMIT_OUTCOME_UNCHANGED,
                        content_sha256=submission.sha,
                    )
                event = IngestEvent(
                    op="upsert",
                    collection=collection,
                    doc_id=doc.doc_id,
                    content_sha256=submission.sha,
                    object_key=object_key_for(collection, key, submission.sha),
                    format=submission.fmt,
                    title=doc.title,
                    source_uri=doc.source_uri,
                    submitted_at=time.time(),
                )
                # Bytes first: the event must never point at an object that does not exist.
                await self.objects.put(
                    self.settings.documents_bucket,
                    event.object_key,
                    doc.content,
                    metadata={"doc-id-sha256": sha256_hex(doc.doc_id.encode())},
                )
                await self._request(key, event, QUEUED)
            except ServiceError:
                raise
            except Exception as exc:
                log.warning("submit failed", extra={"doc_id": doc.doc_id, "error": repr(exc)})
                raise unavailable(f"could not queue {doc.doc_id!r}: {exc!r}; retry the call") from exc
        SUBMITTED.labels("queued").inc()
        return ingestion_pb2.SubmitResult(
            doc_id=doc.doc_id, outcome=ingestion_pb2.SUBMIT_OUTCOME_QUEUED, content_sha256=submission.sha
        )

    async def _request(self, key: str, event: IngestEvent, state: str) -> None:
        """Record the new target version (CAS) and then publish the event. A document a worker
        holds stays PROCESSING (its lease must survive); the worker sees the new target when it
        finishes and leaves the document queued for the newer event."""
        assert self.state is not None and self.js is not None
        target = DELETE_TARGET if event.op == "delete" else event.content_sha256
        for _ in range(CAS_RETRIES):
            current = await self.state.get_status(key)
            previous = current.value
            base = previous or DocStatus(event.collection, event.doc_id, state)
            keep_processing = previous is not None and previous.state == PROCESSING
            updated = base.with_changes(
                state=PROCESSING if keep_processing else state, target_sha256=target, reason="", attempts=0
            )
            try:
                revision = await self.state.put_status(key, updated, current.revision)
            except Conflict:
                continue
            self.view.apply(key, revision, updated)
            break
        else:
            raise unavailable(f"document {event.doc_id!r} is being updated concurrently; retry")
        try:
            await self.js.publish(
                event.subject,
                event.to_bytes(),
                stream=self.settings.ingest_stream,
                headers={"Nats-Msg-Id": uuid.uuid4().hex},
            )
        except Exception:
            await self._revert(key, revision, previous)
            raise

    async def _revert(self, key: str, revision: int, previous: DocStatus | None) -> None:
        """The event never made it onto the stream: put the status back so it does not claim
        a queued document that nothing will process."""
        assert self.state is not None
        try:
            if previous is None:
                await self.state.status.purge(key)
                self.view.apply(key, revision + 1, None)
            else:
                new_revision = await self.state.put_status(key, previous, revision)
                self.view.apply(key, new_revision, previous)
        except Exception:
            log.exception("could not revert status after a failed publish", extra={"key": key})

    # --- DeleteDocuments --------------------------------------------------------------------

    async def DeleteDocuments(
        self, request: ingestion_pb2.DeleteDocumentsRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.DeleteDocumentsResponse:
        assert self.state is not None
        collection = validate_collection(request.collection)
        if not request.doc_ids:
            raise invalid_argument("no doc_ids in the request")
        if len(request.doc_ids) > self.settings.ingest_max_documents_per_request:
            raise resource_exhausted(
                f"{len(request.doc_ids)} ids, the limit is {self.settings.ingest_max_documents_per_request}"
            )
        ids = [validate_doc_id(doc_id) for doc_id in request.doc_ids]
        statuses = await asyncio.gather(*(self.state.get_status(doc_key(collection, i)) for i in ids))
        unknown = [
            i for i, s in zip(ids, statuses, strict=True) if s.value is None or s.value.state == "deleted"
        ]
        if unknown:
            raise not_found(f"no such documents in {collection!r}: {', '.join(unknown[:20])}")
        for doc_id in ids:
            event = IngestEvent(op="delete", collection=collection, doc_id=doc_id, submitted_at=time.time())
            await self._request(doc_key(collection, doc_id), event, DELETING)
        return ingestion_pb2.DeleteDocumentsResponse(queued=len(ids))

    # --- status -----------------------------------------------------------------------------

    async def GetDocumentStatus(
        self, request: ingestion_pb2.GetDocumentStatusRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.GetDocumentStatusResponse:
        assert self.state is not None
        collection = validate_collection(request.collection)
        if not request.doc_ids:
            raise invalid_argument("no doc_ids in the request")
        if len(request.doc_ids) > 1000:
            raise resource_exhausted(f"{len(request.doc_ids)} ids, the limit is 1000")
        ids = [validate_doc_id(doc_id) for doc_id in request.doc_ids]
        statuses = await asyncio.gather(*(self.state.get_status(doc_key(collection, i)) for i in ids))
        unknown = [i for i, s in zip(ids, statuses, strict=True) if s.value is None]
        if unknown:
            raise not_found(f"no such documents in {collection!r}: {', '.join(unknown[:20])}")
        return ingestion_pb2.GetDocumentStatusResponse(
            documents=[self._status_message(s.value) for s in statuses]
        )

    @staticmethod
    def _status_message(status: DocStatus) -> ingestion_pb2.DocumentStatus:
        return ingestion_pb2.DocumentStatus(
            collection=status.collection,
            doc_id=status.doc_id,
            state=STATE_TO_PROTO.get(status.state, ingestion_pb2.DOCUMENT_STATE_UNSPECIFIED),
            reason=status.reason,
            attempts=status.attempts,
            chunks=status.chunks,
            content_sha256=status.indexed_sha256 or status.target_sha256,
            updated_at=_timestamp(status.updated_at),
        )

    async def GetCollectionStatus(
        self, request: ingestion_pb2.GetCollectionStatusRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.GetCollectionStatusResponse:
        collection = validate_collection(request.collection)
        counts = self.view.counts(collection)
        if counts is None:
            raise not_found(f"collection {collection!r} has no documents")
        states = counts.by_state
        return ingestion_pb2.GetCollectionStatusResponse(
            collection=collection,
            queued=states[QUEUED],
            processing=states[PROCESSING],
            indexed=states[INDEXED],
            failed=states[FAILED],
            deleting=states[DELETING],
            chunks=counts.chunks,
        )

    async def ListCollections(
        self, request: ingestion_pb2.ListCollectionsRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.ListCollectionsResponse:
        return ingestion_pb2.ListCollectionsResponse(collections=readable(self.view.collections()))

    # --- dead letters -----------------------------------------------------------------------

    async def ListDeadLetters(
        self, request: ingestion_pb2.ListDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.ListDeadLettersResponse:
        assert self.dead_letters is not None
        collection = validate_collection(request.collection) if request.collection else ""
        limit = min(request.limit or 1000, 10_000)
        letters = await self.dead_letters.list(collection, limit)
        return ingestion_pb2.ListDeadLettersResponse(
            dead_letters=[
                ingestion_pb2.DeadLetter(
                    sequence=letter.sequence,
                    collection=letter.event.collection if letter.event else "",
                    doc_id=letter.event.doc_id if letter.event else "",
                    reason=letter.reason,
                    attempts=letter.attempts,
                    failed_at=_timestamp(letter.failed_at),
                )
                for letter in letters
            ]
        )

    async def ReplayDeadLetters(
        self, request: ingestion_pb2.ReplayDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> ingestion_pb2.ReplayDeadLettersResponse:
        assert self.dead_letters is not None and self.state is not None
        collection = validate_collection(request.collection) if request.collection else ""
        letters = await self.dead_letters.list(collection, limit=1_000_000)
        wanted = set(request.sequences)
        if wanted - {letter.sequence for letter in letters}:
            missing = sorted(wanted - {letter.sequence for letter in letters})
            raise not_found(f"no dead letters with sequence {', '.join(map(str, missing[:20]))}")
        chosen = [letter for letter in letters if letter.event and (not wanted or letter.sequence in wanted)]
        replayed = 0
        for letter in chosen:
            assert letter.event is not None
            key = doc_key(letter.event.collection, letter.event.doc_id)
            if await self._superseded(key, letter.event):
                # A newer version was submitted since: replaying would bring the old one back.
                await self.dead_letters.forget(letter.sequence)
                continue
            state = DELETING if letter.event.op == "delete" else QUEUED
            await self._request(key, letter.event, state)
            await self.dead_letters.forget(letter.sequence)
            replayed += 1
        return ingestion_pb2.ReplayDeadLettersResponse(replayed=replayed)

    async def _superseded(self, key: str, event: IngestEvent) -> bool:
        assert self.state is not None
        current = (await self.state.get_status(key)).value
        target = DELETE_TARGET if event.op == "delete" else event.content_sha256
        return current is not None and current.target_sha256 != target
