"""One search: plan, fan out to every retrieval leg in parallel under the caller's deadline
(fanout.py), fuse with weighted RRF, hydrate the winners (hydration.py), rerank them.

Every downstream call goes through ``meshkit.rpc.client.Downstream`` (backends.py: deadline,
retries for idempotent calls, a breaker per downstream). A stage that fails or is late is
reported as a degradation (degradations.py); the answer comes from the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field

from meshkit.core.errors import deadline_exceeded, not_found, unavailable
from meshkit.rpc.client import DownstreamError
from meshkit.rpc.interceptors import deadline_var
from meshkit.settings import GatewaySettings
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.planner.v1 import planner_pb2
from ragmesh.sparse.v1 import sparse_pb2
from services.gateway import metrics
from services.gateway.backends import Backends
from services.gateway.degradations import DEADLINE, ERROR, HYDE, PLANNER, REASON_OF, Degradation, Degradations
from services.gateway.fanout import Fanout
from services.gateway.fusion import Fused, Hit, collapse_documents, rrf
from services.gateway.hydration import Hydrator
from services.gateway.metrics import ms
from services.gateway.planning import LocalPlanner, local_planner
from services.gateway.rerank import RERANKER, candidate_count, rerank
from services.gateway.validation import DENSE, EXACT, SearchParams

log = logging.getLogger("gateway.search")

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
    # The best cosine any searched text of the question found on the dense leg (None: the leg
    # did not answer), and the model that embedded it: the evidence gate's topicality input.
    similarity: float | None = None
    embedder_model: str = ""
    # The unknown_terms no indexed word is one edit from: not misspellings (see sparse's
    # SearchBm25Response.novel_terms).
    novel_terms: list[str] = field(default_factory=list)


class Searcher:
    def __init__(
        self, settings: GatewaySettings, backends: Backends, planner: LocalPlanner | None = None
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.hydrator = Hydrator(backends, settings.gateway_hydrate_sparse_share)
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
            timings["planner"] = ms(time.perf_counter() - started)
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
            timings["hyde"] = ms(time.perf_counter() - hyde_started)

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
        timings["fuse"] = ms(time.perf_counter() - fuse_started)

        hydrate_started = time.perf_counter()
        top, chunks = await self.hydrator.hydrate(
            params.collection, top, degradations, fanout.texts, self._reply_deadline()
        )
        timings["hydrate"] = ms(time.perf_counter() - hydrate_started)
        reranked = False
        if to_rerank and top and not self._off_topic(params, fanout):
            rerank_started = time.perf_counter()
            top, reranked = await self._rerank(params, top, to_rerank, chunks, degradations)
            timings["rerank"] = ms(time.perf_counter() - rerank_started)
        top = top[: params.top_k]
        timings["total"] = ms(time.perf_counter() - started)
        for stage, stage_ms in timings.items():
            if stage != "total":
                metrics.STAGE_SECONDS.labels(stage).observe(stage_ms / 1000)
        found = degradations.as_list()
        for item in found:
            metrics.DEGRADATIONS.labels(item.stage, item.reason).inc()
        return SearchOutcome(
            top,
            chunks,
            plan,
            found,
            timings,
            fanout.lists,
            reranked,
            fused_top,
            fanout.unknown_terms,
            fanout.best_dense_score(),
            fanout.embedder_model,
            fanout.novel_terms,
        )

    @staticmethod
    def _off_topic(params: SearchParams, fanout: Fanout) -> bool:
        floor = params.skip_rerank_off_topic
        return floor is not None and floor.refuses(fanout.best_dense_score(), fanout.embedder_model)

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
