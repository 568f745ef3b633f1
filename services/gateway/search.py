"""One search, stage by stage: the plan, the retrieval legs (fanout.py: every leg in parallel
under the caller's deadline, those that need no plan while the planner service plans), weighted
RRF (fusion.py), hydration of the winners (hydration.py), the reranker (rerank.py). Each stage
is called once, in that order, and hands what it found to the next.

Every downstream call goes through ``meshkit.rpc.client.Downstream`` (backends.py: deadline,
retries for idempotent calls, a breaker per downstream). A stage that fails or is late is
reported as a degradation (degradations.py); the answer comes from the others.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from meshkit.core.errors import deadline_exceeded
from meshkit.rpc.client import Downstream, DownstreamError
from meshkit.rpc.interceptors import deadline_var
from meshkit.settings import GatewaySettings
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.planner.v1 import planner_pb2, planner_pb2_grpc
from ragmesh.sparse.v1 import sparse_pb2
from services.gateway import metrics
from services.gateway.backends import Backends
from services.gateway.degradations import ERROR, PLANNER, REASON_OF, Degradation, Degradations
from services.gateway.fanout import Planned, Retrieval, Retrieved
from services.gateway.fusion import Fused, Hit, fuse
from services.gateway.hydration import Hydrator
from services.gateway.legacy import current_first, path_segments
from services.gateway.metrics import ms
from services.gateway.planning import LocalPlanner, local_planner
from services.gateway.rerank import candidate_count, rerank_top
from services.gateway.validation import EXACT, SearchParams

# The planner's name for each role of a conversation turn.
TURN_ROLE = {
    narrator_pb2.ROLE_USER: planner_pb2.TURN_ROLE_USER,
    narrator_pb2.ROLE_ASSISTANT: planner_pb2.TURN_ROLE_ASSISTANT,
}
# Pool sizes of the fallback plan: the planner's seeds.
PRECISE_POOL = 50
FALLBACK_POOL = {planner_pb2.STRATEGY_PRECISE: PRECISE_POOL, planner_pb2.STRATEGY_EXHAUSTIVE: 80}
# The calls made before the plan ask for the largest pool a plan could ask for.
LARGEST_POOL = max(FALLBACK_POOL.values())
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


class Deadlines:
    """When the parts of a search must be done, from the caller's deadline (without one, from
    the client timeout)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings

    def legs(self, reranking: bool) -> float:
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

    def reply(self) -> float:
        """When the last downstream call must be back, leaving time to send the reply."""
        inbound = deadline_var.get()
        if inbound is None:
            return time.monotonic() + self.settings.client_timeout_s
        return inbound - REPLY_MARGIN_S


class Planning:
    """Where a search's plan comes from: the planner of this process when it serves the
    request, else the planner service (the question alone when it fails). Either plan is made
    usable within the gateway's limits, and returned as used, so callers see what ran."""

    def __init__(
        self,
        settings: GatewaySettings,
        planner: Downstream[planner_pb2_grpc.PlannerServiceStub],
        local: LocalPlanner | None,
    ) -> None:
        self.settings = settings
        self.planner = planner
        # None: every plan comes from the planner service.
        self.local = local

    def plan_for(self, params: SearchParams, deadline: float, degradations: Degradations) -> Planned:
        """The plan, made at once when the local planner serves the request; else the planner
        service's reply still to come, which the retrieval awaits while the legs that need no
        plan run."""
        local = self.local
        if local is not None and local.serves(params.hyde_mode):
            plan = local.plan(params.query, params.strategy, params.max_variations, params.history)
            return self.usable(plan, params)
        return self._from_service(params, deadline, degradations)

    async def _from_service(
        self, params: SearchParams, deadline: float, degradations: Degradations
    ) -> planner_pb2.Plan:
        planner = self.planner
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
            return self.fallback(params)
        if reply.fallback_reason:
            # The planner's LLM failed and it planned deterministically: the search runs, but the
            # caller should know the plan is the simpler one.
            reason = REASON_OF.get(reply.fallback_reason, ERROR)
            degradations.add(PLANNER, reason, planner.target, f"llm planner: {reply.fallback_message}")
        return self.usable(reply.plan, params)

    @staticmethod
    def fallback(params: SearchParams) -> planner_pb2.Plan:
        strategy = params.strategy or planner_pb2.STRATEGY_PRECISE
        return planner_pb2.Plan(
            strategy=strategy,
            pool_size=FALLBACK_POOL[strategy],
            variations=[params.query],
            hyde_mode=planner_pb2.HYDE_MODE_OFF,
            planner="fallback",
            searched_query=params.query,
        )

    def usable(self, plan: planner_pb2.Plan, params: SearchParams) -> planner_pb2.Plan:
        """The plan as the legs will use it: the searched query first, no blanks or repeats,
        within the gateway's limits."""
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


@dataclass
class Ranked:
    """The fused list as the later stages take it."""

    # What is hydrated: the first top_k, or as many as are reranked when that is more.
    top: list[Fused]
    # The fused first top_k, reported beside a reranked order (empty when not reranking).
    fused_top: list[Fused]
    # How many of ``top`` go to the reranker (0: none).
    to_rerank: int


