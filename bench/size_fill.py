"""The size bench's filler: synthetic documents straight into the stores' write RPCs, as the
ingestion workers write them (services/ingestion/pipeline.py): one ``ReplaceDocuments`` per index
shard and one per sparse shard that owns some of the batch's documents (a document goes whole to
meshkit.domain.ids.document_shard, in both stores), all of a batch in parallel, a few batches in
flight. Each document carries its title, source URI and
metadata (``DocumentSource``), each chunk its text and location, and a fence (its version + 1).

A size that ends inside a document sends that document's first chunks; the next size sends the
rest with the first ones as ``keep_chunk_ids``, as an edited document is written.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.size_corpus import Document, ExactIndex, SyntheticCorpus
from meshkit.domain.ids import document_shard
from ragmesh.common.v1 import common_pb2
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc

WRITE_TIMEOUT_S = 600.0
PROGRESS_EVERY_S = 2.0


@dataclass(frozen=True)
class Part:
    """Chunks ``ordinals`` of ``doc`` to write, the ones before them already written."""

    doc: Document
    ordinals: range

    @property
    def kept(self) -> list[str]:
        return self.doc.chunk_ids[: self.ordinals.start]


class FillStopped(RuntimeError):
    """A fill given up because it would not end by its deadline; ``stats`` is what it did."""

    def __init__(self, message: str, stats: FillStats) -> None:
        super().__init__(message)
        self.stats = stats


# A fill projected to end past its deadline is given up once it has run this long (a rate is known).
PROJECT_AFTER_S = 120.0


@dataclass
class FillStats:
    chunks: int = 0
    batches: int = 0
    wall_s: float = 0.0
    # Per batch, the slowest call of each store, summed: how long the bench waited on each.
    index_wait_s: float = 0.0
    sparse_wait_s: float = 0.0
    generate_s: float = 0.0
    build_s: float = 0.0
    errors: list[str] = field(default_factory=list)


def _location(doc: Document, ordinal: int) -> common_pb2.ChunkLocation:
    start = sum(len(t) + 2 for t in doc.texts[:ordinal])
    return common_pb2.ChunkLocation(
        heading_path=[doc.title], ordinal=ordinal, char_start=start, char_end=start + len(doc.texts[ordinal])
    )


def _source(doc: Document, collection: str) -> common_pb2.DocumentSource:
    return common_pb2.DocumentSource(
        title=doc.title, source_uri=f"synthetic://{collection}/{doc.doc_id}", metadata=doc.metadata
    )


def _whole(
    parts: Sequence[Part], collection: str, chunk: Callable[[Document, int], Any], replacement: Any
) -> list[Any]:
    """Every document's replacement (``replacement``, the store's DocumentReplacement), its new
    chunks built by ``chunk`` from a document and an ordinal."""
    return [
        replacement(
            doc_id=part.doc.doc_id,
            upserts=[chunk(part.doc, j) for j in part.ordinals],
            keep_chunk_ids=part.kept,
            fence=part.doc.version + 1,
            source=_source(part.doc, collection),
        )
        for part in parts
    ]


def _by_owner(documents: list[Any], shards: int) -> list[list[Any]]:
    """The replacements per shard: a document goes whole to the shard that owns it
    (meshkit.domain.ids.document_shard), in the index and in sparse alike."""
    per_shard: list[list[Any]] = [[] for _ in range(shards)]
    for document in documents:
        per_shard[document_shard(document.doc_id, shards)].append(document)
    return per_shard


def _index_chunk(doc: Document, j: int) -> index_pb2.Chunk:
    return index_pb2.Chunk(
        chunk_id=doc.chunk_ids[j],
        doc_id=doc.doc_id,
        vector=common_pb2.Vector(values=doc.vectors[j].tolist()),
        text=doc.texts[j],
        location=_location(doc, j),
    )


def _sparse_chunk(doc: Document, j: int) -> sparse_pb2.ChunkText:
    return sparse_pb2.ChunkText(
        chunk_id=doc.chunk_ids[j],
        doc_id=doc.doc_id,
        title=doc.title,
        text=doc.texts[j],
        location=_location(doc, j),
    )


def index_requests(
    collection: str, parts: Sequence[Part], shards: int
) -> list[index_pb2.ReplaceDocumentsRequest | None]:
    """One request per index shard that owns some of the batch's documents (None for the others)."""
    whole = _whole(parts, collection, _index_chunk, index_pb2.DocumentReplacement)
    return [
        index_pb2.ReplaceDocumentsRequest(collection=collection, documents=d) if d else None
        for d in _by_owner(whole, shards)
    ]


