"""gRPC face of the gateway: validates the request, runs the search and turns the outcome
into the public SearchResponse."""

from __future__ import annotations

import time

from grpc import aio

from meshkit.errors import unavailable
from meshkit.server import ServiceSpec
from meshkit.settings import GatewaySettings
from ragmesh.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from services.gateway import metrics
from services.gateway.fusion import Fused, Hit
from services.gateway.rerank import RERANKER
from services.gateway.search import (
    BREAKER_OPEN,
    DEADLINE,
    EMBEDDER,
    ERROR,
    INDEX,
    PLANNER,
    SPARSE,
    UNAVAILABLE,
    Backends,
    Degradation,
    Searcher,
    SearchOutcome,
)
from services.gateway.validation import BM25, DENSE, EXACT, SearchParams, validate_search

LEG_PB = {DENSE: gateway_pb2.LEG_DENSE, BM25: gateway_pb2.LEG_BM25, EXACT: gateway_pb2.LEG_EXACT}
STAGE_PB = {
    PLANNER: gateway_pb2.STAGE_PLANNER,
    RERANKER: gateway_pb2.STAGE_RERANKER,
    EMBEDDER: gateway_pb2.STAGE_EMBEDDER,
    INDEX: gateway_pb2.STAGE_INDEX,
    SPARSE: gateway_pb2.STAGE_SPARSE,
}
REASON_PB = {
    UNAVAILABLE: gateway_pb2.DEGRADATION_REASON_UNAVAILABLE,
    DEADLINE: gateway_pb2.DEGRADATION_REASON_DEADLINE,
    BREAKER_OPEN: gateway_pb2.DEGRADATION_REASON_BREAKER_OPEN,
    ERROR: gateway_pb2.DEGRADATION_REASON_ERROR,
}
# Legs in the order responses list them.
LEG_ORDER = (DENSE, BM25, EXACT)


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.searcher: Searcher | None = None

    async def start(self) -> None:
        # Channels belong to the serving event loop, so they are made here, not in __init__.
        self.searcher = Searcher(self.settings, Backends.from_settings(self.settings))

    async def stop(self) -> None:
        if self.searcher is not None:
            await self.searcher.backends.close()

    async def Search(
        self, request: gateway_pb2.SearchRequest, context: aio.ServicerContext
    ) -> gateway_pb2.SearchResponse:
        if self.searcher is None:
            raise unavailable("the gateway is starting")
        params = validate_search(request, self.settings)
        started = time.perf_counter()
        try:
            outcome = await self.searcher.search(params)
        except Exception:
            metrics.SEARCH_SECONDS.labels("failed").observe(time.perf_counter() - started)
            raise
        label = "degraded" if outcome.degradations else "whole"
        metrics.SEARCH_SECONDS.labels(label).observe(time.perf_counter() - started)
        return to_response(outcome, params)


def _result_pb(item: Fused, outcome: SearchOutcome) -> gateway_pb2.SearchResult:
    result = gateway_pb2.SearchResult(
        chunk_id=item.chunk_id,
        doc_id=item.doc_id,
        fused_score=item.score,
        fused_rank=item.fused_rank,
        rerank_score=item.rerank_score,
    )
    chunk = outcome.chunks.get(item.chunk_id)
    if chunk is not None:
        result.title = chunk.title
        result.text = chunk.text
        result.location.CopyFrom(chunk.location)
    for rank in sorted(item.ranks, key=lambda r: LEG_ORDER.index(r.leg)):
        result.leg_ranks.append(gateway_pb2.LegRank(leg=LEG_PB[rank.leg], rank=rank.rank, score=rank.score))
    return result


def _degradation_pb(item: Degradation) -> gateway_pb2.Degradation:
    return gateway_pb2.Degradation(
        stage=STAGE_PB[item.stage],
        reason=REASON_PB[item.reason],
        message=item.message,
        legs=[LEG_PB[leg] for leg in item.legs],
    )


def _leg_result_pb(leg: str, hits: list[Hit]) -> gateway_pb2.LegResult:
    return gateway_pb2.LegResult(
        leg=LEG_PB[leg],
        hits=[gateway_pb2.LegHit(chunk_id=h.chunk_id, doc_id=h.doc_id, score=h.score) for h in hits],
    )


def to_response(outcome: SearchOutcome, params: SearchParams) -> gateway_pb2.SearchResponse:
    response = gateway_pb2.SearchResponse(
        results=[_result_pb(item, outcome) for item in outcome.results],
        plan=outcome.plan,
        degradations=[_degradation_pb(d) for d in outcome.degradations],
        timings=[gateway_pb2.StageTiming(stage=stage, ms=ms) for stage, ms in outcome.timings.items()],
        reranked=outcome.reranked,
    )
    if params.include_leg_results:
        response.leg_results.extend(
            _leg_result_pb(leg, outcome.leg_lists[leg]) for leg in LEG_ORDER if leg in outcome.leg_lists
        )
        response.fused_hits.extend(
            gateway_pb2.LegHit(chunk_id=f.chunk_id, doc_id=f.doc_id, score=f.score) for f in outcome.fused
        )
    return response


def build_spec(settings: GatewaySettings) -> ServiceSpec:
    servicer = GatewayServicer(settings)
    return ServiceSpec(
        name="gateway",
        grpc_services=[gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name],
        register=lambda server: gateway_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server),
        on_start=[servicer.start],
        on_stop=[servicer.stop],
    )