class Searcher:
    """Runs one search's stages in order: plan, retrieve, fuse, hydrate, rerank."""

    def __init__(
        self, settings: GatewaySettings, backends: Backends, planner: LocalPlanner | None = None
    ) -> None:
        self.settings = settings
        self.backends = backends
        self.deadlines = Deadlines(settings)
        self.planning = Planning(settings, backends.planner, planner)
        self.hydrator = Hydrator(backends, settings.gateway_hydrate_sparse_share)
        self.legacy_segments = path_segments(settings.gateway_legacy_path_segments)

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> Searcher:
        return cls(settings, Backends.from_settings(settings), local_planner(settings))

    async def search(self, params: SearchParams) -> SearchOutcome:
        started = time.perf_counter()
        reranking = params.rerank and self.backends.reranker is not None
        deadline = self.deadlines.legs(reranking)
        degradations = Degradations()
        texts_wanted = self._texts_wanted(params, reranking)
        planned = self.planning.plan_for(params, deadline, degradations)
        retrieval = Retrieval(
            self.settings,
            self.backends,
            degradations,
            deadline=deadline,
            largest_pool=LARGEST_POOL,
            texts_wanted=texts_wanted,
            started=started,
        )
        retrieved = await retrieval.retrieve(params, planned)
        # The request as the plan searched it (a follow-up's standalone rewrite) from here on.
        params, timings = retrieved.params, retrieved.timings
        with metrics.timed(timings, "fuse"):
            ranked = self._ranked(params, retrieved, reranking)
        with metrics.timed(timings, "hydrate"):
            top, chunks = await self.hydrator.hydrate(
                params.collection, ranked.top, degradations, retrieved.found.texts, self.deadlines.reply()
            )
        reranked = False
        if ranked.to_rerank and top and not _off_topic(retrieved):
            with metrics.timed(timings, "rerank"):
                top, reranked = await self._rerank(params, top, ranked.to_rerank, chunks, degradations)
        timings["total"] = ms(time.perf_counter() - started)
        return SearchOutcome(
            # Within the page answered: a legacy result gives way to the current ones shown with
            # it, not to candidates ranked below the page.
            results=current_first(top[: params.top_k], chunks, self.legacy_segments),
            chunks=chunks,
            plan=retrieved.plan,
            degradations=_reported(timings, degradations),
            timings=timings,
            leg_lists=retrieved.found.lists,
            reranked=reranked,
            fused=ranked.fused_top,
            unknown_terms=retrieved.found.unknown_terms,
            similarity=retrieved.similarity,
            embedder_model=retrieved.embedder_model,
            novel_terms=retrieved.found.novel_terms,
        )

    def _ranked(self, params: SearchParams, retrieved: Retrieved, reranking: bool) -> Ranked:
        fused = fuse(retrieved.found.lists, params.weights, params.rrf_k, params.collapse_documents)
        to_rerank = (
            candidate_count(self.settings, params.rerank_candidates, retrieved.plan.strategy)
            if reranking
            else 0
        )
        return Ranked(
            fused[: max(params.top_k, to_rerank)], fused[: params.top_k] if to_rerank else [], to_rerank
        )

    async def _rerank(
        self,
        params: SearchParams,
        top: list[Fused],
        count: int,
        chunks: dict[str, sparse_pb2.ChunkText],
        degradations: Degradations,
    ) -> tuple[list[Fused], bool]:
        reranker = self.backends.reranker
        assert reranker is not None
        return await rerank_top(
            reranker,
            params,
            top,
            count,
            chunks,
            degradations,
            deadline=self.deadlines.reply(),
            fused_weight=self.settings.calibration.rerank_fused_weight,
        )

    def _texts_wanted(self, params: SearchParams, reranking: bool) -> int:
        """How many of each leg's first hits should come with their text: what a precise plan
        shows and reranks (an exhaustive plan's further candidates are hydrated)."""
        if not reranking:
            return params.top_k
        precise = planner_pb2.STRATEGY_PRECISE
        return max(params.top_k, candidate_count(self.settings, params.rerank_candidates, precise))


def _off_topic(retrieved: Retrieved) -> bool:
    """An Ask's question that its gate will refuse as off topic: reranking its passages would
    be time spent on an answer that is not given."""
    floor = retrieved.params.skip_rerank_off_topic
    return floor is not None and floor.refuses(retrieved.similarity, retrieved.embedder_model)


def _reported(timings: dict[str, float], degradations: Degradations) -> list[Degradation]:
    """The search's degradations, once every stage's time and each degradation is counted."""
    for stage, stage_ms in timings.items():
        if stage != "total":
            metrics.STAGE_SECONDS.labels(stage).observe(stage_ms / 1000)
    found = degradations.as_list()
    for item in found:
        metrics.DEGRADATIONS.labels(item.stage, item.reason).inc()
    return found