def sparse_requests(
    collection: str, parts: Sequence[Part], shards: int
) -> list[sparse_pb2.ReplaceDocumentsRequest | None]:
    """As index_requests, for the sparse store's shards."""
    whole = _whole(parts, collection, _sparse_chunk, sparse_pb2.DocumentReplacement)
    return [
        sparse_pb2.ReplaceDocumentsRequest(collection=collection, documents=d) if d else None
        for d in _by_owner(whole, shards)
    ]


class Filler:
    """Fills one collection in document order; remembers where it stopped."""

    def __init__(
        self,
        corpus: SyntheticCorpus,
        exact: ExactIndex,
        index: Sequence[index_pb2_grpc.IndexServiceStub],
        sparse: Sequence[sparse_pb2_grpc.SparseServiceStub],
        *,
        batch_docs: int = 100,
        in_flight: int = 2,
        progress: bool = True,
        guard: Callable[[], str | None] | None = None,
    ) -> None:
        self.corpus = corpus
        self.exact = exact
        self.index = list(index)
        self.sparse = list(sparse)
        self.batch_docs = batch_docs
        self.in_flight = in_flight
        self.progress = progress
        # Called between batches (every PROGRESS_EVERY_S at most): a reason to stop, or None.
        self.guard = guard
        self.chunks = 0
        self.next_doc = 0
        self.sent_of_next = 0  # chunks of next_doc already written (a size ended inside it)
        self._block: tuple[int, list[Document]] | None = None

    @property
    def collection(self) -> str:
        return self.corpus.collection

    async def _document(self, d: int, stats: FillStats) -> Document:
        block, i = divmod(d, self.corpus.block_docs)
        if self._block is None or self._block[0] != block:
            started = time.perf_counter()
            # numpy's draws release the GIL: the event loop keeps settling calls meanwhile.
            docs = await asyncio.to_thread(self.corpus.block, block)
            stats.generate_s += time.perf_counter() - started
            self._block = (block, docs)
        return self._block[1][i]

    async def _next_parts(self, target: int, stats: FillStats) -> list[Part]:
        parts: list[Part] = []
        budget = target - self.chunks
        while budget > 0 and len(parts) < self.batch_docs:
            doc = await self._document(self.next_doc, stats)
            start = self.sent_of_next
            stop = min(len(doc.chunk_ids), start + budget)
            parts.append(Part(doc, range(start, stop)))
            budget -= stop - start
            if stop == len(doc.chunk_ids):
                self.next_doc += 1
                self.sent_of_next = 0
            else:
                self.sent_of_next = stop
        return parts

    async def write(self, parts: Sequence[Part], stats: FillStats) -> None:
        """One batch into every store, in parallel; the bench waits on the slowest of each store."""
        started = time.perf_counter()
        to_index = index_requests(self.collection, parts, len(self.index))
        to_sparse = sparse_requests(self.collection, parts, len(self.sparse))
        stats.build_s += time.perf_counter() - started

        async def timed(call: asyncio.Future[object] | object) -> float:
            t0 = time.perf_counter()
            await call  # type: ignore[misc]
            return time.perf_counter() - t0

        index_calls = [
            timed(stub.ReplaceDocuments(r, timeout=WRITE_TIMEOUT_S))
            for stub, r in zip(self.index, to_index, strict=True)
            if r is not None
        ]
        sparse_calls = [
            timed(stub.ReplaceDocuments(r, timeout=WRITE_TIMEOUT_S))
            for stub, r in zip(self.sparse, to_sparse, strict=True)
            if r is not None
        ]
        times = await asyncio.gather(*index_calls, *sparse_calls)
        stats.index_wait_s += max(times[: len(index_calls)], default=0.0)
        stats.sparse_wait_s += max(times[len(index_calls) :], default=0.0)
        stats.batches += 1

    async def fill(self, target: int, deadline: float | None = None) -> FillStats:
        """Write documents until the collection holds ``target`` chunks (progress on stderr). With a
        ``deadline`` (time.perf_counter()), give up (FillStopped) once it has passed or, after
        PROJECT_AFTER_S, once the rate so far projects the end past it."""
        stats = FillStats()
        started = last_report = last_guard = time.perf_counter()
        first = self.chunks
        pending: set[asyncio.Task[None]] = set()
        try:
            while self.chunks < target:
                if deadline is not None:
                    self._check_deadline(first, target, started, deadline, stats)
                now = time.perf_counter()
                if self.guard is not None and now - last_guard >= PROGRESS_EVERY_S:
                    last_guard = now
                    reason = self.guard()
                    if reason:
                        stats.wall_s, stats.chunks = now - started, self.chunks - first
                        raise FillStopped(
                            f"filling to {target:,} chunks stopped at {self.chunks:,}: {reason}", stats
                        )
                parts = await self._next_parts(target, stats)
                while len(pending) >= self.in_flight:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()
                pending.add(asyncio.create_task(self.write(parts, stats)))
                for part in parts:
                    self.exact.add(part.doc, part.ordinals)
                self.chunks += sum(len(p.ordinals) for p in parts)
                now = time.perf_counter()
                if self.progress and now - last_report >= PROGRESS_EVERY_S:
                    last_report = now
                    self._report(first, target, now - started)
            if pending:
                for outcome in await asyncio.gather(*pending, return_exceptions=True):
                    if isinstance(outcome, BaseException):
                        raise outcome
        finally:
            for task in pending:
                task.cancel()
        stats.wall_s = time.perf_counter() - started
        stats.chunks = self.chunks - first
        if self.progress:
            self._report(first, target, stats.wall_s, final=True)
        return stats

    def _check_deadline(
        self, first: int, target: int, started: float, deadline: float, stats: FillStats
    ) -> None:
        now = time.perf_counter()
        elapsed = now - started
        done = self.chunks - first
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (target - self.chunks) / rate if rate > 0 else float("inf")
        if now < deadline and (elapsed < PROJECT_AFTER_S or now + eta <= deadline):
            return
        stats.wall_s, stats.chunks = elapsed, done
        raise FillStopped(
            f"filling to {target:,} chunks would not end within the time budget: {self.chunks:,} "
            f"written, {rate:,.0f} chunks/s over the last {elapsed:.0f} s, {eta / 60:.0f} more minutes "
            "to go",
            stats,
        )

    def _report(self, first: int, target: int, seconds: float, final: bool = False) -> None:
        done = self.chunks - first
        rate = done / seconds if seconds > 0 else 0.0
        eta = (target - self.chunks) / rate if rate > 0 else float("inf")
        tail = f"in {seconds:.0f}s" if final else f"ETA {eta:.0f}s"
        print(
            f"fill {self.chunks:,}/{target:,} chunks, {rate:,.0f} chunks/s, {tail}",
            file=sys.stderr,
            flush=True,
        )

    async def rewrite(self, doc_indices: Sequence[int]) -> FillStats:
        """A new version of each listed document (written whole before): new text, vectors and
        chunk ids, the old chunks removed, as an edited document is re-indexed."""
        stats = FillStats()
        started = time.perf_counter()
        parts = []
        for d in doc_indices:
            version = self.exact.versions.get(d, 0) + 1
            doc = self.corpus.version(d, version)
            parts.append(Part(doc, range(len(doc.chunk_ids))))
        for i in range(0, len(parts), self.batch_docs):
            await self.write(parts[i : i + self.batch_docs], stats)
        for part in parts:
            self.exact.replace(part.doc)
        stats.chunks = sum(len(p.ordinals) for p in parts)
        stats.wall_s = time.perf_counter() - started
        return stats

    def whole_documents(self) -> int:
        """Documents written whole so far (those before next_doc)."""
        return self.next_doc
