"""The retrieval calls of one search (dense: embed then every index shard; BM25; exact), run
concurrently under the leg deadline. A leg that fails or is late is cancelled and reported as a
degradation; the answer comes from the others."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from meshkit.rpc.client import Downstream, DownstreamError
from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from ragmesh.planner.v1 import planner_pb2
from ragmesh.sparse.v1 import sparse_pb2
from services.gateway.backends import Backends
from services.gateway.collections import check_query_embedder
from services.gateway.degradations import DEADLINE, EMBEDDER, ERROR, INDEX, SPARSE, Degradations
from services.gateway.fusion import Hit, combine_variations, merge_by_score
from services.gateway.hydration import chunk_text
from services.gateway.metrics import ms
from services.gateway.validation import BM25, DENSE, EXACT, SearchParams

log = logging.getLogger("gateway.search")


def hits_of(raw: Sequence[Any]) -> list[Hit]:
    return [Hit(h.chunk_id, h.doc_id, h.score) for h in raw]


def collection_missing(exc: DownstreamError) -> bool:
    return exc.code == grpc.StatusCode.NOT_FOUND


@dataclass(frozen=True)
class Job:
    """What one in-flight call stands for, to report it if it fails or runs out of time."""

    kind: str  # embed, shard, bm25, exact
    stage: str
    target: str
    legs: tuple[str, ...]
    # Embed and shard calls: the index of their first dense text, and how many they carry.
    first: int = 0
    count: int = 0


class Fanout:
    """The retrieval calls of one search, run concurrently until all are back or the leg
    deadline passes. Dense is two steps (embed, then every shard), so the shard calls are
    started as soon as the vectors arrive, and a slow shard costs only its own hits.

    What does not depend on the plan (BM25 and the embedding of the question as asked) may
    start before it (``start_early``) while the planner service works; ``start_planned`` then
    adds the exact leg and the plan's other dense texts, and ``collect`` waits for them all."""

    def __init__(
        self,
        backends: Backends,
        params: SearchParams,
        pool: int,
        deadline: float,
        degradations: Degradations,
        combine_mode: str = "rrf",
        texts_wanted: int = 0,
    ) -> None:
        self.backends = backends
        self.params = params
        self.plan = planner_pb2.Plan()
        # Every dense text started so far, in plan order (the searched query first).
        self.dense_texts: list[str] = []
        # The name of the model that embedded the query ("" until an Embed answered): cosine
        # thresholds hold for one model's scale.
        self.embedder_model = ""
        self.pool = pool
        self.deadline = deadline
        self.degradations = degradations
        self.combine_mode = combine_mode
        self.tasks: dict[asyncio.Task[Any], Job] = {}
        self.settled: set[asyncio.Task[Any]] = set()
        self.timings: dict[str, float] = {}
        self.lists: dict[str, list[Hit]] = {}
        # Dense text index -> each answering shard's hits for it.
        self.dense_hits: dict[int, list[list[Hit]]] = {}
        # Dense hits of texts searched after the fan-out (a supplementary HyDE passage).
        self.extra_dense: list[list[Hit]] = []
        self.attempted: set[str] = set()
        self.answered = 0
        self.missing = 0
        self.unknown_terms: list[str] = []
        self.novel_terms: list[str] = []
        # The legs' first hits come with their text: hydration then only asks for the rest.
        self.texts_wanted = texts_wanted
        self.texts: dict[str, sparse_pb2.ChunkText] = {}
        # The question the early calls searched; "" when nothing started early.
        self.early_query = ""

    def _left(self) -> float:
        return self.deadline - time.monotonic()

    def _spawn(self, job: Job, timing: str, started: float, work: Callable[[], Awaitable[Any]]) -> None:
        # ``work`` makes the call's coroutine inside the task: a task cancelled before it starts
        # (early calls redone) then leaves no coroutine that was never awaited.
        async def timed() -> Any:
            try:
                return await work()
            finally:
                # A stage's time runs from its start to its last call's end (shards run together).
                self.timings[timing] = max(self.timings.get(timing, 0.0), ms(time.perf_counter() - started))

        self.tasks[asyncio.create_task(timed())] = job

    def start_early(self) -> None:
        """BM25 and the dense search of the question as asked, before the plan is known."""
        params = self.params
        self.early_query = params.query
        if params.enabled(DENSE):
            self._start_dense([params.query])
        if params.enabled(BM25):
            self._start_bm25()

    def start_planned(
        self, params: SearchParams, plan: planner_pb2.Plan, dense_texts: list[str], pool: int
    ) -> None:
        """What the plan adds: the exact leg, and the dense texts not already searched early
        (``params``: the request as the plan searches it). Early calls made for another
        question (the plan rewrote it) or a smaller pool are dropped and made again."""
        self.params, self.plan = params, plan
        if self.early_query and (self.early_query != self.params.query or pool > self.pool):
            self.cancel()
            self.early_query = ""
        self.pool = pool
        params = self.params
        if params.enabled(DENSE) and len(dense_texts) > len(self.dense_texts):
            self._start_dense(dense_texts[len(self.dense_texts) :])
        if params.enabled(BM25) and not self.early_query:
            self._start_bm25()
        if params.enabled(EXACT) and plan.hard_keywords:
            self.attempted.add(EXACT)
            job = Job(EXACT, SPARSE, self.backends.sparse.target, (EXACT,))
            self._spawn(job, EXACT, time.perf_counter(), self._exact)

    def _start_dense(self, texts: list[str]) -> None:
        self.attempted.add(DENSE)
        first = len(self.dense_texts)
        self.dense_texts.extend(texts)
        job = Job("embed", EMBEDDER, EMBEDDER, (DENSE,), first, len(texts))
        self._spawn(job, "embed", time.perf_counter(), functools.partial(self._embed, texts))

    def _start_bm25(self) -> None:
        self.attempted.add(BM25)
        job = Job(BM25, SPARSE, self.backends.sparse.target, (BM25,))
        self._spawn(job, BM25, time.perf_counter(), self._bm25)

    def cancel(self) -> None:
        """Drop every call in flight and everything learnt so far (the search starts over, or
        is abandoned)."""
        for task in self.tasks:
            task.cancel()
        self.tasks.clear()
        self.settled.clear()
        self.lists.clear()
        self.dense_hits.clear()
        self.dense_texts.clear()
        self.attempted.clear()
        self.texts.clear()
        self.unknown_terms = []
        self.novel_terms = []
        self.answered = self.missing = 0

    async def run_until(self, other: asyncio.Task[Any]) -> None:
        """Settle calls as they finish, so early vectors go on to the shards, until ``other``
        (the plan) is done."""
        while not other.done():
            pending = {t for t in self.tasks if t not in self.settled}
            await asyncio.wait({other, *pending}, return_when=asyncio.FIRST_COMPLETED)
            self._settle_done()

    async def collect(self) -> None:
        """Wait for every call until the leg deadline, then build the dense list."""
        await self._collect()
        for leg in (BM25, EXACT):
            if leg in self.lists:
                # Early calls asked for the largest pool a plan could want.
                self.lists[leg] = self.lists[leg][: self.pool]
        if self.dense_hits:
            self.lists[DENSE] = self._dense_list()

    def _settle_done(self) -> None:
        for task in [t for t in self.tasks if t.done() and t not in self.settled]:
            self._settle(task)

    async def _collect(self) -> None:
        self._settle_done()
        pending: set[asyncio.Task[Any]] = {t for t in self.tasks if t not in self.settled}
        try:
            while pending:
                done, pending = await asyncio.wait(
                    pending, timeout=max(0.0, self._left()), return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    break
                self._settle_done()
                pending = {t for t in self.tasks if t not in self.settled}
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        for task in pending:
            job = self.tasks[task]
            self.degradations.add(
                job.stage, DEADLINE, job.target, f"{job.target}: no answer within the deadline", job.legs
            )

    def _settle(self, task: asyncio.Task[Any]) -> None:
        self.settled.add(task)
        job = self.tasks[task]
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, DownstreamError):
            raise exc
        if isinstance(exc, DownstreamError) and collection_missing(exc) and job.stage != EMBEDDER:
            # The collection has no data there (a shard may hold none of a small collection).
            self.missing += 1
            result: Any = [[] for _ in range(job.count)] if job.kind == "shard" else []
        elif isinstance(exc, DownstreamError):
            self.degradations.add_error(job.stage, exc, job.legs)
            return
        else:
            result = task.result()
            if job.stage != EMBEDDER:
                self.answered += 1
        if job.kind == "embed":
            self._start_shards(job.first, result)
        elif job.kind == "shard":
            for offset, hits in enumerate(result):
                self.dense_hits.setdefault(job.first + offset, []).append(hits)
        else:
            self.lists[job.kind] = result

    def _start_shards(self, first: int, vectors: list[common_pb2.Vector]) -> None:
        if not self.backends.shards:
            self.degradations.add(INDEX, ERROR, INDEX, "no index shards are configured", (DENSE,))
            return
        now = time.perf_counter()
        for shard in self.backends.shards:
            job = Job("shard", INDEX, shard.target, (DENSE,), first, len(vectors))
            self._spawn(job, DENSE, now, functools.partial(self._search_shard, shard, vectors))

    async def _embed(self, texts: list[str]) -> list[common_pb2.Vector]:
        embedder = self.backends.embedder
        request = embedder_pb2.EmbedRequest(texts=texts, kind=embedder_pb2.TEXT_KIND_QUERY)
        reply = await embedder.call(embedder.stub.Embed, request, timeout=self._left(), idempotent=True)
        check_query_embedder(self.params, reply.model, reply.model_sha256, reply.vectors)
        self.embedder_model = reply.model
        if len(reply.vectors) != len(texts):
            raise DownstreamError(
                embedder.target,
                "error",
                None,
                f"{len(reply.vectors)} vectors for {len(texts)} texts",
            )
        return list(reply.vectors)

    async def _search_shard(
        self, shard: Downstream[index_pb2_grpc.IndexServiceStub], vectors: list[common_pb2.Vector]
    ) -> list[list[Hit]]:
        params = self.params
        calls = [
            shard.call(
                shard.stub.Search,
                index_pb2.SearchRequest(
                    collection=params.collection,
                    vector=vector,
                    top_k=self.pool,
                    doc_ids=params.doc_ids,
                    filter=params.filter_pb(),
                    with_payloads=self.texts_wanted,
                ),
                timeout=self._left(),
                idempotent=True,
            )
            for vector in vectors
        ]
        replies = await asyncio.gather(*calls, return_exceptions=True)
        errors = [reply for reply in replies if isinstance(reply, BaseException)]
        if errors:
            # As in Degradations.add: a call that reached the shard says more than the breaker.
            raise min(errors, key=lambda e: isinstance(e, DownstreamError) and e.reason == "breaker_open")
        answered = [reply for reply in replies if not isinstance(reply, BaseException)]
        for reply in answered:
            for stored in reply.chunks:
                # Sparse's text wins where both stores gave one (it is what GetChunks serves).
                self.texts.setdefault(stored.chunk_id, chunk_text(stored))
        return [hits_of(reply.hits) for reply in answered]

    async def _bm25(self) -> list[Hit]:
        sparse, params = self.backends.sparse, self.params
        request = sparse_pb2.SearchBm25Request(
            collection=params.collection,
            query=params.query,
            top_k=self.pool,
            doc_ids=params.doc_ids,
            filter=params.filter_pb(),
            with_text=self.texts_wanted,
        )
        reply = await sparse.call(sparse.stub.SearchBm25, request, timeout=self._left(), idempotent=True)
        self.unknown_terms = list(reply.unknown_terms)
        self.novel_terms = list(reply.novel_terms)
        self.texts.update((chunk.chunk_id, chunk) for chunk in reply.chunks)
        return hits_of(reply.hits)

    async def _exact(self) -> list[Hit]:
        sparse, params = self.backends.sparse, self.params
        request = sparse_pb2.SearchExactRequest(
            collection=params.collection,
            keywords=list(self.plan.hard_keywords),
            top_k=self.pool,
            doc_ids=params.doc_ids,
            filter=params.filter_pb(),
        )
        reply = await sparse.call(sparse.stub.SearchExact, request, timeout=self._left(), idempotent=True)
        return hits_of(reply.hits)

    def _dense_list(self) -> list[Hit]:
        per_text = [merge_by_score(answers, self.pool) for _, answers in sorted(self.dense_hits.items())]
        return combine_variations(
            [*per_text, *self.extra_dense], self.params.rrf_k, self.pool, self.combine_mode
        )

    def best_dense_score(self) -> float | None:
        """The best cosine any dense text found (None: the dense leg found nothing)."""
        scores = [hits[0].score for answers in self.dense_hits.values() for hits in answers if hits]
        return max(scores) if scores else None

    async def add_dense_text(self, text: str) -> None:
        """Search one more text on the dense leg (every shard) and fold its hits into the
        dense list; raises DownstreamError when the embedder or every shard fails."""
        embedder = self.backends.embedder
        request = embedder_pb2.EmbedRequest(texts=[text], kind=embedder_pb2.TEXT_KIND_QUERY)
        reply = await embedder.call(embedder.stub.Embed, request, timeout=self._left(), idempotent=True)
        check_query_embedder(self.params, reply.model, reply.model_sha256, reply.vectors)
        answers = await asyncio.gather(
            *(self._search_shard(shard, list(reply.vectors)) for shard in self.backends.shards),
            return_exceptions=True,
        )
        found = [answer[0] for answer in answers if not isinstance(answer, BaseException) and answer]
        if not found:
            errors = [a for a in answers if isinstance(a, DownstreamError)]
            raise errors[0] if errors else DownstreamError(INDEX, "error", None, "no index shard answered")
        self.extra_dense.append(merge_by_score(found, self.pool))
        self.lists[DENSE] = self._dense_list()

    def failed_everywhere(self) -> bool:
        return bool(self.attempted) and not self.lists
