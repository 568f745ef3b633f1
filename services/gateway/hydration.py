"""Hydration: the text, title, location, source and metadata of a search's results. The legs
send their first hits' text; the rest comes from the sparse shards that hold their documents,
or, from one that fails or is late, from the index shards' stored payloads (a degradation with
fallback ``index_payload``), so answers do not depend on one sparse process."""

from __future__ import annotations

import asyncio
import time

from meshkit.domain.ids import document_shard
from meshkit.rpc.client import DownstreamError
from ragmesh.index.v1 import index_pb2
from ragmesh.sparse.v1 import sparse_pb2
from services.gateway.backends import Backends
from services.gateway.degradations import INDEX, INDEX_PAYLOAD, SPARSE, Degradations
from services.gateway.fusion import Fused

INDEX_TEXT = "passage text from the index"


class Hydrator:
    def __init__(self, backends: Backends, sparse_share: float) -> None:
        self.backends = backends
        # Share of the time left that sparse gets before the shards' payloads are asked instead.
        self.sparse_share = sparse_share

    async def hydrate(
        self,
        collection: str,
        top: list[Fused],
        degradations: Degradations,
        known: dict[str, sparse_pb2.ChunkText],
        end: float,
    ) -> tuple[list[Fused], dict[str, sparse_pb2.ChunkText]]:
        """Text, title, location, source and metadata of the results: those the legs sent with
        their hits (``known``), the rest from one GetChunks call to each sparse shard that holds
        some of them, or, for a shard that fails or is late, from the index shards' stored
        payloads. Without either the results all go out bare (a partly hydrated list would be
        reranked and shown inconsistently); chunks deleted since the legs saw them (or without a
        stored payload) are dropped."""
        sparse_shards = self.backends.sparse_shards
        owner = {f.chunk_id: document_shard(f.doc_id, len(sparse_shards)) for f in top}
        chunks = {f.chunk_id: known[f.chunk_id] for f in top if f.chunk_id in known}
        missing: dict[int, list[str]] = {}
        for f in top:
            if f.chunk_id not in chunks:
                missing.setdefault(owner[f.chunk_id], []).append(f.chunk_id)
        # Shards whose legs failed: the texts shown for their documents are index payloads.
        failed = {n for n, s in enumerate(sparse_shards) if (SPARSE, s.target) in degradations.items}
        timeout = self.sparse_share * (end - time.monotonic())
        shards = list(missing)
        replies = await asyncio.gather(
            *(self._sparse_chunks(collection, n, missing[n], timeout) for n in shards), return_exceptions=True
        )
        fallback: list[str] = []
        for number, reply in zip(shards, replies, strict=True):
            if isinstance(reply, DownstreamError):
                degradations.add_error(SPARSE, reply, what="passage text")
                fallback += missing[number]
            elif isinstance(reply, BaseException):
                raise reply
            else:
                chunks.update((c.chunk_id, c) for c in reply.chunks)
                failed.discard(number)
        if fallback:
            doc_of = {f.chunk_id: f.doc_id for f in top}
            wanted = {chunk_id: doc_of[chunk_id] for chunk_id in fallback}
            fetched = await self._index_payloads(collection, wanted, end, degradations)
            if fetched is None:
                return top, {}
            chunks.update(fetched)
            failed.update(owner[chunk_id] for chunk_id in fallback)
        for number in sorted(failed):
            if any(owner[chunk_id] == number for chunk_id in chunks):
                target = sparse_shards[number].target
                degradations.note_fallback(SPARSE, target, INDEX_PAYLOAD, INDEX_TEXT)
        return [f for f in top if f.chunk_id in chunks], chunks

    async def _sparse_chunks(
        self, collection: str, number: int, chunk_ids: list[str], timeout: float
    ) -> sparse_pb2.GetChunksResponse:
        sparse = self.backends.sparse_shards[number]
        request = sparse_pb2.GetChunksRequest(collection=collection, chunk_ids=chunk_ids)
        return await sparse.call(sparse.stub.GetChunks, request, timeout=timeout, idempotent=True)

    async def _index_payloads(
        self, collection: str, ids: dict[str, str], end: float, degradations: Degradations
    ) -> dict[str, sparse_pb2.ChunkText] | None:
        """The stored payloads of chunks ``ids`` (chunk id -> its doc id) from the index shards
        that own their documents (meshkit.domain.ids.document_shard, as the writers place them);
        None when a shard holding some of them did not answer."""
        shards = self.backends.shards
        owned: dict[int, list[str]] = {}
        for chunk_id, doc_id in ids.items():
            owned.setdefault(document_shard(doc_id, len(shards)), []).append(chunk_id)

        async def fetch(number: int, chunk_ids: list[str]) -> index_pb2.GetChunksResponse:
            shard = shards[number]
            request = index_pb2.GetChunksRequest(collection=collection, chunk_ids=chunk_ids)
            timeout = end - time.monotonic()
            return await shard.call(shard.stub.GetChunks, request, timeout=timeout, idempotent=True)

        replies = await asyncio.gather(*(fetch(n, c) for n, c in owned.items()), return_exceptions=True)
        chunks: dict[str, sparse_pb2.ChunkText] = {}
        for reply in replies:
            if isinstance(reply, DownstreamError):
                degradations.add_error(INDEX, reply, what="passage text")
                return None
            if isinstance(reply, BaseException):
                raise reply
            # Chunks written before payloads existed have no text: nothing to show for them.
            chunks.update((c.chunk_id, chunk_text(c)) for c in reply.chunks if c.text)
        return chunks


def chunk_text(stored: index_pb2.StoredChunk) -> sparse_pb2.ChunkText:
    """An index payload in the form sparse gives it (what ranking and answering read)."""
    return sparse_pb2.ChunkText(
        chunk_id=stored.chunk_id,
        doc_id=stored.doc_id,
        title=stored.source.title,
        text=stored.text,
        location=stored.location,
        source_uri=stored.source.source_uri,
        metadata=dict(stored.source.metadata),
    )
