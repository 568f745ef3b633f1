"""One search: plan, fan out to every retrieval leg in parallel under the caller's deadline,
fuse with weighted RRF, hydrate the winners.

Hydration (text, title, source, metadata of the winners) asks the sparse service first; when it
fails or is late, the index shards' stored payload stands in for it (a degradation with
fallback ``index_payload``), so answers do not depend on one sparse process.

Every downstream call goes through ``meshkit.client.Downstream`` (deadline, retries for
idempotent calls, a breaker per downstream). A leg that fails, or is not back by the leg
deadline, is cancelled and reported as a degradation; the answer comes from the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from meshkit.client import ClientPolicy, Downstream, DownstreamError
from meshkit.errors import deadline_exceeded, not_found, unavailable
from meshkit.ids import shard_of
from meshkit.interceptors import deadline_var
from meshkit.settings import GatewaySettings
from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2, embedder_pb2_grpc
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.planner.v1 import planner_pb2, planner_pb2_grpc
from ragmesh.reranker.v1 import reranker_pb2_grpc
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from services.gateway import metrics
from services.gateway.collections import check_query_embedder
from services.gateway.fusion import Fused, Hit, collapse_documents, combine_variations, merge_by_score, rrf
from services.gateway.planning import LocalPlanner, local_planner
from services.gateway.rerank import RERANKER, candidate_count, rerank
from services.gateway.validation import BM25, DENSE, EXACT, LEGS, SearchParams

log = logging.getLogger("gateway.search")

PLANNER, EMBEDDER, INDEX, SPARSE, HYDE = "planner", "embedder", "index", "sparse", "hyde"
INDEX_PAYLOAD = "index_payload"
UNAVAILABLE, DEADLINE, BREAKER_OPEN, ERROR = "unavailable", "deadline", "breaker_open", "error"
INVALID_OUTPUT = "invalid_output"
# DownstreamError.reason (and the LLM stages' fallback reasons) -> degradation reason
# ("rejected": the downstream refused our request, which is our error to report, not its health).
REASON_OF = {
    "unavailable": UNAVAILABLE,
    "deadline": DEADLINE,
    "breaker_open": BREAKER_OPEN,
    "invalid_output": INVALID_OUTPUT,
}
# The planner's name for each role of a conversation turn.
TURN_ROLE = {
    narrator_pb2.ROLE_USER: planner_pb2.TURN_ROLE_USER,
    narrator_pb2.ROLE_ASSISTANT: planner_pb2.TURN_ROLE_ASSISTANT,
}
# Pool sizes of the fallback plan: the planner's seeds.
PRECISE_POOL = 50
FALLBACK_POOL = {planner_pb2.STRATEGY_PRECISE: PRECISE_POOL, planner_pb2.STRATEGY_EXHAUSTIVE: 80}
# Shares of the caller's budget: at most this much for the plan (the legs need the rest)...
PLANNER_SHARE = 0.3
# ...and at most this much kept back from the legs for fusion and hydration.
FINISH_SHARE = 0.25
# Hydration stops this long before the caller's deadline, to leave time to build and send the
# reply (meshkit's own margin, 20 ms, is too tight for that on a busy host).
REPLY_MARGIN_S = 0.04


@dataclass
class Degradation:
    stage: str
    reason: str
    target: str
    message: str
    legs: list[str] = field(default_factory=list)
    # What served instead (INDEX_PAYLOAD); "" when nothing did.
    fallback: str = ""


@dataclass
class SearchOutcome:
    results: list[Fused]
    # chunk_id -> stored chunk; empty when hydration failed.
    chunks: dict[str, sparse_pb2.ChunkText]
    plan: planner_pb2.Plan
    degradations: list[Degradation]
    # Stage -> milliseconds.
    timings: dict[str, float]
    # Each leg's own ranked list (legs that answered).
    leg_lists: dict[str, list[Hit]]
    # The results are in the reranker's order.
    reranked: bool = False
    # The fused list before reranking (top_k long); empty when reranking was off.
    fused: list[Fused] = field(default_factory=list)
    # Content words of the searched query no document of the collection holds (the BM25 leg's
    # finding; empty when that leg did not answer).
    unknown_terms: list[str] = field(default_factory=list)


class Backends:
    """The guarded clients of every downstream the gateway calls."""

    def __init__(
        self,
        planner: Downstream[planner_pb2_grpc.PlannerServiceStub],
        embedder: Downstream[embedder_pb2_grpc.EmbedderServiceStub],
        shards: Sequence[Downstream[index_pb2_grpc.IndexServiceStub]],
        sparse: Downstream[sparse_pb2_grpc.SparseServiceStub],
        reranker: Downstream[reranker_pb2_grpc.RerankerServiceStub] | None = None,
    ) -> None:
        self.planner = planner
        self.embedder = embedder
        self.shards = list(shards)
        self.sparse = sparse
        # None: no reranker tier is deployed (reranker_address is empty).
        self.reranker = reranker

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> Backends:
        policy = ClientPolicy.from_settings(settings)
        size = settings.max_message_bytes
        return cls(
            Downstream(PLANNER, settings.planner_address, planner_pb2_grpc.PlannerServiceStub, policy, size),
            Downstream(
                EMBEDDER, settings.embedder_address, embedder_pb2_grpc.EmbedderServiceStub, policy, size
            ),
            [
                Downstream(f"index-{i}", address, index_pb2_grpc.IndexServiceStub, policy, size)
                for i, address in enumerate(settings.index_address_list())
            ],
            Downstream(SPARSE, settings.sparse_address, sparse_pb2_grpc.SparseServiceStub, policy, size),
            Downstream(
                RERANKER, settings.reranker_address, reranker_pb2_grpc.RerankerServiceStub, policy, size
            )
            if settings.reranker_address
            else None,
        )

    async def close(self) -> None:
        downstreams: list[Downstream[Any]] = [self.planner, self.embedder, *self.shards, self.sparse]
        if self.reranker is not None:
            downstreams.append(self.reranker)
        for downstream in downstreams:
            await downstream.close()


INDEX_TEXT = "passage text from the index"


def _hits(raw: Sequence[Any]) -> list[Hit]:
    return [Hit(h.chunk_id, h.doc_id, h.score) for h in raw]


def _collection_missing(exc: DownstreamError) -> bool:
    return exc.code == grpc.StatusCode.NOT_FOUND


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


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


class Degradations:
    """Degradations of one search, one per (stage, downstream): sparse down is one entry
    covering BM25 and exact, not two."""

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], Degradation] = {}

    def add(self, stage: str, reason: str, target: str, message: str, legs: Sequence[str] = ()) -> None:
        current = self.items.get((stage, target))
        if current is None:
            self.items[(stage, target)] = Degradation(stage, reason, target, message, list(legs))
            return
        current.legs = [leg for leg in LEGS if leg in current.legs or leg in legs]
        # What a call that reached the downstream saw says more than a refusal by the breaker
        # that this very search may have tripped.
        if current.reason == BREAKER_OPEN:
            current.reason = reason
        if message not in current.message:
            current.message = f"{current.message}; {message}"

    def add_error(self, stage: str, exc: DownstreamError, legs: Sequence[str] = (), what: str = "") -> None:
        reason = REASON_OF.get(exc.reason, ERROR)
        detail = f"{exc.target}: {exc.reason}: {exc.message}"
        self.add(stage, reason, exc.target, f"{what}: {detail}" if what else detail, legs)

    def note_fallback(self, stage: str, target: str, fallback: str, message: str) -> None:
        """``fallback`` served in place of ``stage`` (whose failure is already recorded, or is
        recorded now with ``message``)."""
        item = self.items.get((stage, target))
        if item is None:
            self.add(stage, ERROR, target, message)
            item = self.items[(stage, target)]
        elif message not in item.message:
            item.message = f"{item.message}; {message}"
        item.fallback = fallback

    def as_list(self) -> list[Degradation]:
        return list(self.items.values())


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
                self.timings[timing] = max(self.timings.get(timing, 0.0), _ms(time.perf_counter() - started))

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
        if isinstance(exc, DownstreamError) and _collection_missing(exc) and job.stage != EMBEDDER:
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
                self.texts.setdefault(stored.chunk_id, _chunk_text(stored))
        return [_hits(reply.hits) for reply in answered]

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
        self.texts.update((chunk.chunk_id, chunk) for chunk in reply.chunks)
        return _hits(reply.hits)

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
        return _hits(reply.hits)

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


class Searcher:
    def __init__(
        self, settings: GatewaySettings, backends: Backends, planner: LocalPlanner | None = None
    ) -> None:
        self.settings = settings
        self.backends = backends
        # None: every plan comes from the planner service.
        self.local_planner = planner

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> Searcher:
        return cls(settings, Backends.from_settings(settings), local_planner(settings))

    def _leg_deadline(self, reranking: bool) -> float:
        """When the legs must be back: the caller's deadline less time for fusion and
        hydration (a share of the budget, so short deadlines still leave the legs most), and
        when reranking, less the share kept for the reranker."""
        now = time.monotonic()
        inbound = deadline_var.get()
        budget = self.settings.client_timeout_s if inbound is None else inbound - now
        if budget <= 0:
            raise deadline_exceeded("the deadline passed before the search started")
        end = now + budget
        reserve = min(self.settings.gateway_finish_reserve_s, FINISH_SHARE * budget)
        if reranking:
            reserve = max(reserve, self.settings.gateway_rerank_share * budget)
        return end - reserve

    def _reply_deadline(self) -> float:
        """When the last downstream call must be back, leaving time to send the reply."""
        inbound = deadline_var.get()
        if inbound is None:
            return time.monotonic() + self.settings.client_timeout_s
        return inbound - REPLY_MARGIN_S

    def _pool(self, params: SearchParams, plan_pool: int) -> int:
        return min(max(params.pool_size or plan_pool, params.top_k), self.settings.gateway_max_pool_size)

    def _early_pool(self, params: SearchParams) -> int:
        """The pool of calls made before the plan: the largest any plan could ask for."""
        return self._pool(params, max(FALLBACK_POOL.values()))

    async def _planned(
        self, params: SearchParams, fanout: Fanout, deadline: float, degradations: Degradations
    ) -> planner_pb2.Plan:
        """The plan: made here when the local planner serves the request; else asked of the
        planner service while BM25 and the question's own dense search run (a conversation's
        question is searched only once the planner has rewritten it)."""
        local = self.local_planner
        if local is not None and local.serves(params.hyde_mode):
            plan = local.plan(params.query, params.strategy, params.max_variations, params.history)
            return self._usable_plan(plan, params)
        if not params.history:
            fanout.start_early()
        planning = asyncio.create_task(self._plan(params, deadline, degradations))
        try:
            await fanout.run_until(planning)
        finally:
            if not planning.done():
                planning.cancel()
        return planning.result()

    async def search(self, params: SearchParams) -> SearchOutcome:
        started = time.perf_counter()
        reranking = params.rerank and self.backends.reranker is not None
        deadline = self._leg_deadline(reranking)
        degradations = Degradations()
        timings: dict[str, float] = {}

        fanout = Fanout(
            self.backends,
            params,
            self._early_pool(params),
            deadline,
            degradations,
            self.settings.gateway_dense_combine,
            self._texts_wanted(params, reranking),
        )
        try:
            plan = await self._planned(params, fanout, deadline, degradations)
            timings["planner"] = _ms(time.perf_counter() - started)
            # From here on every leg, the reranker and HyDE work on the query the plan searches (a
            # follow-up's standalone rewrite); the outcome's plan says which it was.
            params = dataclasses.replace(params, query=plan.searched_query)
            dense_texts = [*plan.variations, *([plan.hyde_passage] if plan.hyde_passage.strip() else [])]
            fanout.start_planned(params, plan, dense_texts, self._pool(params, plan.pool_size))
            await fanout.collect()
        except BaseException:
            fanout.cancel()
            raise
        timings.update(fanout.timings)
        self._raise_if_nothing_answered(params, fanout, degradations)
        if self._needs_supplement(plan, params, fanout):
            hyde_started = time.perf_counter()
            await self._supplement_with_hyde(params, plan, fanout, degradations)
            timings["hyde"] = _ms(time.perf_counter() - hyde_started)

        fuse_started = time.perf_counter()
        fused = rrf(fanout.lists, params.weights, params.rrf_k)
        if params.collapse_documents:
            fused = collapse_documents(fused)
        for rank, entry in enumerate(fused, 1):
            entry.fused_rank = rank
        to_rerank = (
            candidate_count(self.settings, params.rerank_candidates, plan.strategy) if reranking else 0
        )
        top = fused[: max(params.top_k, to_rerank)]
        fused_top = fused[: params.top_k] if to_rerank else []
        timings["fuse"] = _ms(time.perf_counter() - fuse_started)

        hydrate_started = time.perf_counter()
        top, chunks = await self._hydrate(params, top, degradations, fanout.texts)
        timings["hydrate"] = _ms(time.perf_counter() - hydrate_started)
        reranked = False
        if to_rerank and top:
            rerank_started = time.perf_counter()
            top, reranked = await self._rerank(params, top, to_rerank, chunks, degradations)
            timings["rerank"] = _ms(time.perf_counter() - rerank_started)
        top = top[: params.top_k]
        timings["total"] = _ms(time.perf_counter() - started)
        for stage, ms in timings.items():
            if stage != "total":
                metrics.STAGE_SECONDS.labels(stage).observe(ms / 1000)
        found = degradations.as_list()
        for item in found:
            metrics.DEGRADATIONS.labels(item.stage, item.reason).inc()
        return SearchOutcome(
            top, chunks, plan, found, timings, fanout.lists, reranked, fused_top, fanout.unknown_terms
        )

    def _needs_supplement(self, plan: planner_pb2.Plan, params: SearchParams, fanout: Fanout) -> bool:
        """Supplement HyDE: only when the plain search came back weak, by the best dense
        cosine or by how few results the legs found together."""
        if plan.hyde_mode != planner_pb2.HYDE_MODE_SUPPLEMENT or not params.enabled(DENSE):
            return False
        best = fanout.best_dense_score()
        found = len({hit.chunk_id for hits in fanout.lists.values() for hit in hits})
        weak_score = best is None or best < self.settings.gateway_hyde_min_score
        return weak_score or found < self.settings.gateway_hyde_min_results

    async def _supplement_with_hyde(
        self, params: SearchParams, plan: planner_pb2.Plan, fanout: Fanout, degradations: Degradations
    ) -> None:
        """Ask the planner for a hypothetical answer passage and search with it too; a failure
        leaves the plain search's results, with a degradation."""
        planner = self.backends.planner
        try:
            reply = await planner.call(
                planner.stub.Hyde,
                planner_pb2.HydeRequest(query=params.query),
                timeout=fanout.deadline - time.monotonic(),
                # Not retried: a failed generation would only be slow again within the same budget.
                idempotent=False,
            )
            if reply.passage.strip():
                await fanout.add_dense_text(reply.passage)
        except DownstreamError as exc:
            degradations.add_error(HYDE, exc, [DENSE])
            return
        plan.hyde_passage = reply.passage

    async def _rerank(
        self,
        params: SearchParams,
        top: list[Fused],
        count: int,
        chunks: dict[str, sparse_pb2.ChunkText],
        degradations: Degradations,
    ) -> tuple[list[Fused], bool]:
        """The first ``count`` results reordered by the reranker, the rest after them in fused
        order; on any reranker failure, ``top`` as it was, with a degradation."""
        reranker = self.backends.reranker
        assert reranker is not None
        if not chunks:
            degradations.add(RERANKER, ERROR, reranker.target, "no passage text to rerank (hydration failed)")
            return top, False
        candidates, rest = top[:count], top[count:]
        try:
            outcome = await rerank(
                reranker,
                params.query,
                candidates,
                chunks,
                deadline=self._reply_deadline(),
                fused_weight=self.settings.gateway_rerank_fused_weight,
                rrf_k=params.rrf_k,
                keep_fused_margin=params.keep_fused_margin,
            )
        except DownstreamError as exc:
            degradations.add_error(RERANKER, exc)
            for item in candidates:
                item.rerank_score = None
            return top, False
        return [*outcome.results, *rest], outcome.reranked

    def _raise_if_nothing_answered(
        self, params: SearchParams, fanout: Fanout, degradations: Degradations
    ) -> None:
        found = degradations.as_list()
        leg_failures = [d for d in found if d.legs and d.stage != PLANNER]
        if fanout.answered == 0 and fanout.missing > 0 and not leg_failures:
            raise not_found(f"collection {params.collection!r} does not exist")
        if not fanout.failed_everywhere():
            return
        for item in found:
            metrics.DEGRADATIONS.labels(item.stage, item.reason).inc()
        detail = "; ".join(f"{d.stage} {d.reason}: {d.message}" for d in found)
        if all(d.reason == DEADLINE for d in leg_failures):
            raise deadline_exceeded(f"no retrieval leg answered within the deadline ({detail})")
        raise unavailable(f"every retrieval leg failed ({detail})")

    async def _plan(
        self, params: SearchParams, deadline: float, degradations: Degradations
    ) -> planner_pb2.Plan:
        planner = self.backends.planner
        request = planner_pb2.PlanRequest(
            query=params.query,
            strategy=params.strategy,
            max_variations=params.max_variations,
            hyde_mode=params.hyde_mode,
            history=[planner_pb2.Turn(role=TURN_ROLE[t.role], content=t.content) for t in params.history],
        )
        budget = min(self.settings.gateway_planner_timeout_s, PLANNER_SHARE * (deadline - time.monotonic()))
        try:
            reply = await planner.call(planner.stub.Plan, request, timeout=budget, idempotent=True)
        except DownstreamError as exc:
            # Without a plan: the question alone, no keywords (the exact leg has no input).
            degradations.add_error(PLANNER, exc, [EXACT] if params.enabled(EXACT) else [])
            return self._fallback_plan(params)
        if reply.fallback_reason:
            # The planner's LLM failed and it planned deterministically: the search runs, but the
            # caller should know the plan is the simpler one.
            reason = REASON_OF.get(reply.fallback_reason, ERROR)
            degradations.add(PLANNER, reason, planner.target, f"llm planner: {reply.fallback_message}")
        return self._usable_plan(reply.plan, params)

    @staticmethod
    def _fallback_plan(params: SearchParams) -> planner_pb2.Plan:
        strategy = params.strategy or planner_pb2.STRATEGY_PRECISE
        return planner_pb2.Plan(
            strategy=strategy,
            pool_size=FALLBACK_POOL[strategy],
            variations=[params.query],
            hyde_mode=planner_pb2.HYDE_MODE_OFF,
            planner="fallback",
            searched_query=params.query,
        )

    def _usable_plan(self, plan: planner_pb2.Plan, params: SearchParams) -> planner_pb2.Plan:
        """The plan as the legs will use it: the searched query first, no blanks or repeats,
        within the gateway's limits (the plan is returned as used, so callers see what ran)."""
        limit = params.max_variations or self.settings.gateway_max_variations
        searched = self._searched_query(plan, params)
        variations = list(dict.fromkeys([searched, *(v for v in plan.variations if v.strip())]))
        keywords = list(dict.fromkeys(k for k in plan.hard_keywords if k.strip()))
        usable = planner_pb2.Plan()
        usable.CopyFrom(plan)
        usable.pool_size = plan.pool_size or FALLBACK_POOL.get(plan.strategy, PRECISE_POOL)
        del usable.variations[:]
        usable.variations.extend(variations[:limit])
        del usable.hard_keywords[:]
        usable.hard_keywords.extend(keywords[: self.settings.gateway_max_keywords])
        usable.searched_query = searched
        return usable

    def _searched_query(self, plan: planner_pb2.Plan, params: SearchParams) -> str:
        """The planner's standalone query, or the question as asked when the plan has none
        (an older planner) or one outside the gateway's own query limits."""
        searched = plan.searched_query
        if not searched.strip() or len(searched) > self.settings.gateway_max_query_chars:
            return params.query
        return searched

    def _texts_wanted(self, params: SearchParams, reranking: bool) -> int:
        """How many of each leg's first hits should come with their text: what a precise plan
        shows and reranks (an exhaustive plan's further candidates are hydrated)."""
        if not reranking:
            return params.top_k
        precise = planner_pb2.STRATEGY_PRECISE
        return max(params.top_k, candidate_count(self.settings, params.rerank_candidates, precise))

    async def _hydrate(
        self,
        params: SearchParams,
        top: list[Fused],
        degradations: Degradations,
        known: dict[str, sparse_pb2.ChunkText],
    ) -> tuple[list[Fused], dict[str, sparse_pb2.ChunkText]]:
        """Text, title, location, source and metadata of the results: those the legs sent with
        their hits (``known``), the rest from one GetChunks call to sparse, or, when it fails or
        is late, one per index shard from their stored payload. Without either the results all
        go out bare (a partly hydrated list would be reranked and shown inconsistently); chunks
        deleted since the legs saw them (or without a stored payload) are dropped."""
        sparse = self.backends.sparse
        chunks = {f.chunk_id: known[f.chunk_id] for f in top if f.chunk_id in known}
        missing = [f.chunk_id for f in top if f.chunk_id not in chunks]
        if not missing:
            if chunks and (SPARSE, sparse.target) in degradations.items:
                # Sparse's legs failed: every text shown is an index payload, as the fallback's.
                degradations.note_fallback(SPARSE, sparse.target, INDEX_PAYLOAD, INDEX_TEXT)
            return top, chunks
        request = sparse_pb2.GetChunksRequest(collection=params.collection, chunk_ids=missing)
        end = self._reply_deadline()
        timeout = self.settings.gateway_hydrate_sparse_share * (end - time.monotonic())
        try:
            reply = await sparse.call(sparse.stub.GetChunks, request, timeout=timeout, idempotent=True)
        except DownstreamError as exc:
            degradations.add_error(SPARSE, exc, what="passage text")
            fetched = await self._index_payloads(params.collection, missing, end, degradations)
            if fetched is None:
                return top, {}
            degradations.note_fallback(SPARSE, sparse.target, INDEX_PAYLOAD, INDEX_TEXT)
        else:
            fetched = {c.chunk_id: c for c in reply.chunks}
        chunks.update(fetched)
        return [f for f in top if f.chunk_id in chunks], chunks

    async def _index_payloads(
        self, collection: str, ids: list[str], end: float, degradations: Degradations
    ) -> dict[str, sparse_pb2.ChunkText] | None:
        """The chunks' stored payloads from the shards that own them (meshkit.ids.shard_of, as
        the writers place them); None when a shard holding some of them did not answer."""
        shards = self.backends.shards
        owned: dict[int, list[str]] = {}
        for chunk_id in ids:
            owned.setdefault(shard_of(chunk_id, len(shards)), []).append(chunk_id)

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
            chunks.update((c.chunk_id, _chunk_text(c)) for c in reply.chunks if c.text)
        return chunks


def _chunk_text(stored: index_pb2.StoredChunk) -> sparse_pb2.ChunkText:
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
