"""The retrieval of one search: every leg's calls (dense: embed, then every index shard; BM25;
exact) run concurrently under the leg deadline. What needs no plan starts while the planner
service plans; when the plain search comes back weak, a supplementary HyDE passage is searched
too. A leg that fails or is late is cancelled and reported as a degradation; the search
answers from the others, and fails only when every leg failed.

search.py hands the plan in (or the planner's reply still to come) and takes the legs' lists
back (``Retrieved``): nothing here calls back into it. The tasks themselves (timing, settling,
the deadline) are inflight.py's."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from meshkit.core.errors import deadline_exceeded, not_found, unavailable
from meshkit.rpc.client import Downstream, DownstreamError
from meshkit.settings import GatewaySettings
from ragmesh.common.v1 import common_pb2
from ragmesh.embedder.v1 import embedder_pb2
from ragmesh.index.v1 import index_pb2, index_pb2_grpc
from ragmesh.planner.v1 import planner_pb2
from ragmesh.sparse.v1 import sparse_pb2, sparse_pb2_grpc
from services.gateway import metrics
from services.gateway.backends import Backends
from services.gateway.collections import check_query_embedder
from services.gateway.degradations import (
    DEADLINE,
    EMBEDDER,
    ERROR,
    HYDE,
    INDEX,
    PLANNER,
    SPARSE,
    Degradations,
)
from services.gateway.fusion import (
    Hit,
    combine_variations,
    merge_by_score,
    merge_shard_lists,
    reported_everywhere,
)
from services.gateway.hydration import chunk_text
from services.gateway.inflight import Calls, Job
from services.gateway.metrics import ms
from services.gateway.validation import BM25, DENSE, EXACT, SearchParams

# The plan, or the planner service's reply still to come: a coroutine not started yet, so that
# the legs that need no plan are under way before it runs alongside them.
Planned = planner_pb2.Plan | Coroutine[Any, Any, planner_pb2.Plan]


def hits_of(raw: Sequence[Any]) -> list[Hit]:
    return [Hit(h.chunk_id, h.doc_id, h.score) for h in raw]


def collection_missing(exc: DownstreamError) -> bool:
    return exc.code == grpc.StatusCode.NOT_FOUND


@dataclass
class Found:
    """What the legs have brought back so far; dropped whole when the search starts over."""

    # Leg -> its ranked list (the legs that answered; dense once collected).
    lists: dict[str, list[Hit]] = field(default_factory=dict)
    # Every dense text started so far, in plan order (the searched query first).
    dense_texts: list[str] = field(default_factory=list)
    # Dense text index -> each answering shard's hits for it.
    dense_hits: dict[int, list[list[Hit]]] = field(default_factory=dict)
    # Dense hits of texts searched after the fan-out (a supplementary HyDE passage).
    extra_dense: list[list[Hit]] = field(default_factory=list)
    # BM25 or exact -> each answering sparse shard's hits; one list per leg once collected.
    sparse_hits: dict[str, list[list[Hit]]] = field(default_factory=dict)
    # The first hits' texts, sent with them: hydration then only asks for the rest.
    texts: dict[str, sparse_pb2.ChunkText] = field(default_factory=dict)
    # The BM25 leg's words of the query no document holds, and those of them no indexed word
    # is one edit from (see sparse's SearchBm25Response): each answering shard's, and once
    # collected the words every shard reported (none unless every shard answered: the one that
    # did not may hold them). A shard without the collection answers with every word.
    unknown_by_shard: list[list[str]] = field(default_factory=list)
    novel_by_shard: list[list[str]] = field(default_factory=list)
    bm25_settled: int = 0
    unknown_terms: list[str] = field(default_factory=list)
    novel_terms: list[str] = field(default_factory=list)
    attempted: set[str] = field(default_factory=set)
    # Calls that answered (embeddings aside), and those that found no such collection there.
    answered: int = 0
    missing: int = 0

    def best_dense_score(self) -> float | None:
        """The best cosine any dense text found (None: the dense leg found nothing)."""
        scores = [hits[0].score for answers in self.dense_hits.values() for hits in answers if hits]
        return max(scores) if scores else None

    def failed_everywhere(self) -> bool:
        return bool(self.attempted) and not self.lists


class Legs:
    """The calls each leg makes for one search, under the leg deadline: what they ask (the
    request as the plan searches it, the pool) and what they bring back into ``found`` (hits,
    and on the way the first hits' texts and the query's unknown words)."""

    def __init__(
        self, backends: Backends, params: SearchParams, pool: int, deadline: float, texts_wanted: int
    ) -> None:
        self.backends = backends
        self.params = params
        self.plan = planner_pb2.Plan()
        self.pool = pool
        self.deadline = deadline
        # How many of each leg's first hits come with their text.
        self.texts_wanted = texts_wanted
        self.found = Found()
        # The name of the model that embedded the query ("" until an Embed answered): cosine
        # thresholds hold for one model's scale.
        self.embedder_model = ""

    def left(self) -> float:
        return self.deadline - time.monotonic()

    async def _embed_reply(self, texts: list[str]) -> embedder_pb2.EmbedResponse:
        """The query vectors of ``texts``, refused when another embedder than the one that
        built the collection made them (collections.check_query_embedder)."""
        embedder = self.backends.embedder
        request = embedder_pb2.EmbedRequest(texts=texts, kind=embedder_pb2.TEXT_KIND_QUERY)
        reply = await embedder.call(embedder.stub.Embed, request, timeout=self.left(), idempotent=True)
        check_query_embedder(self.params, reply.model, reply.model_sha256, reply.vectors)
        return reply

    async def embed(self, texts: list[str]) -> list[common_pb2.Vector]:
        reply = await self._embed_reply(texts)
        self.embedder_model = reply.model
        if len(reply.vectors) != len(texts):
            raise DownstreamError(
                self.backends.embedder.target,
                "error",
                None,
                f"{len(reply.vectors)} vectors for {len(texts)} texts",
            )
        return list(reply.vectors)

    async def search_shard(
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
                timeout=self.left(),
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
                self.found.texts.setdefault(stored.chunk_id, chunk_text(stored))
        return [hits_of(reply.hits) for reply in answered]

    async def bm25(self, sparse: Downstream[sparse_pb2_grpc.SparseServiceStub]) -> list[Hit]:
        params = self.params
        request = sparse_pb2.SearchBm25Request(
            collection=params.collection,
            query=params.query,
            top_k=self.pool,
            doc_ids=params.doc_ids,
            filter=params.filter_pb(),
            with_text=self.texts_wanted,
        )
        reply = await sparse.call(sparse.stub.SearchBm25, request, timeout=self.left(), idempotent=True)
        self.found.unknown_by_shard.append(list(reply.unknown_terms))
        self.found.novel_by_shard.append(list(reply.novel_terms))
        self.found.texts.update((chunk.chunk_id, chunk) for chunk in reply.chunks)
        return hits_of(reply.hits)

    async def exact(self, sparse: Downstream[sparse_pb2_grpc.SparseServiceStub]) -> list[Hit]:
        params = self.params
        request = sparse_pb2.SearchExactRequest(
            collection=params.collection,
            keywords=list(self.plan.hard_keywords),
            top_k=self.pool,
            doc_ids=params.doc_ids,
            filter=params.filter_pb(),
        )
        reply = await sparse.call(sparse.stub.SearchExact, request, timeout=self.left(), idempotent=True)
        return hits_of(reply.hits)

    async def search_text(self, text: str) -> list[Hit]:
        """One more text on the dense leg: embedded, searched on every shard, merged; raises
        DownstreamError when the embedder or every shard fails."""
        reply = await self._embed_reply([text])
        answers = await asyncio.gather(
            *(self.search_shard(shard, list(reply.vectors)) for shard in self.backends.shards),
            return_exceptions=True,
        )
        found = [answer[0] for answer in answers if not isinstance(answer, BaseException) and answer]
        if not found:
            errors = [a for a in answers if isinstance(a, DownstreamError)]
            raise errors[0] if errors else DownstreamError(INDEX, "error", None, "no index shard answered")
        return merge_by_score(found, self.pool)


class Fanout:
    """Which leg calls run when, and where their answers go. Dense is two steps (embed, then
    every shard): the shard calls start as soon as the vectors arrive, so a slow shard costs
    only its own hits. What needs no plan (BM25, the embedding of the question as asked) may
    start before it (``start_early``); ``start_planned`` adds the rest and ``collect`` waits
    for them all."""

    def __init__(self, legs: Legs, degradations: Degradations, combine_mode: str = "rrf") -> None:
        self.legs = legs
        self.degradations = degradations
        self.combine_mode = combine_mode
        self.calls = Calls(degradations, self._settle)
        # The question the early calls searched; "" when nothing started early.
        self.early_query = ""

    @property
    def found(self) -> Found:
        return self.legs.found

    def start_early(self) -> None:
        """BM25 and the dense search of the question as asked, before the plan is known."""
        params = self.legs.params
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
        legs = self.legs
        legs.params, legs.plan = params, plan
        if self.early_query and (self.early_query != params.query or pool > legs.pool):
            self.cancel()
            self.early_query = ""
        legs.pool = pool
        started = len(self.found.dense_texts)
        if params.enabled(DENSE) and len(dense_texts) > started:
            self._start_dense(dense_texts[started:])
        if params.enabled(BM25) and not self.early_query:
            self._start_bm25()
        if params.enabled(EXACT) and plan.hard_keywords:
            self._start_sparse(EXACT, legs.exact)

    def _start_dense(self, texts: list[str]) -> None:
        found = self.found
        found.attempted.add(DENSE)
        first = len(found.dense_texts)
        found.dense_texts.extend(texts)
        job = Job("embed", EMBEDDER, EMBEDDER, (DENSE,), first, len(texts))
        self.calls.spawn(job, "embed", time.perf_counter(), functools.partial(self.legs.embed, texts))

    def _start_bm25(self) -> None:
        self._start_sparse(BM25, self.legs.bm25)

    def _start_sparse(self, leg: str, search: Callable[[Any], Awaitable[list[Hit]]]) -> None:
        """One call per sparse shard: each holds whole documents, so the leg's list is their
        merge (scores of one query over one kind of index compare across shards)."""
        self.found.attempted.add(leg)
        now = time.perf_counter()
        for sparse in self.legs.backends.sparse_shards:
            job = Job(leg, SPARSE, sparse.target, (leg,))
            self.calls.spawn(job, leg, now, functools.partial(search, sparse))

    def _start_shards(self, first: int, vectors: list[common_pb2.Vector]) -> None:
        shards = self.legs.backends.shards
        if not shards:
            self.degradations.add(INDEX, ERROR, INDEX, "no index shards are configured", (DENSE,))
            return
        now = time.perf_counter()
        for shard in shards:
            job = Job("shard", INDEX, shard.target, (DENSE,), first, len(vectors))
            self.calls.spawn(job, DENSE, now, functools.partial(self.legs.search_shard, shard, vectors))

    def cancel(self) -> None:
        """Drop every call in flight and everything learnt so far (the search starts over, or
        is abandoned)."""
        self.calls.cancel()
        self.legs.found = Found()

    async def collect(self) -> None:
        """Wait for every call until the leg deadline, then build the dense list."""
        await self.calls.collect(self.legs.deadline)
        found = self.found
        for leg, answers in found.sparse_hits.items():
            # Early calls asked for the largest pool a plan could want.
            found.lists[leg] = merge_shard_lists(answers, self.legs.pool)
        if found.bm25_settled == len(self.legs.backends.sparse_shards):
            found.unknown_terms = reported_everywhere(found.unknown_by_shard)
            found.novel_terms = reported_everywhere(found.novel_by_shard)
        if found.dense_hits:
            found.lists[DENSE] = self._dense_list()

    def _settle(self, job: Job, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, DownstreamError):
            raise exc
        found = self.found
        if isinstance(exc, DownstreamError) and collection_missing(exc) and job.stage != EMBEDDER:
            # The collection has no data there (a shard may hold none of a small collection).
            found.missing += 1
            result: Any = [[] for _ in range(job.count)] if job.kind == "shard" else []
            found.bm25_settled += job.kind == BM25
        elif isinstance(exc, DownstreamError):
            self.degradations.add_error(job.stage, exc, job.legs)
            return
        else:
            result = task.result()
            if job.stage != EMBEDDER:
                found.answered += 1
            found.bm25_settled += job.kind == BM25
        if job.kind == "embed":
            self._start_shards(job.first, result)
        elif job.kind == "shard":
            for offset, hits in enumerate(result):
                found.dense_hits.setdefault(job.first + offset, []).append(hits)
        else:
            found.sparse_hits.setdefault(job.kind, []).append(result)

    def _dense_list(self) -> list[Hit]:
        found, pool = self.found, self.legs.pool
        per_text = [merge_by_score(answers, pool) for _, answers in sorted(found.dense_hits.items())]
        return combine_variations(
            [*per_text, *found.extra_dense], self.legs.params.rrf_k, pool, self.combine_mode
        )

    async def add_dense_text(self, text: str) -> None:
        """Search one more text on the dense leg (every shard) and fold its hits into the
        dense list; raises DownstreamError when the embedder or every shard fails."""
        self.found.extra_dense.append(await self.legs.search_text(text))
        self.found.lists[DENSE] = self._dense_list()


@dataclass
class Retrieved:
    """What one search's retrieval found, as fusion, hydration and the outcome read it."""

    # The request as the plan searched it: its query is the plan's searched query (a
    # follow-up's standalone rewrite), which the reranker and the answer use too.
    params: SearchParams
    plan: planner_pb2.Plan
    # The legs' lists, the texts they sent, the query's unknown words.
    found: Found
    # Stage -> milliseconds: the planner, each leg's calls, HyDE.
    timings: dict[str, float]
    # The best cosine any searched text found on the dense leg (None: it found nothing), and
    # the model that embedded the query: the evidence gate's topicality input.
    similarity: float | None
    embedder_model: str


