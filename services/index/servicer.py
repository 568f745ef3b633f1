"""gRPC face of the index shard: validates every request, converts it to plain values, and
hands it to ``IndexShard``. Nothing is written unless the whole request is valid."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from grpc import aio

from meshkit.core.errors import failed_precondition, invalid_argument, resource_exhausted
from meshkit.domain.ids import (
    doc_id_problem,
    document_page,
    document_shard,
    validate_chunk_id,
    validate_collection,
)
from meshkit.domain.metadata import Clause, InvalidFilter, clauses_from_pb, source_problem
from meshkit.replication.log import write_timeout
from meshkit.rpc.identity import GATEWAY, INGESTION_WORKER, OPS, Callers, allow
from meshkit.rpc.interceptors import clamp_deadline
from meshkit.rpc.server import ServiceSpec
from meshkit.settings import IndexSettings
from ragmesh.common.v1 import common_pb2
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from services.index import mutations as mut
from services.index.records import StoredChunk
from services.index.remote import SnapshotRemote
from services.index.shard import IndexShard

SERVICE_NAME = index_pb2.DESCRIPTOR.services_by_name["IndexService"].full_name


class IndexServicer(index_pb2_grpc.IndexServiceServicer):
    def __init__(self, shard: IndexShard, settings: IndexSettings) -> None:
        self.shard = shard
        self.settings = settings
        self.dimension = settings.index_dimension

    # ----- validation helpers -----

    def _limit(self, count: int, what: str) -> None:
        limit = self.settings.index_max_batch_chunks
        if count > limit:
            raise resource_exhausted(f"{count} {what} in one request; the limit is {limit}")

    def _chunk_id(self, chunk_id: str, where: str) -> str:
        try:
            validate_chunk_id(chunk_id)
        except Exception as exc:
            raise invalid_argument(f"{where}: {exc}") from exc
        return chunk_id

    def _doc_id(self, doc_id: str, where: str) -> str:
        problem = doc_id_problem(doc_id)
        if problem:
            raise invalid_argument(f"{where}: {problem}")
        return doc_id

    def _owned_doc_id(self, doc_id: str, where: str) -> str:
        """A document this shard owns (meshkit.domain.ids.document_shard): a writer that places
        it elsewhere has another layout, and its write would split the document."""
        self._doc_id(doc_id, where)
        owner = document_shard(doc_id, self.shard.shard_count)
        if owner != self.shard.shard:
            raise failed_precondition(
                f"{where}: document {doc_id!r} belongs to shard {owner} of {self.shard.shard_count}, "
                f"this is shard {self.shard.shard}"
            )
        return doc_id

    def _vector(self, values: Sequence[float], where: str) -> np.ndarray:
        if len(values) != self.dimension:
            raise invalid_argument(
                f"{where}: vector has {len(values)} values, the index dimension is {self.dimension}"
            )
        vector = np.asarray(values, dtype=np.float32)
        if not np.isfinite(vector).all():
            raise invalid_argument(f"{where}: vector has NaN or infinite values")
        return vector

    def _chunks(
        self, chunks: Sequence[index_pb2.Chunk], where: str, doc_id: str | None = None
    ) -> mut.ChunkBatch:
        chunk_ids: list[str] = []
        doc_ids: list[str] = []
        vectors = np.empty((len(chunks), self.dimension), dtype=np.float32)
        for i, chunk in enumerate(chunks):
            at = f"{where}[{i}]"
            chunk_ids.append(self._chunk_id(chunk.chunk_id, f"{at}.chunk_id"))
            if doc_id is not None:
                if chunk.doc_id and chunk.doc_id != doc_id:
                    raise invalid_argument(
                        f"{at}.doc_id {chunk.doc_id!r} differs from its document {doc_id!r}"
                    )
                doc_ids.append(doc_id)
            else:
                doc_ids.append(self._owned_doc_id(chunk.doc_id, f"{at}.doc_id"))
            vectors[i] = self._vector(chunk.vector.values, f"{at}.vector")
        found = [self._payload(chunk, f"{where}[{i}]") for i, chunk in enumerate(chunks)]
        # A batch sent without any payload stores none (older writers).
        payloads = [p or mut.Payload() for p in found] if any(found) else []
        return mut.ChunkBatch(chunk_ids, doc_ids, vectors, payloads)

    def _payload(self, chunk: index_pb2.Chunk, where: str) -> mut.Payload | None:
        if not chunk.text and not chunk.HasField("location"):
            return None
        size = len(chunk.text) + sum(len(h) for h in chunk.location.heading_path)
        if size > self.settings.index_max_chunk_chars:
            limit = self.settings.index_max_chunk_chars
            raise invalid_argument(f"{where}: text and headings are {size} chars, the limit is {limit}")
        location = chunk.location
        return mut.Payload(
            chunk.text,
            tuple(location.heading_path),
            location.ordinal,
            location.char_start,
            location.char_end,
        )

    @staticmethod
    def _source(doc: index_pb2.DocumentReplacement, where: str) -> mut.Source | None:
        if not doc.HasField("source"):
            return None
        problem = source_problem(doc.source)
        if problem:
            raise invalid_argument(f"{where}.source: {problem}")
        source = doc.source
        return mut.Source(source.title, source.source_uri, tuple(sorted(source.metadata.items())))

    @staticmethod
    def _unique(ids: Iterable[str], what: str) -> None:
        seen: set[str] = set()
        for value in ids:
            if value in seen:
                raise invalid_argument(f"{what} {value!r} appears more than once in the request")
            seen.add(value)

    def _timeout(self, context: aio.ServicerContext) -> float:
        return write_timeout(clamp_deadline(context.time_remaining()), self.settings.store_write_timeout_s)

    # ----- RPCs -----

    async def Upsert(
        self, request: index_pb2.UpsertRequest, context: aio.ServicerContext
    ) -> index_pb2.UpsertResponse:
        collection = validate_collection(request.collection)
        if not request.chunks:
            raise invalid_argument("chunks is empty")
        self._limit(len(request.chunks), "chunks")
        batch = self._chunks(request.chunks, "chunks")
        self._unique(batch.chunk_ids, "chunk_id")
        upserted = await self.shard.upsert(collection, batch, self._timeout(context))
        return index_pb2.UpsertResponse(upserted=upserted)

    async def ReplaceDocuments(
        self, request: index_pb2.ReplaceDocumentsRequest, context: aio.ServicerContext
    ) -> index_pb2.ReplaceDocumentsResponse:
        collection = validate_collection(request.collection)
        if not request.documents:
            raise invalid_argument("documents is empty")
        self._limit(sum(len(d.upserts) + len(d.keep_chunk_ids) for d in request.documents), "chunks")
        # The payloads a chunk may carry put no useful bound on a request's bytes: the
        # mesh-wide message limit is its bound (as for the sparse service).
        documents = []
        for i, doc in enumerate(request.documents):
            where = f"documents[{i}]"
            doc_id = self._owned_doc_id(doc.doc_id, f"{where}.doc_id")
            upserts = self._chunks(doc.upserts, f"{where}.upserts", doc_id=doc_id)
            keep = [
                self._chunk_id(c, f"{where}.keep_chunk_ids[{j}]") for j, c in enumerate(doc.keep_chunk_ids)
            ]
            source = self._source(doc, where)
            documents.append(mut.Replacement(doc_id, upserts, keep, doc.fence, source))
        self._unique((d.doc_id for d in documents), "doc_id")
        self._unique((c for d in documents for c in [*d.upserts.chunk_ids, *d.keep_chunk_ids]), "chunk_id")
        result = await self.shard.replace_documents(collection, documents, self._timeout(context))
        return index_pb2.ReplaceDocumentsResponse(
            upserted=result.upserted,
            removed=result.removed,
            missing_chunk_ids=result.missing_chunk_ids,
            stale_doc_ids=result.stale_doc_ids,
        )

    async def Delete(
        self, request: index_pb2.DeleteRequest, context: aio.ServicerContext
    ) -> index_pb2.DeleteResponse:
        collection = validate_collection(request.collection)
        if not request.chunk_ids and not request.doc_ids:
            raise invalid_argument("name at least one chunk_id or doc_id to delete")
        self._limit(len(request.chunk_ids) + len(request.doc_ids), "ids")
        chunk_ids = [self._chunk_id(c, f"chunk_ids[{i}]") for i, c in enumerate(request.chunk_ids)]
        doc_ids = [self._doc_id(d, f"doc_ids[{i}]") for i, d in enumerate(request.doc_ids)]
        removed = await self.shard.delete(collection, chunk_ids, doc_ids, self._timeout(context))
        return index_pb2.DeleteResponse(removed=removed)

    async def Search(
        self, request: index_pb2.SearchRequest, context: aio.ServicerContext
    ) -> index_pb2.SearchResponse:
        collection = validate_collection(request.collection)
        max_k = self.settings.index_max_top_k
        if not 1 <= request.top_k <= max_k:
            raise invalid_argument(f"top_k must be between 1 and {max_k}, got {request.top_k}")
        query = self._vector(request.vector.values, "vector")
        self._limit(len(request.doc_ids), "doc_ids")
        doc_ids = [self._doc_id(d, f"doc_ids[{i}]") for i, d in enumerate(request.doc_ids)]
        clauses = _clauses(request.filter)
        hits, stored = await self.shard.search(
            collection, query, request.top_k, doc_ids, clauses, request.with_payloads
        )
        return index_pb2.SearchResponse(
            hits=[index_pb2.SearchHit(chunk_id=h.chunk_id, doc_id=h.doc_id, score=h.score) for h in hits],
            shard=self.shard.shard,
            chunks=[_stored_pb(c) for c in stored if c.payload.text],
        )

    async def GetChunks(
        self, request: index_pb2.GetChunksRequest, context: aio.ServicerContext
    ) -> index_pb2.GetChunksResponse:
        collection = validate_collection(request.collection)
        self._limit(len(request.chunk_ids), "chunk_ids")
        ids = []
        for i, chunk_id in enumerate(request.chunk_ids):
            try:
                validate_chunk_id(chunk_id)
            except Exception as exc:
                raise invalid_argument(f"chunk_ids[{i}]: {exc}") from exc
            ids.append(chunk_id)
        stored = await self.shard.get_chunks(collection, list(dict.fromkeys(ids)))
        return index_pb2.GetChunksResponse(chunks=[_stored_pb(c) for c in stored])

    async def GetStats(
        self, request: index_pb2.GetStatsRequest, context: aio.ServicerContext
    ) -> index_pb2.GetStatsResponse:
        collection = validate_collection(request.collection)
        stats = await self.shard.stats(collection)
        return index_pb2.GetStatsResponse(
            collection=collection,
            chunks=stats.chunks,
            documents=stats.documents,
            index_type=stats.index_type,
            dimension=stats.dimension,
            shard=self.shard.shard,
            shard_count=self.shard.shard_count,
            pending_wal_records=stats.pending_wal_records,
            log_position=self.shard.log_position(collection),
        )

    async def ListDocuments(
        self, request: index_pb2.ListDocumentsRequest, context: aio.ServicerContext
    ) -> index_pb2.ListDocumentsResponse:
        collection = validate_collection(request.collection)
        size, after = document_page(request.page_size, request.page_token)
        entries = await self.shard.list_documents(collection, after, size)
        return index_pb2.ListDocumentsResponse(
            documents=[
                index_pb2.DocumentEntry(doc_id=e.doc_id, fence=e.fence, chunk_ids=e.chunk_ids)
                for e in entries
            ],
            next_page_token=entries[-1].doc_id if len(entries) == size else "",
        )

    async def Snapshot(
        self, request: index_pb2.SnapshotRequest, context: aio.ServicerContext
    ) -> index_pb2.SnapshotResponse:
        collection = validate_collection(request.collection)
        sequence, uploaded = await self.shard.snapshot(collection)
        return index_pb2.SnapshotResponse(sequence=sequence, uploaded=uploaded)


def _clauses(filter_pb: common_pb2.MetadataFilter) -> tuple[Clause, ...]:
    try:
        return clauses_from_pb(filter_pb)
    except InvalidFilter as exc:
        raise invalid_argument(str(exc)) from exc


def _stored_pb(chunk: StoredChunk) -> index_pb2.StoredChunk:
    payload, source = chunk.payload, chunk.source
    return index_pb2.StoredChunk(
        chunk_id=chunk.chunk_id,
        doc_id=chunk.doc_id,
        text=payload.text,
        location=common_pb2.ChunkLocation(
            heading_path=list(payload.heading_path),
            ordinal=payload.ordinal,
            char_start=payload.char_start,
            char_end=payload.char_end,
        ),
        source=common_pb2.DocumentSource(
            title=source.title, source_uri=source.source_uri, metadata=dict(source.metadata)
        ),
    )


# Who may call an index shard (RAGMESH_SERVICE_AUTH=mtls): the gateway reads, the workers write,
# operators also snapshot and list.
_READERS = allow(GATEWAY, OPS)
_WRITERS = allow(INGESTION_WORKER, OPS)
CALLERS: Callers = {
    "Search": _READERS,
    "GetChunks": _READERS,
    "GetStats": _READERS,
    "Upsert": _WRITERS,
    "ReplaceDocuments": _WRITERS,
    "Delete": _WRITERS,
    "Snapshot": allow(OPS),
    "ListDocuments": allow(OPS),
}


def build_spec(settings: IndexSettings, shard: IndexShard | None = None) -> ServiceSpec:
    """The service description ``run_service``/``start_service`` need (tests pass a shard)."""
    if shard is None:
        remote = SnapshotRemote.from_settings(settings) if settings.index_upload_snapshots else None
        shard = IndexShard(settings, remote)
    servicer = IndexServicer(shard, settings)

    def register(server: aio.Server) -> None:
        index_pb2_grpc.add_IndexServiceServicer_to_server(servicer, server)

    return ServiceSpec(
        name="index",
        grpc_services=[SERVICE_NAME],
        register=register,
        on_start=[shard.start],
        on_stop=[shard.stop],
        callers=CALLERS,
        # A write may carry index_max_batch_chunks chunks with text payloads of up to
        # index_max_chunk_chars each, more than any message may hold: the mesh-wide message limit
        # is its bound (as for the sparse service).
        max_request_bytes=settings.max_message_bytes,
        max_concurrent_rpcs=1024,
    )
