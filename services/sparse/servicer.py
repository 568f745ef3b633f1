"""gRPC face of the sparse service: validates every request, then runs the blocking tantivy and
file work in threads (ripgrep in a subprocess) so the event loop keeps serving."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from grpc import aio

from meshkit.core.errors import deadline_exceeded, failed_precondition, invalid_argument, resource_exhausted
from meshkit.domain.ids import (
    document_page,
    document_shard,
    validate_chunk_id,
    validate_collection,
    validate_doc_id,
)
from meshkit.domain.metadata import InvalidFilter, clauses_from_pb, source_problem
from meshkit.replication.log import write_timeout
from meshkit.rpc.identity import GATEWAY, INGESTION_WORKER, OPS, Callers, allow
from meshkit.rpc.interceptors import clamp_deadline, deadline_var
from meshkit.rpc.server import ServiceSpec
from meshkit.settings import SparseSettings
from ragmesh.common.v1 import common_pb2
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from services.sparse import metrics
from services.sparse.collection import Collection
from services.sparse.deadlines import DeadlinePassed
from services.sparse.exact import (
    Keyword,
    RipgrepTimeout,
    find_ripgrep,
    normalise_keywords,
    phrase_counts,
    rank,
    ripgrep_counts,
)
from services.sparse.records import ChunkRecord, DocumentSourceInfo, DocumentUpdate, Hit
from services.sparse.store import SparseRemote, SparseStore, source_info

MAX_KEYWORD_CHARS = 200
# Unknown query words reported per search: enough to name what a question is about.
MAX_UNKNOWN_TERMS = 16
DEFAULT_EXACT_MAX_CANDIDATES = SparseSettings.model_fields["sparse_exact_max_candidates"].default
DEFAULT_EXACT_TIEBREAK_CHUNKS = SparseSettings.model_fields["sparse_exact_tiebreak_chunks"].default


class SparseServicer(sparse_pb2_grpc.SparseServiceServicer):
    def __init__(self, settings: SparseSettings, store: SparseStore) -> None:
        self.settings = settings
        self.store = store
        self.rg = find_ripgrep()
        if settings.sparse_exact_mode == "ripgrep" and self.rg is None:
            raise RuntimeError("sparse_exact_mode is 'ripgrep' but no rg binary was found")

    def _timeout(self, context: aio.ServicerContext) -> float:
        return write_timeout(clamp_deadline(context.time_remaining()), self.settings.store_write_timeout_s)

    # --- writes: validated here, then through the replicated log (SparseStore) ---

    async def ReplaceDocuments(
        self, request: sparse_pb2.ReplaceDocumentsRequest, context: aio.ServicerContext
    ) -> sparse_pb2.ReplaceDocumentsResponse:
        validate_collection(request.collection)
        self._document_updates(request.documents)
        result = await self.store.replace_documents(request, self._timeout(context))
        return sparse_pb2.ReplaceDocumentsResponse(
            upserted=result.upserted,
            removed=result.removed,
            missing_chunk_ids=result.missing_chunk_ids,
            stale_doc_ids=result.stale_doc_ids,
        )

    async def Delete(
        self, request: sparse_pb2.DeleteRequest, context: aio.ServicerContext
    ) -> sparse_pb2.DeleteResponse:
        name = validate_collection(request.collection)
        if not request.chunk_ids and not request.doc_ids:
            raise invalid_argument("give chunk_ids and/or doc_ids to delete")
        self._check_count("chunk_ids + doc_ids", len(request.chunk_ids) + len(request.doc_ids))
        chunk_ids = [validate_chunk_id(c) for c in request.chunk_ids]
        doc_ids = [self._owned(validate_doc_id(d), "doc_ids") for d in request.doc_ids]
        delete = sparse_pb2.DeleteRequest(collection=name, chunk_ids=chunk_ids, doc_ids=doc_ids)
        removed = await self.store.delete(delete, self._timeout(context))
        return sparse_pb2.DeleteResponse(removed=removed)

    # --- reads ---

    async def SearchBm25(
        self, request: sparse_pb2.SearchBm25Request, context: aio.ServicerContext
    ) -> sparse_pb2.SearchBm25Response:
        name = validate_collection(request.collection)
        top_k = self._top_k(request.top_k)
        query = request.query
        if len(query) > self.settings.sparse_max_query_chars:
            raise resource_exhausted(
                f"query is {len(query)} chars, the limit is {self.settings.sparse_max_query_chars}"
            )
        if not query.strip():
            raise invalid_argument("query is empty")
        doc_ids = self._doc_filter(request.doc_ids)
        collection = await self._existing(name)
        started = time.perf_counter()
        allowed = await self._filtered(collection, request.filter, doc_ids)
        if allowed is None:
            return sparse_pb2.SearchBm25Response()
        leg = await asyncio.to_thread(
            _bm25_leg,
            collection,
            query,
            top_k,
            allowed,
            request.with_text,
            self.settings.sparse_max_query_terms,
        )
        self._observe("bm25", started, leg.hits)
        return sparse_pb2.SearchBm25Response(
            hits=[_hit_pb(h) for h in leg.hits],
            unknown_terms=leg.unknown,
            novel_terms=leg.novel,
            chunks=[_chunk_pb(r, collection.state.source(r.doc_id)) for r in leg.records],
        )

    async def SearchExact(
        self, request: sparse_pb2.SearchExactRequest, context: aio.ServicerContext
    ) -> sparse_pb2.SearchExactResponse:
        name = validate_collection(request.collection)
        top_k = self._top_k(request.top_k)
        keywords = self._keywords(request.keywords)
        doc_ids = self._doc_filter(request.doc_ids)
        collection = await self._existing(name)
        started = time.perf_counter()
        allowed = await self._filtered(collection, request.filter, doc_ids)
        if allowed is None:
            return sparse_pb2.SearchExactResponse()
        doc_ids = allowed
        # The work is bounded (sparse_exact_max_candidates) and stops at the caller's deadline:
        # a thread cannot be cancelled, so it checks the deadline as it goes.
        deadline = deadline_var.get()
        if self.settings.sparse_exact_mode == "ripgrep":
            hits = await self._exact_ripgrep(collection, keywords, top_k, doc_ids, deadline)
            kind = "exact_ripgrep"
        else:
            try:
                hits = await asyncio.to_thread(
                    exact_phrase,
                    collection,
                    keywords,
                    top_k,
                    doc_ids,
                    max_candidates=self.settings.sparse_exact_max_candidates,
                    max_tied=self.settings.sparse_exact_tiebreak_chunks,
                    deadline=deadline,
                )
            except DeadlinePassed as exc:
                raise deadline_exceeded(str(exc)) from None
            kind = "exact_phrase"
        self._observe(kind, started, hits)
        return sparse_pb2.SearchExactResponse(hits=[_hit_pb(h) for h in hits])

    async def GetChunks(
        self, request: sparse_pb2.GetChunksRequest, context: aio.ServicerContext
    ) -> sparse_pb2.GetChunksResponse:
        name = validate_collection(request.collection)
        if not request.chunk_ids:
            raise invalid_argument("chunk_ids is empty")
        self._check_count("chunk_ids", len(request.chunk_ids))
        chunk_ids = [validate_chunk_id(c) for c in request.chunk_ids]
        collection = await self._existing(name)
        # Ids that are gone (deleted since a search returned them) are left out, not an error.
        records = await asyncio.to_thread(collection.get_chunks, chunk_ids)
        return sparse_pb2.GetChunksResponse(
            chunks=[_chunk_pb(r, collection.state.source(r.doc_id)) for r in records]
        )

    @staticmethod
    async def _filtered(
        collection: Collection, filter_pb: common_pb2.MetadataFilter, doc_ids: list[str]
    ) -> list[str] | None:
        """The doc_ids a search may return: ``doc_ids`` (empty: all) without a metadata filter,
        else the documents that match it; None when nothing can match."""
        try:
            clauses = clauses_from_pb(filter_pb)
        except InvalidFilter as exc:
            raise invalid_argument(str(exc)) from exc
        if not clauses:
            return doc_ids
        allowed = await asyncio.to_thread(collection.state.matching, clauses, doc_ids)
        return allowed or None

    async def GetStats(
        self, request: sparse_pb2.GetStatsRequest, context: aio.ServicerContext
    ) -> sparse_pb2.GetStatsResponse:
        name = validate_collection(request.collection)
        collection = await self._existing(name)
        chunks, documents = await asyncio.to_thread(collection.stats)
        return sparse_pb2.GetStatsResponse(
            collection=name, chunks=chunks, documents=documents, log_position=self.store.log_position(name)
        )

    async def ListDocuments(
        self, request: sparse_pb2.ListDocumentsRequest, context: aio.ServicerContext
    ) -> sparse_pb2.ListDocumentsResponse:
        name = validate_collection(request.collection)
        size, after = document_page(request.page_size, request.page_token)
        collection = await self._existing(name)
        entries = await asyncio.to_thread(collection.list_documents, after, size)
        return sparse_pb2.ListDocumentsResponse(
            documents=[
                sparse_pb2.DocumentEntry(doc_id=e.doc_id, fence=e.fence, chunk_ids=e.chunk_ids)
                for e in entries
            ],
            next_page_token=entries[-1].doc_id if len(entries) == size else "",
        )

    # --- helpers ---

    async def _exact_ripgrep(
        self,
        collection: Collection,
        keywords: list[Keyword],
        top_k: int,
        doc_ids: list[str],
        deadline: float | None,
    ) -> list[Hit]:
        assert self.rg is not None  # checked in __init__
        timeout = self.settings.sparse_exact_timeout_s
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
        try:
            counts = await ripgrep_counts(
                self.rg,
                collection.files.root,
                keywords,
                timeout,
                max(top_k, self.settings.sparse_exact_max_candidates),
            )
        except RipgrepTimeout as exc:
            metrics.RIPGREP_TIMEOUTS.inc()
            raise deadline_exceeded(str(exc)) from None
        except DeadlinePassed as exc:
            raise deadline_exceeded(str(exc)) from None
        # Files can outlive their chunks after a crash: only committed chunks count.
        doc_of = await asyncio.to_thread(collection.live_documents, counts.keys(), doc_ids)
        return rank(counts, doc_of, keywords, top_k)

    async def _existing(self, name: str) -> Collection:
        return self.store.get(name)  # NOT_FOUND, or UNAVAILABLE when quarantined here

    def _top_k(self, top_k: int) -> int:
        if top_k == 0:
            raise invalid_argument("top_k must be at least 1")
        if top_k > self.settings.sparse_max_top_k:
            raise resource_exhausted(f"top_k is {top_k}, the limit is {self.settings.sparse_max_top_k}")
        return top_k

    def _check_count(self, what: str, count: int) -> None:
        if count > self.settings.sparse_max_batch_chunks:
            raise resource_exhausted(
                f"{what}: {count} given, the limit is {self.settings.sparse_max_batch_chunks}"
            )

    def _doc_filter(self, doc_ids: Sequence[str]) -> list[str]:
        if len(doc_ids) > self.settings.sparse_max_doc_filter:
            raise resource_exhausted(
                f"doc_ids filter has {len(doc_ids)} ids, the limit is {self.settings.sparse_max_doc_filter}"
            )
        return list(dict.fromkeys(validate_doc_id(d) for d in doc_ids))

    def _keywords(self, raw: Sequence[str]) -> list[Keyword]:
        if not raw:
            raise invalid_argument("keywords is empty")
        if len(raw) > self.settings.sparse_max_keywords:
            raise resource_exhausted(
                f"{len(raw)} keywords given, the limit is {self.settings.sparse_max_keywords}"
            )
        for i, keyword in enumerate(raw):
            if not keyword.strip():
                raise invalid_argument(f"keywords[{i}] is blank")
            if len(keyword) > MAX_KEYWORD_CHARS:
                raise resource_exhausted(
                    f"keywords[{i}] is {len(keyword)} chars, the limit is {MAX_KEYWORD_CHARS}"
                )
        return normalise_keywords(raw)

    def _document_updates(self, documents: Sequence[sparse_pb2.DocumentReplacement]) -> list[DocumentUpdate]:
        if not documents:
            raise invalid_argument("documents is empty")
        total = sum(len(d.upserts) + len(d.keep_chunk_ids) for d in documents)
        self._check_count("upserts + keep_chunk_ids", total)
        seen_docs: set[str] = set()
        seen_chunks: set[str] = set()
        updates = []
        for document in documents:
            doc_id = self._owned(validate_doc_id(document.doc_id), "documents")
            if doc_id in seen_docs:
                raise invalid_argument(f"doc_id {doc_id!r} is listed twice")
            seen_docs.add(doc_id)
            upserts = [self._chunk_record(doc_id, c) for c in document.upserts]
            keeps = [validate_chunk_id(c) for c in document.keep_chunk_ids]
            for chunk_id in [c.chunk_id for c in upserts]:
                if chunk_id in seen_chunks:
                    raise invalid_argument(f"chunk_id {chunk_id} is upserted twice")
                seen_chunks.add(chunk_id)
            updates.append(DocumentUpdate(doc_id, upserts, keeps, document.fence, _source(document)))
        return updates

    def _owned(self, doc_id: str, where: str) -> str:
        """A document this shard owns: a writer that places it elsewhere has another layout."""
        count = self.store.shard_count
        owner = document_shard(doc_id, count)
        if owner != self.store.shard:
            raise failed_precondition(
                f"{where}: document {doc_id!r} belongs to sparse shard {owner} of {count}, "
                f"this is shard {self.store.shard}"
            )
        return doc_id

    def _chunk_record(self, doc_id: str, chunk: sparse_pb2.ChunkText) -> ChunkRecord:
        chunk_id = validate_chunk_id(chunk.chunk_id)
        if chunk.doc_id and chunk.doc_id != doc_id:
            raise invalid_argument(f"chunk {chunk_id} has doc_id {chunk.doc_id[:80]!r}, expected {doc_id!r}")
        if not chunk.text.strip() and not chunk.title.strip():
            raise invalid_argument(f"chunk {chunk_id} has no text")
        size = len(chunk.title) + len(chunk.text)
        if size > self.settings.sparse_max_chunk_chars:
            raise resource_exhausted(
                f"chunk {chunk_id} is {size} chars, the limit is {self.settings.sparse_max_chunk_chars}"
            )
        location = chunk.location.SerializeToString() if chunk.HasField("location") else b""
        return ChunkRecord(chunk_id, doc_id, chunk.title, chunk.text, location)

    @staticmethod
    def _observe(kind: str, started: float, hits: Sequence[Hit]) -> None:
        metrics.SEARCH_SECONDS.labels(kind).observe(time.perf_counter() - started)
        metrics.SEARCH_HITS.labels(kind).observe(len(hits))


def exact_phrase(
    collection: Collection,
    keywords: list[Keyword],
    top_k: int,
    doc_ids: Iterable[str],
    *,
    max_candidates: int = DEFAULT_EXACT_MAX_CANDIDATES,
    max_tied: int | None = DEFAULT_EXACT_TIEBREAK_CHUNKS,
    deadline: float | None = None,
) -> list[Hit]:
    """The phrase-mode exact leg: at most ``max(top_k, max_candidates)`` chunks read and counted,
    of those tied at the cut at most ``max_tied`` (or as many as fill ``top_k``; None: no
    bound but ``max_candidates``); DeadlinePassed once ``deadline`` (time.monotonic) has passed."""
    candidates = collection.phrase_candidates(
        [k.needle for k in keywords],
        top_k,
        list(doc_ids),
        max_candidates=max_candidates,
        max_tied=max_tied,
        deadline=deadline,
    )
    counts = phrase_counts(candidates, keywords, deadline)
    return rank(counts, {r.chunk_id: r.doc_id for r in candidates}, keywords, top_k)


@dataclass(frozen=True)
class Bm25Leg:
    hits: list[Hit]
    # The query's words the collection lacks, and those of them no indexed word is one edit from.
    unknown: list[str]
    novel: list[str]
    # The text of the first with_text hits.
    records: list[ChunkRecord]


def _bm25_leg(
    collection: Collection, query: str, top_k: int, allowed: Sequence[str], with_text: int, max_terms: int
) -> Bm25Leg:
    """One thread hop for the whole leg."""
    hits = collection.search_bm25(query, top_k, allowed, max_terms)
    records = collection.get_chunks([h.chunk_id for h in hits[:with_text]]) if with_text else []
    unknown = collection.unknown_words(query, MAX_UNKNOWN_TERMS)
    return Bm25Leg(hits, unknown, collection.novel_words(unknown), records)


def _hit_pb(hit: Hit) -> sparse_pb2.SearchHit:
    return sparse_pb2.SearchHit(
        chunk_id=hit.chunk_id, doc_id=hit.doc_id, score=hit.score, matched_keywords=hit.matched_keywords
    )


def _source(document: sparse_pb2.DocumentReplacement) -> DocumentSourceInfo | None:
    if not document.HasField("source"):
        return None
    problem = source_problem(document.source)
    if problem:
        raise invalid_argument(f"document {document.doc_id!r}: source: {problem}")
    return source_info(document)


def _chunk_pb(record: ChunkRecord, source: DocumentSourceInfo) -> sparse_pb2.ChunkText:
    chunk = sparse_pb2.ChunkText(
        chunk_id=record.chunk_id,
        doc_id=record.doc_id,
        title=record.title,
        text=record.text,
        source_uri=source.source_uri,
        metadata=dict(source.metadata),
    )
    if record.location:
        chunk.location.CopyFrom(common_pb2.ChunkLocation.FromString(record.location))
    return chunk


# Who may call sparse (RAGMESH_SERVICE_AUTH=mtls): the gateway reads, the workers write.
_READERS = allow(GATEWAY, OPS)
_WRITERS = allow(INGESTION_WORKER, OPS)
CALLERS: Callers = {
    "SearchBm25": _READERS,
    "SearchExact": _READERS,
    "GetChunks": _READERS,
    "GetStats": _READERS,
    "ReplaceDocuments": _WRITERS,
    "Delete": _WRITERS,
    "ListDocuments": allow(OPS),
}


def build_spec(settings: SparseSettings, store: SparseStore | None = None) -> ServiceSpec:
    """The service description ``run_service``/``start_service`` need (tests pass a store)."""
    if store is None:
        remote = SparseRemote.from_settings(settings) if settings.sparse_upload_snapshots else None
        store = SparseStore(settings, remote)
    servicer = SparseServicer(settings, store)
    return ServiceSpec(
        name="sparse",
        grpc_services=[sparse_pb2.DESCRIPTOR.services_by_name["SparseService"].full_name],
        register=lambda server: sparse_pb2_grpc.add_SparseServiceServicer_to_server(servicer, server),
        on_start=[store.start],
        on_stop=[store.stop],
        callers=CALLERS,
        # A write may carry sparse_max_batch_chunks chunks of up to sparse_max_chunk_chars each, more
        # than any message may hold: the mesh-wide message limit is its bound.
        max_request_bytes=settings.max_message_bytes,
        max_concurrent_rpcs=1024,
    )