class Retrieval:
    """One search's retrieval: the plan (awaited alongside the legs that need none), the
    planned legs, the verdict when none answered, and the supplementary HyDE pass."""

    def __init__(
        self,
        settings: GatewaySettings,
        backends: Backends,
        degradations: Degradations,
        *,
        deadline: float,
        largest_pool: int,
        texts_wanted: int,
        started: float,
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.degradations = degradations
        self.deadline = deadline
        # Calls made before the plan ask for the largest pool any plan could ask for.
        self.largest_pool = largest_pool
        self.texts_wanted = texts_wanted
        # The planner's time counts from the search's start: a local plan is made before this.
        self.started = started

    def _pool(self, params: SearchParams, plan_pool: int) -> int:
        return min(max(params.pool_size or plan_pool, params.top_k), self.settings.gateway_max_pool_size)

    async def retrieve(self, params: SearchParams, planned: Planned) -> Retrieved:
        legs = Legs(
            self.backends, params, self._pool(params, self.largest_pool), self.deadline, self.texts_wanted
        )
        fanout = Fanout(legs, self.degradations, self.settings.gateway_dense_combine)
        timings: dict[str, float] = {}
        try:
            plan = await self._plan(params, fanout, planned)
            timings["planner"] = ms(time.perf_counter() - self.started)
            # From here on every leg, the reranker and HyDE work on the query the plan searches (a
            # follow-up's standalone rewrite); the outcome's plan says which it was.
            params = dataclasses.replace(params, query=plan.searched_query)
            dense_texts = [*plan.variations, *([plan.hyde_passage] if plan.hyde_passage.strip() else [])]
            fanout.start_planned(params, plan, dense_texts, self._pool(params, plan.pool_size))
            await fanout.collect()
        except BaseException:
            fanout.cancel()
            raise
        timings.update(fanout.calls.timings)
        self._raise_if_nothing_answered(params, fanout.found)
        if self._needs_supplement(params, plan, fanout.found):
            with metrics.timed(timings, "hyde"):
                await self._supplement_with_hyde(params, plan, fanout)
        found = fanout.found
        return Retrieved(params, plan, found, timings, found.best_dense_score(), legs.embedder_model)

    @staticmethod
    async def _plan(params: SearchParams, fanout: Fanout, planned: Planned) -> planner_pb2.Plan:
        """The plan; while the planner service makes it, BM25 and the question's own dense
        search already run (not for a conversation: its question means little before the
        planner rewrites it), settled as they finish."""
        if isinstance(planned, planner_pb2.Plan):
            return planned
        if not params.history:
            fanout.start_early()
        planning = asyncio.create_task(planned)
        try:
            await fanout.calls.run_until(planning)
        finally:
            if not planning.done():
                planning.cancel()
        return planning.result()

    def _raise_if_nothing_answered(self, params: SearchParams, found: Found) -> None:
        """NOT_FOUND when no leg holds the collection; DEADLINE_EXCEEDED or UNAVAILABLE when
        every leg failed (each failure counted first: the search ends here)."""
        reported = self.degradations.as_list()
        leg_failures = [d for d in reported if d.legs and d.stage != PLANNER]
        if found.answered == 0 and found.missing > 0 and not leg_failures:
            raise not_found(f"collection {params.collection!r} does not exist")
        if not found.failed_everywhere():
            return
        for item in reported:
            metrics.DEGRADATIONS.labels(item.stage, item.reason).inc()
        detail = "; ".join(f"{d.stage} {d.reason}: {d.message}" for d in reported)
        if all(d.reason == DEADLINE for d in leg_failures):
            raise deadline_exceeded(f"no retrieval leg answered within the deadline ({detail})")
        raise unavailable(f"every retrieval leg failed ({detail})")

    def _needs_supplement(self, params: SearchParams, plan: planner_pb2.Plan, found: Found) -> bool:
        """Supplement HyDE: only when the plain search came back weak, by the best dense
        cosine or by how few results the legs found together."""
        if plan.hyde_mode != planner_pb2.HYDE_MODE_SUPPLEMENT or not params.enabled(DENSE):
            return False
        best = found.best_dense_score()
        count = len({hit.chunk_id for hits in found.lists.values() for hit in hits})
        weak_score = best is None or best < self.settings.calibration.hyde_min_score
        return weak_score or count < self.settings.gateway_hyde_min_results

    async def _supplement_with_hyde(
        self, params: SearchParams, plan: planner_pb2.Plan, fanout: Fanout
    ) -> None:
        """Ask the planner for a hypothetical answer passage and search with it too; a failure
        leaves the plain search's results, with a degradation."""
        planner = self.backends.planner
        try:
            reply = await planner.call(
                planner.stub.Hyde,
                planner_pb2.HydeRequest(query=params.query),
                timeout=fanout.legs.left(),
                # Not retried: a failed generation would only be slow again within the same budget.
                idempotent=False,
            )
            if reply.passage.strip():
                await fanout.add_dense_text(reply.passage)
        except DownstreamError as exc:
            self.degradations.add_error(HYDE, exc, [DENSE])
            return
        plan.hyde_passage = reply.passage
