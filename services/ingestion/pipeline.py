"""Indexing a batch of claimed documents: fetch, normalise, chunk, diff against the record
manager, embed only new chunks, replace each document atomically in every index shard and in
the sparse store, then record what is indexed.

Batching documents together lets concurrent small documents share embedding calls and
lets each store commit once per batch instead of once per document.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Histogram

from meshkit.client import Downstream, DownstreamError
from meshkit.ids import chunk_id_for, doc_key, sha256_hex, shard_of
from meshkit.objectstore import ObjectNotFound, ObjectStore
from meshkit.settings import IngestionSettings
from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from services.ingestion.chunking import ChunkDraft, Chunker
from services.ingestion.events import IngestEvent
from services.ingestion.sandbox import DocumentSandbox, PreparationFailed
from services.ingestion.state import Conflict, DocRecord, DocStatus, StateStore, Versioned

log = logging.getLogger(__name__)

CHUNKS_EMBEDDED = Counter("ragmesh_ingest_chunks_embedded_total", "Chunks sent to the embedder.")
CHUNKS_REUSED = Counter("ragmesh_ingest_chunks_reused_total", "Unchanged chunks kept without embedding.")
DOCS_DONE = Counter("ragmesh_ingest_documents_total", "Documents processed.", ["op", "outcome"])
STAGE_SECONDS = Histogram(
    "ragmesh_ingest_stage_seconds",
    "Time per pipeline stage and batch.",
    ["stage"],
    buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


CLEANUP_TIMEOUT_S = 60.0


class JobFailure(Exception):
    """A document that could not be indexed. ``permanent``: retrying cannot help."""

    def __init__(self, reason: str, *, permanent: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.permanent = permanent


@dataclass
class PreparedChunk:
    chunk_id: str
    shard: int
    draft: ChunkDraft
    vector: list[float] | None = None


@dataclass
class Job:
    """One claimed event and what the pipeline learns about it."""

    event: IngestEvent
    status: DocStatus
    status_revision: int
    attempt: int
    chunks: list[PreparedChunk] = field(default_factory=list)
    title: str = ""
    record: Versioned | None = None
    failure: JobFailure | None = None

    @property
    def key(self) -> str:
        return doc_key(self.event.collection, self.event.doc_id)

    @property
    def previous_chunk_ids(self) -> set[str]:
        record = self.record.value if self.record else None
        return set(record.chunk_ids) if record else set()

    def new_chunks(self) -> list[PreparedChunk]:
        previous = self.previous_chunk_ids
        return [c for c in self.chunks if c.chunk_id not in previous]


class Stores:
    """The downstream services one worker writes to."""

    def __init__(
        self,
        embedder: Downstream[embedder_pb2_grpc.EmbedderServiceStub],
        shards: Sequence[Downstream[index_pb2_grpc.IndexServiceStub]],
        sparse: Downstream[sparse_pb2_grpc.SparseServiceStub],
    ) -> None:
        self.embedder = embedder
        self.shards = list(shards)
        self.sparse = sparse

    async def close(self) -> None:
        downstreams: list[Downstream[Any]] = [self.embedder, *self.shards, self.sparse]
        for downstream in downstreams:
            await downstream.close()


class IngestPipeline:
    def __init__(
        self,
        settings: IngestionSettings,
        objects: ObjectStore,
        state: StateStore,
        stores: Stores,
        chunker: Chunker,
    ) -> None:
        self.settings = settings
        self.objects = objects
        self.state = state
        self.stores = stores
        self.chunker = chunker
        self.sandbox = DocumentSandbox(settings, chunker)
        self._embed_slots = asyncio.Semaphore(max(1, settings.ingest_embed_concurrency))
        self._cleanups: set[asyncio.Task[None]] = set()

    async def process(self, jobs: list[Job]) -> None:
        """Run every job to an outcome: on return each job either succeeded (``failure`` is
        None and its state is committed) or carries the failure to report."""
        started = time.perf_counter()
        await asyncio.gather(*(self._prepare(job) for job in jobs))
        STAGE_SECONDS.labels("prepare").observe(time.perf_counter() - started)
        live = [job for job in jobs if job.failure is None]
        await self._embed(live)
        live = [job for job in live if job.failure is None]
        await self._write(live)
        live = [job for job in live if job.failure is None]
        await asyncio.gather(*(self._commit(job) for job in live))
        for job in jobs:
            DOCS_DONE.labels(job.event.op, "ok" if job.failure is None else "failed").inc()

    # --- prepare: bytes -> chunks -> diff ---------------------------------------------------

    async def _prepare(self, job: Job) -> None:
        try:
            job.record = await self.state.get_record(job.key)
            if job.event.op == "upsert":
                await self._chunk(job)
        except JobFailure as failure:
            job.failure = failure
        except Exception as exc:  # object store or KV hiccup: worth another delivery
            job.failure = JobFailure(f"prepare failed: {exc!r}", permanent=False)

    async def _chunk(self, job: Job) -> None:
        event = job.event
        try:
            content = await self.objects.get(self.settings.documents_bucket, event.object_key)
        except ObjectNotFound as exc:
            raise JobFailure(f"document object {event.object_key} is missing", permanent=True) from exc
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
            raise JobFailure(exc.reason, permanent=exc.permanent) from exc
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
        job.chunks = self._identify(event, drafts)

    def _identify(self, event: IngestEvent, drafts: list[ChunkDraft]) -> list[PreparedChunk]:
        shard_count = len(self.stores.shards)
        seen: set[str] = set()
        chunks = []
        for draft in drafts:
            chunk_id = chunk_id_for(event.collection, event.doc_id, draft.text)
            if chunk_id in seen:  # a repeated passage is indexed once
                continue
            seen.add(chunk_id)
            chunks.append(PreparedChunk(chunk_id, shard_of(chunk_id, shard_count), draft))
        return chunks

    # --- embed: only what the record manager has not seen -----------------------------------

    async def _embed(self, jobs: list[Job]) -> None:
        pending = [(job, chunk) for job in jobs for chunk in job.new_chunks()]
        CHUNKS_REUSED.inc(sum(len(job.chunks) - len(job.new_chunks()) for job in jobs))
        if not pending:
            return
        started = time.perf_counter()
        size = self.settings.ingest_embed_batch
        batches = [pending[i : i + size] for i in range(0, len(pending), size)]
        results = await asyncio.gather(*(self._embed_batch(b) for b in batches), return_exceptions=True)
        for batch, result in zip(batches, results, strict=True):
            if isinstance(result, BaseException):
                reason = f"embedder: {result}" if isinstance(result, DownstreamError) else repr(result)
                for job, _chunk in batch:
                    job.failure = job.failure or JobFailure(reason, permanent=False)
        STAGE_SECONDS.labels("embed").observe(time.perf_counter() - started)

    async def _embed_batch(self, batch: list[tuple[Job, PreparedChunk]]) -> None:
        request = embedder_pb2.EmbedRequest(
            texts=[chunk.draft.text for _job, chunk in batch], kind=embedder_pb2.TEXT_KIND_PASSAGE
        )
        async with self._embed_slots:
            reply = await self.stores.embedder.call(
                self.stores.embedder.stub.Embed, request, idempotent=True, timeout=120.0
            )
        if len(reply.vectors) != len(batch):
            raise JobFailure("embedder returned a wrong number of vectors", permanent=False)
        for (_job, chunk), vector in zip(batch, reply.vectors, strict=True):
            chunk.vector = list(vector.values)
        CHUNKS_EMBEDDED.inc(len(batch))

    # --- write: one atomic replacement per document, per store ------------------------------

    async def _write(self, jobs: list[Job]) -> None:
        started = time.perf_counter()
        by_collection: dict[str, list[Job]] = defaultdict(list)
        for job in jobs:
            by_collection[job.event.collection].append(job)
        await asyncio.gather(*(self._write_collection(c, js) for c, js in by_collection.items()))
        STAGE_SECONDS.labels("write").observe(time.perf_counter() - started)

    async def _write_collection(self, collection: str, jobs: list[Job]) -> None:
        calls = [self._replace_in_shard(collection, jobs, shard) for shard in range(len(self.stores.shards))]
        calls.append(self._replace_in_sparse(collection, jobs))
        results = await asyncio.gather(*calls, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            reason = "; ".join(str(e) for e in errors)[:1000]
            for job in jobs:
                job.failure = JobFailure(f"index write failed: {reason}", permanent=False)

    async def _replace_in_shard(self, collection: str, jobs: list[Job], shard: int) -> None:
        downstream = self.stores.shards[shard]
        documents = [self._shard_replacement(job, shard, resend=set()) for job in jobs]
        request = index_pb2.ReplaceDocumentsRequest(collection=collection, documents=documents)
        reply = await downstream.call(
            downstream.stub.ReplaceDocuments, request, idempotent=True, timeout=120.0
        )
        if reply.missing_chunk_ids:
            # The shard lost chunks we believed indexed (e.g. restored from an older snapshot):
            # send them again with vectors.
            missing = set(reply.missing_chunk_ids)
            await self._embed_missing(jobs, missing)
            documents = [self._shard_replacement(job, shard, resend=missing) for job in jobs]
            request = index_pb2.ReplaceDocumentsRequest(collection=collection, documents=documents)
            await downstream.call(downstream.stub.ReplaceDocuments, request, idempotent=True, timeout=120.0)

    def _shard_replacement(self, job: Job, shard: int, resend: set[str]) -> index_pb2.DocumentReplacement:
        previous = job.previous_chunk_ids
        upserts, keep = [], []
        for chunk in job.chunks:
            if chunk.shard != shard:
                continue
            if chunk.chunk_id in previous and chunk.chunk_id not in resend:
                keep.append(chunk.chunk_id)
            else:
                upserts.append(
                    index_pb2.Chunk(
                        chunk_id=chunk.chunk_id,
                        doc_id=job.event.doc_id,
                        vector=common_pb2.Vector(values=chunk.vector or []),
                    )
                )
        return index_pb2.DocumentReplacement(doc_id=job.event.doc_id, upserts=upserts, keep_chunk_ids=keep)

    async def _embed_missing(self, jobs: list[Job], missing: set[str]) -> None:
        pending = [(job, c) for job in jobs for c in job.chunks if c.chunk_id in missing and c.vector is None]
        size = self.settings.ingest_embed_batch
        for i in range(0, len(pending), size):
            await self._embed_batch(pending[i : i + size])

    async def _replace_in_sparse(self, collection: str, jobs: list[Job]) -> None:
        sparse = self.stores.sparse
        documents = [self._sparse_replacement(job, resend=set()) for job in jobs]
        request = sparse_pb2.ReplaceDocumentsRequest(collection=collection, documents=documents)
        reply = await sparse.call(sparse.stub.ReplaceDocuments, request, idempotent=True, timeout=120.0)
        if reply.missing_chunk_ids:
            missing = set(reply.missing_chunk_ids)
            documents = [self._sparse_replacement(job, resend=missing) for job in jobs]
            request = sparse_pb2.ReplaceDocumentsRequest(collection=collection, documents=documents)
            await sparse.call(sparse.stub.ReplaceDocuments, request, idempotent=True, timeout=120.0)

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
                    location=common_pb2.ChunkLocation(
                        heading_path=draft.heading_path,
                        ordinal=draft.ordinal,
                        char_start=draft.char_start,
                        char_end=draft.char_end,
                    ),
                )
            )
        return sparse_pb2.DocumentReplacement(doc_id=job.event.doc_id, upserts=upserts, keep_chunk_ids=keep)

    # --- commit: the record manager learns what is now indexed ------------------------------

    async def _commit(self, job: Job) -> None:
        try:
            await self._commit_record(job)
        except Exception as exc:
            job.failure = JobFailure(f"commit failed: {exc!r}", permanent=False)
            return
        # Old raw bytes are only storage: their removal must never hold up acknowledging the event.
        task = asyncio.create_task(self._cleanup(job))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    async def _cleanup(self, job: Job) -> None:
        try:
            await asyncio.wait_for(self._drop_superseded_objects(job), CLEANUP_TIMEOUT_S)
        except Exception as exc:
            # The next version's commit removes what is left.
            log.warning("could not remove old document objects", extra={"key": job.key, "error": repr(exc)})

    async def close(self) -> None:
        for task in list(self._cleanups):
            task.cancel()
        await asyncio.gather(*self._cleanups, return_exceptions=True)
        await self.sandbox.close()

    async def _commit_record(self, job: Job) -> None:
        record = job.record or Versioned(None, 0)
        if job.event.op == "delete":
            if record.value is not None:
                await self.state.delete_record(job.key)
            return
        new_record = DocRecord(
            collection=job.event.collection,
            doc_id=job.event.doc_id,
            content_sha256=job.event.content_sha256,
            object_key=job.event.object_key,
            title=job.title,
            chunk_ids=[c.chunk_id for c in job.chunks],
        )
        revision = record.revision
        for _ in range(3):
            try:
                await self.state.put_record(job.key, new_record, revision)
                return
            except Conflict:
                # Only the claim holder writes a record; a conflict is an earlier attempt of
                # ours that landed late. The claim makes this write the one that counts.
                revision = (await self.state.get_record(job.key)).revision
        raise JobFailure("record kept changing under the claim", permanent=False)

    async def _drop_superseded_objects(self, job: Job) -> None:
        """Raw bytes of versions other than the indexed one are no longer needed."""
        prefix = job.event.object_key.rsplit("/", 1)[0] + "/" if job.event.object_key else ""
        if job.event.op == "delete":
            previous = job.record.value if job.record else None
            prefix = previous.object_key.rsplit("/", 1)[0] + "/" if previous else ""
        if not prefix:
            return
        keep = job.event.object_key if job.event.op == "upsert" else None
        for key in await self.objects.list_keys(self.settings.documents_bucket, prefix):
            if key != keep and not await self._is_requested(job, key):
                await self.objects.delete(self.settings.documents_bucket, key)

    async def _is_requested(self, job: Job, key: str) -> bool:
        """A newer version may have been submitted meanwhile: its bytes must stay."""
        current = await self.state.get_status(job.key)
        status = current.value
        return bool(status and key.endswith("/" + status.target_sha256))
