"""Indexing claimed documents: fetch, normalise, chunk, diff against the record manager, embed
only new chunks, replace each document atomically in every index shard and in the sparse store
under the claim's fence, then record what is indexed.

Documents flow on as they are ready: each job prepares (bytes -> chunks -> diff) on its own,
and the jobs that finished preparing by the time the previous group left form the next write
group, which shares its Embed calls and makes one ReplaceDocuments per store. A slow document
therefore never holds back its batch-mates; each job is settled (``settle``) as soon as its
group is done.

Every write happens under the job's claim (services/ingestion/lifecycle/): the claim is
checked before the stores are written, the stores get its fence and answer ``stale_doc_ids``
for a replacement older than one they applied, and the record is committed only while the
claim holds. A job whose claim was taken over writes nothing more and is settled as lost.

What a job carries and how a failure is told to callers: services/ingestion/jobs.py; the
downstream clients: services/ingestion/stores.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict

from prometheus_client import Counter, Histogram

from meshkit.core.errors import ServiceError
from meshkit.domain.collections import CollectionRegistry, EmbedderIdentity, RecordConflict
from meshkit.domain.ids import chunk_id_for, document_shard, sha256_hex
from meshkit.rpc import tracing
from meshkit.rpc.client import Downstream
from meshkit.settings import IngestionSettings
from meshkit.storage.objectstore import ObjectNotFound, ObjectStore
from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2
from ragmesh.index.v1 import index_pb2
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from services.ingestion.chunking import ChunkDraft, Chunker
from services.ingestion.events import IngestEvent
from services.ingestion.jobs import Job, JobFailure, PreparedChunk, Settle, failure_of
from services.ingestion.lifecycle.entries import DocRecord
from services.ingestion.lifecycle.outcomes import ClaimLost
from services.ingestion.lifecycle.store import Lifecycle
from services.ingestion.sandbox import DocumentSandbox, PreparationFailed
from services.ingestion.stores import Stores

log = logging.getLogger(__name__)

CHUNKS_EMBEDDED = Counter("ragmesh_ingest_chunks_embedded_total", "Chunks sent to the embedder.")
CHUNKS_REUSED = Counter("ragmesh_ingest_chunks_reused_total", "Unchanged chunks kept without embedding.")
DOCS_DONE = Counter("ragmesh_ingest_documents_total", "Documents processed.", ["op", "outcome"])
STAGE_SECONDS = Histogram(
    "ragmesh_ingest_stage_seconds",
    "Time per pipeline stage and group of documents.",
    ["stage"],
    buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)

CLEANUP_TIMEOUT_S = 60.0
STORE_CALL_TIMEOUT_S = 120.0


def _location(draft: ChunkDraft) -> common_pb2.ChunkLocation:
    return common_pb2.ChunkLocation(
        heading_path=draft.heading_path,
        ordinal=draft.ordinal,
        char_start=draft.char_start,
        char_end=draft.char_end,
    )


def _log_preparation_failure(event: IngestEvent, exc: PreparationFailed) -> None:
    """What a parser said of a document goes here, tagged with the document and its request
    (the log line also carries the batch's request id): never into the document's reason."""
    if not exc.detail:
        return
    log.warning(
        "document could not be prepared",
        extra={
            "collection": event.collection,
            "doc_id": event.doc_id,
            "ingest_request_id": event.request_id,
            "reason": exc.reason,
            "detail": exc.detail,
        },
    )


class IngestPipeline:
    def __init__(
        self,
        settings: IngestionSettings,
        objects: ObjectStore,
        lifecycle: Lifecycle,
        stores: Stores,
        chunker: Chunker,
        collections: CollectionRegistry | None = None,
    ) -> None:
        self.settings = settings
        # None: no embedder check (unit tests of other stages).
        self.collections = collections
        self.objects = objects
        self.lifecycle = lifecycle
        self.stores = stores
        self.chunker = chunker
        self.sandbox = DocumentSandbox(settings, chunker)
        self._embed_slots = asyncio.Semaphore(max(1, settings.ingest_embed_concurrency))
        self._cleanups: set[asyncio.Task[None]] = set()

    async def process(self, jobs: list[Job], settle: Settle) -> None:
        """Run every job to an outcome and ``settle`` it as soon as it has one: on settling,
        a job either succeeded (``failure`` None, not lost: its record is committed), failed
        (``failure``) or lost its claim (``lost``)."""
        ready: asyncio.Queue[Job] = asyncio.Queue()

        async def prepare(job: Job) -> None:
            try:
                with tracing.attached(job.trace):
                    await self._prepare(job)
            finally:
                ready.put_nowait(job)

        preparing = [asyncio.create_task(prepare(job)) for job in jobs]
        groups: list[asyncio.Task[None]] = []
        try:
            waiting = len(jobs)
            while waiting:
                group = [await ready.get()]
                while not ready.empty():
                    group.append(ready.get_nowait())
                waiting -= len(group)
                groups.append(asyncio.create_task(self._index_group(group, settle)))
            await asyncio.gather(*groups)
        finally:
            for task in (*preparing, *groups):
                task.cancel()
            await asyncio.gather(*preparing, *groups, return_exceptions=True)

    async def _index_group(self, jobs: list[Job], settle: Settle) -> None:
        with tracing.grouped("ingest.index", [job.trace for job in jobs]):
            await self._index_group_traced(jobs, settle)

    async def _index_group_traced(self, jobs: list[Job], settle: Settle) -> None:
        started = time.perf_counter()
        live = [job for job in jobs if job.live]
        await self._embed(live)
        live = [job for job in live if job.live]
        await self._check_claims(live)
        live = [job for job in live if job.live]
        await self._write(live)
        live = [job for job in live if job.live]
        await asyncio.gather(*(self._commit(job) for job in live))
        STAGE_SECONDS.labels("group").observe(time.perf_counter() - started)
        for job in jobs:
            outcome = "lost" if job.lost else "ok" if job.failure is None else "failed"
            DOCS_DONE.labels(job.event.op, outcome).inc()
        await asyncio.gather(*(settle(job) for job in jobs))

    async def _check_claims(self, jobs: list[Job]) -> None:
        """Preparing and embedding can take long: a claim taken over meanwhile must not write
        the stores (their fence check covers the moments after this one)."""

        async def check(job: Job) -> None:
            try:
                await self.lifecycle.verify(job.claim)
            except Exception as exc:
                job.failure = failure_of(exc, "checking the claim", job)

        await asyncio.gather(*(check(job) for job in jobs))

    # --- prepare: bytes -> chunks -> diff ---------------------------------------------------

    async def _prepare(self, job: Job) -> None:
        started = time.perf_counter()
        try:
            job.record = await self.lifecycle.record(job.key)
            if job.event.op == "upsert":
                await self._chunk(job)
        except Exception as exc:
            job.failure = failure_of(exc, "preparing the document", job)
        STAGE_SECONDS.labels("prepare").observe(time.perf_counter() - started)

    async def _chunk(self, job: Job) -> None:
        event = job.event
        try:
            content = await self.objects.get(self.settings.documents_bucket, event.object_key)
        except ObjectNotFound as exc:
            raise JobFailure(
                "the document's stored bytes are missing from the object store", permanent=True
            ) from exc
        if sha256_hex(content) != event.content_sha256:
            raise JobFailure("stored bytes do not match the event's sha256", permanent=True)
        if len(content) > self.settings.ingest_max_document_bytes:
            raise JobFailure(
                f"document is {len(content)} bytes, limit {self.settings.ingest_max_document_bytes}",
                permanent=True,
            )
        try:
            # In a child process under a CPU budget: a pathological document cannot freeze
            # this process (its event loop, heartbeat and other documents).
            prepared = await self.sandbox.prepare(content, event.format, event.title)
        except PreparationFailed as exc:
            _log_preparation_failure(event, exc)
            # Not permanent only when this worker stopped its children (shutting down): the
            # document is not at fault, another worker will prepare it.
            raise JobFailure(exc.reason, permanent=exc.permanent, transient=not exc.permanent) from exc
        drafts = prepared.drafts
        if not drafts:
            raise JobFailure("document produced no chunks", permanent=True)
        if len(drafts) > self.settings.ingest_max_chunks_per_document:
            raise JobFailure(
                f"document produced {len(drafts)} chunks, "
                f"limit {self.settings.ingest_max_chunks_per_document}",
                permanent=True,
            )
        job.title = prepared.title
        job.document_metadata = prepared.metadata
        job.chunks = self._identify(event, drafts)

    def _identify(self, event: IngestEvent, drafts: list[ChunkDraft]) -> list[PreparedChunk]:
        seen: set[str] = set()
        chunks = []
        for draft in drafts:
            chunk_id = chunk_id_for(event.collection, event.doc_id, draft.text)
            if chunk_id in seen:  # a repeated passage is indexed once
                continue
            seen.add(chunk_id)
            chunks.append(PreparedChunk(chunk_id, draft))
        return chunks

    # --- embed: only what the record manager has not seen -----------------------------------

    async def _embed(self, jobs: list[Job]) -> None:
        pending = [(job, chunk) for job in jobs for chunk in job.new_chunks()]
        CHUNKS_REUSED.inc(sum(len(job.chunks) - len(job.new_chunks()) for job in jobs))
        if not pending:
            return
        started = time.perf_counter()
        size = self.settings.ingest_embed_batch
        # One collection per batch: an embedder refused by one collection fails only its jobs.
        by_collection: dict[str, list[tuple[Job, PreparedChunk]]] = defaultdict(list)
        for job, chunk in pending:
            by_collection[job.event.collection].append((job, chunk))
        batches = [
            items[i : i + size] for items in by_collection.values() for i in range(0, len(items), size)
        ]
        results = await asyncio.gather(*(self._embed_batch(b) for b in batches), return_exceptions=True)
        for batch, result in zip(batches, results, strict=True):
            if isinstance(result, BaseException):
                failure = failure_of(result, "embedding")
                for job, _chunk in batch:
                    job.failure = job.failure or failure
        STAGE_SECONDS.labels("embed").observe(time.perf_counter() - started)

    async def _embed_batch(self, batch: list[tuple[Job, PreparedChunk]]) -> None:
        request = embedder_pb2.EmbedRequest(
            texts=[chunk.draft.text for _job, chunk in batch], kind=embedder_pb2.TEXT_KIND_PASSAGE
        )
        async with self._embed_slots:
            reply = await self.stores.embedder.call(
                self.stores.embedder.stub.Embed, request, idempotent=True, timeout=STORE_CALL_TIMEOUT_S
            )
        if len(reply.vectors) != len(batch):
            raise JobFailure("embedder returned a wrong number of vectors", permanent=False)
        identity = EmbedderIdentity.of_reply(reply.model, reply.model_sha256, reply.vectors)
        if identity is not None:
            for collection in dict.fromkeys(job.event.collection for job, _chunk in batch):
                await self._admit(collection, identity)
        for (_job, chunk), vector in zip(batch, reply.vectors, strict=True):
            chunk.vector = list(vector.values)
        CHUNKS_EMBEDDED.inc(len(batch))

    async def _admit(self, collection: str, identity: EmbedderIdentity) -> None:
        """Vectors of one model only per collection generation (meshkit.domain.collections): the
        first write records the embedder, another embedder's vectors are refused for good
        (dead-lettered with the reason; replayable once the right embedder serves again)."""
        if self.collections is None:
            return
        try:
            await self.collections.admit(collection, identity)
        except ServiceError as exc:
            raise JobFailure(f"FAILED_PRECONDITION: {exc.message}", permanent=True) from exc
        except RecordConflict as exc:
            raise JobFailure("collection record contended", permanent=False, transient=True) from exc

    # --- write: one atomic, fenced replacement per document, per store ----------------------

    async def _write(self, jobs: list[Job]) -> None:
        started = time.perf_counter()
        by_collection: dict[str, list[Job]] = defaultdict(list)
        for job in jobs:
            by_collection[job.event.collection].append(job)
        await asyncio.gather(*(self._write_collection(c, js) for c, js in by_collection.items()))
        STAGE_SECONDS.labels("write").observe(time.perf_counter() - started)

    async def _write_collection(self, collection: str, jobs: list[Job]) -> None:
        calls = [
            self._replace_in_shard(collection, group, shard) for shard, group in self._by_index_shard(jobs)
        ]
        calls.append(self._replace_in_sparse(collection, jobs))
        results = await asyncio.gather(*calls, return_exceptions=True)
        stale: set[str] = set()
        failures: list[JobFailure] = []
        for result in results:
            if isinstance(result, BaseException):
                failures.append(failure_of(result, "writing the stores"))
            else:
                stale.update(result)
        for job in jobs:
            if job.event.doc_id in stale:
                # A store applied a newer fence for this document: another worker owns it now.
                log.warning("stale write refused by a store", extra={"doc_id": job.event.doc_id})
                job.claim.lost = True
        if failures:
            transient = all(f.transient for f in failures)
            reason = "; ".join(dict.fromkeys(f.reason for f in failures))[:500]
            for job in jobs:
                job.failure = JobFailure(reason, permanent=False, transient=transient)

    def _by_index_shard(self, jobs: list[Job]) -> list[tuple[int, list[Job]]]:
        """The jobs grouped by the index shard that owns their document (all its chunks)."""
        owned: dict[int, list[Job]] = {}
        for job in jobs:
            owned.setdefault(document_shard(job.event.doc_id, len(self.stores.shards)), []).append(job)
        return sorted(owned.items())

    async def _replace_in_shard(self, collection: str, jobs: list[Job], shard: int) -> set[str]:
        downstream = self.stores.shards[shard]
        documents = [self._shard_replacement(job, resend=set()) for job in jobs]
        request = index_pb2.ReplaceDocumentsRequest(collection=collection, documents=documents)
        reply = await downstream.call(
            downstream.stub.ReplaceDocuments, request, idempotent=True, timeout=STORE_CALL_TIMEOUT_S
        )
        stale = set(reply.stale_doc_ids)
        if reply.missing_chunk_ids:
            # The shard lost chunks we believed indexed (e.g. restored from an older snapshot):
            # send them again with vectors.
            missing = set(reply.missing_chunk_ids)
            again = [job for job in jobs if job.event.doc_id not in stale]
            await self._embed_missing(again, missing)
            documents = [self._shard_replacement(job, resend=missing) for job in again]
            request = index_pb2.ReplaceDocumentsRequest(collection=collection, documents=documents)
            reply = await downstream.call(
                downstream.stub.ReplaceDocuments, request, idempotent=True, timeout=STORE_CALL_TIMEOUT_S
            )
            stale.update(reply.stale_doc_ids)
        return stale

    def _shard_replacement(self, job: Job, resend: set[str]) -> index_pb2.DocumentReplacement:
        previous = job.previous_chunk_ids
        upserts, keep = [], []
        for chunk in job.chunks:
            if chunk.chunk_id in previous and chunk.chunk_id not in resend:
                keep.append(chunk.chunk_id)
            else:
                upserts.append(
                    index_pb2.Chunk(
                        chunk_id=chunk.chunk_id,
                        doc_id=job.event.doc_id,
                        vector=common_pb2.Vector(values=chunk.vector or []),
                        # The payload: what the gateway shows when sparse cannot give it.
                        text=chunk.draft.text,
                        location=_location(chunk.draft),
                    )
                )
        return index_pb2.DocumentReplacement(
            doc_id=job.event.doc_id,
            upserts=upserts,
            keep_chunk_ids=keep,
            fence=job.fence,
            source=job.source(),
        )

    async def _embed_missing(self, jobs: list[Job], missing: set[str]) -> None:
        pending = [(job, c) for job in jobs for c in job.chunks if c.chunk_id in missing and c.vector is None]
        size = self.settings.ingest_embed_batch
        for i in range(0, len(pending), size):
            await self._embed_batch(pending[i : i + size])

    async def _replace_in_sparse(self, collection: str, jobs: list[Job]) -> set[str]:
        """Every document on the sparse shard that owns it, the shards written concurrently."""
        shards = self.stores.sparse_shards
        owned: dict[int, list[Job]] = {}
        for job in jobs:
            owned.setdefault(document_shard(job.event.doc_id, len(shards)), []).append(job)
        results = await asyncio.gather(
            *(self._replace_on_sparse_shard(shards[n], collection, group) for n, group in owned.items()),
            return_exceptions=True,
        )
        # Every shard's call is over before a failure is reported: none is left running unseen.
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return set().union(*(r for r in results if not isinstance(r, BaseException)))

    async def _replace_on_sparse_shard(
        self, sparse: Downstream[sparse_pb2_grpc.SparseServiceStub], collection: str, jobs: list[Job]
    ) -> set[str]:
        documents = [self._sparse_replacement(job, resend=set()) for job in jobs]
        request = sparse_pb2.ReplaceDocumentsRequest(collection=collection, documents=documents)
        reply = await sparse.call(
            sparse.stub.ReplaceDocuments, request, idempotent=True, timeout=STORE_CALL_TIMEOUT_S
        )
        stale = set(reply.stale_doc_ids)
        if reply.missing_chunk_ids:
            missing = set(reply.missing_chunk_ids)
            documents = [
                self._sparse_replacement(job, resend=missing) for job in jobs if job.event.doc_id not in stale
            ]
            request = sparse_pb2.ReplaceDocumentsRequest(collection=collection, documents=documents)
            reply = await sparse.call(
                sparse.stub.ReplaceDocuments, request, idempotent=True, timeout=STORE_CALL_TIMEOUT_S
            )
            stale.update(reply.stale_doc_ids)
        return stale

    def _sparse_replacement(self, job: Job, resend: set[str]) -> sparse_pb2.DocumentReplacement:
        previous = job.previous_chunk_ids
        upserts, keep = [], []
        for chunk in job.chunks:
            if chunk.chunk_id in previous and chunk.chunk_id not in resend:
                keep.append(chunk.chunk_id)
                continue
            draft = chunk.draft
            upserts.append(
                sparse_pb2.ChunkText(
                    chunk_id=chunk.chunk_id,
                    doc_id=job.event.doc_id,
                    title=job.title,
                    text=draft.text,
                    location=_location(draft),
                )
            )
        return sparse_pb2.DocumentReplacement(
            doc_id=job.event.doc_id,
            upserts=upserts,
            keep_chunk_ids=keep,
            fence=job.fence,
            source=job.source(),
        )

    # --- commit: the record manager learns what is now indexed ------------------------------

    async def _commit(self, job: Job) -> None:
        record = None
        if job.event.op == "upsert":
            record = DocRecord(
                collection=job.event.collection,
                doc_id=job.event.doc_id,
                content_sha256=job.event.content_sha256,
                object_key=job.event.object_key,
                title=job.title,
                chunk_ids=[c.chunk_id for c in job.chunks],
                fence=job.fence,
            )
        base = job.record.revision if job.record else 0
        try:
            await self.lifecycle.commit_record(job.claim, record, base)
        except ClaimLost:
            job.claim.lost = True
            return
        except Exception as exc:
            job.failure = failure_of(exc, "recording the indexed version", job)
            return
        job.committed = True

    # --- cleanup: exact keys, never a prefix listing ----------------------------------------

    def drop_object_later(self, key: str, object_key: str) -> None:
        """Delete ``object_key`` in the background unless the document's current request or
        record still uses it. Raw bytes are only storage: their removal never holds up an ack."""
        if not object_key:
            return
        task = asyncio.create_task(self._drop_object(key, object_key))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _drop_object(self, key: str, object_key: str) -> None:
        try:
            async with asyncio.timeout(CLEANUP_TIMEOUT_S):
                if await self.lifecycle.object_in_use(key, object_key):
                    return
                await self.objects.delete(self.settings.documents_bucket, object_key)
        except Exception as exc:
            # An orphaned object costs storage only; it is never read again.
            log.warning(
                "could not remove a superseded document object", extra={"key": key, "error": repr(exc)}
            )

    async def close(self) -> None:
        for task in list(self._cleanups):
            task.cancel()
        await asyncio.gather(*self._cleanups, return_exceptions=True)
        await self.sandbox.close()
