"""gRPC face of the gateway: validates the request, runs the search (Search) or the ask (Ask,
AskStream: the answer wing, services.gateway.answer) and turns the outcome into the public
response. The one module that wires both wings."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from grpc import aio

from meshkit.core.errors import unavailable
from meshkit.rpc.auth import READ, Rule
from meshkit.rpc.server import ServiceSpec
from meshkit.settings import GatewaySettings
from ragmesh.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from ragmesh.narrator.v1 import narrator_pb2
from services.gateway import metrics
from services.gateway.answer.ask import Asker, AskOutcome, AskParams, Delta, Done, Progress
from services.gateway.answer.extract import EXTRACTOR
from services.gateway.answer.narrate import NARRATOR
from services.gateway.answer.text import preview
from services.gateway.collections import CollectionResolver
from services.gateway.degradations import (
    BREAKER_OPEN,
    DEADLINE,
    DEGENERATE_OUTPUT,
    EMBEDDER,
    ERROR,
    HYDE,
    INDEX,
    INDEX_PAYLOAD,
    INVALID_OUTPUT,
    PLANNER,
    SPARSE,
    UNAVAILABLE,
    Degradation,
)
from services.gateway.fusion import Fused, Hit, ordering_scores
from services.gateway.rerank import RERANKER
from services.gateway.search import Searcher, SearchOutcome
from services.gateway.validation import BM25, DENSE, EXACT, SearchParams, validate_ask, validate_search

LEG_PB = {DENSE: gateway_pb2.LEG_DENSE, BM25: gateway_pb2.LEG_BM25, EXACT: gateway_pb2.LEG_EXACT}
STAGE_PB = {
    PLANNER: gateway_pb2.STAGE_PLANNER,
    RERANKER: gateway_pb2.STAGE_RERANKER,
    EMBEDDER: gateway_pb2.STAGE_EMBEDDER,
    INDEX: gateway_pb2.STAGE_INDEX,
    SPARSE: gateway_pb2.STAGE_SPARSE,
    HYDE: gateway_pb2.STAGE_HYDE,
    EXTRACTOR: gateway_pb2.STAGE_EXTRACTOR,
    NARRATOR: gateway_pb2.STAGE_NARRATOR,
}
REASON_PB = {
    UNAVAILABLE: gateway_pb2.DEGRADATION_REASON_UNAVAILABLE,
    DEADLINE: gateway_pb2.DEGRADATION_REASON_DEADLINE,
    BREAKER_OPEN: gateway_pb2.DEGRADATION_REASON_BREAKER_OPEN,
    ERROR: gateway_pb2.DEGRADATION_REASON_ERROR,
    INVALID_OUTPUT: gateway_pb2.DEGRADATION_REASON_INVALID_OUTPUT,
    DEGENERATE_OUTPUT: gateway_pb2.DEGRADATION_REASON_DEGENERATE_OUTPUT,
}
FALLBACK_PB = {INDEX_PAYLOAD: gateway_pb2.FALLBACK_INDEX_PAYLOAD}
# Legs in the order responses list them.
LEG_ORDER = (DENSE, BM25, EXACT)
# What an API key needs for each method (meshkit.rpc.auth): every call reads one collection.
ACCESS = {
    "Search": Rule(READ, lambda request: request.collection),
    "Ask": Rule(READ, lambda request: request.collection),
    "AskStream": Rule(READ, lambda request: request.request.collection),
}


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.searcher: Searcher | None = None
        self.asker: Asker | None = None
        self.collections = CollectionResolver(settings)

    async def start(self) -> None:
        # Channels belong to the serving event loop, so they are made here, not in __init__.
        self.searcher = Searcher.from_settings(self.settings)
        self.asker = Asker.from_settings(self.settings, self.searcher)
        await self.collections.start()

    async def stop(self) -> None:
        if self.searcher is not None:
            await self.searcher.backends.close()
        if self.asker is not None:
            await self.asker.close()
        await self.collections.close()

    async def Search(
        self, request: gateway_pb2.SearchRequest, context: aio.ServicerContext
    ) -> gateway_pb2.SearchResponse:
        if self.searcher is None:
            raise unavailable("the gateway is starting")
        params = await self.collections.resolve(validate_search(request, self.settings))
        started = time.perf_counter()
        try:
            outcome = await self.searcher.search(params)
        except Exception:
            metrics.SEARCH_SECONDS.labels("failed").observe(time.perf_counter() - started)
            raise
        label = "degraded" if outcome.degradations else "whole"
        metrics.SEARCH_SECONDS.labels(label).observe(time.perf_counter() - started)
        return to_response(outcome, params)

    async def Ask(
        self, request: gateway_pb2.AskRequest, context: aio.ServicerContext
    ) -> gateway_pb2.AskResponse:
        async for event in self._ask(request):
            if isinstance(event, gateway_pb2.AskResponse):
                return event
        raise AssertionError("an ask always ends with its answer")  # pragma: no cover

    async def AskStream(
        self, request: gateway_pb2.AskStreamRequest, context: aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.AskStreamResponse]:
        async for event in self._ask(request.request):
            if isinstance(event, gateway_pb2.AskResponse):
                yield gateway_pb2.AskStreamResponse(answer=event)
            elif isinstance(event, gateway_pb2.AskProgress):
                yield gateway_pb2.AskStreamResponse(progress=event)
            else:
                yield gateway_pb2.AskStreamResponse(delta=event)

    async def _ask(
        self, request: gateway_pb2.AskRequest
    ) -> AsyncIterator[gateway_pb2.AskResponse | gateway_pb2.AskProgress | str]:
        if self.asker is None:
            raise unavailable("the gateway is starting")
        search, passages, mode = validate_ask(request, self.settings)
        search = await self.collections.resolve(search)
        params = AskParams(search, passages, mode, list(request.history), request.include_facts)
        started = time.perf_counter()
        try:
            async for event in self.asker.run(params):
                if isinstance(event, Progress):
                    yield gateway_pb2.AskProgress(stage=event.stage, ms=event.ms, count=event.count)
                elif isinstance(event, Delta):
                    yield event.text
                elif isinstance(event, Done):
                    label = "degraded" if event.outcome.degradations else "whole"
                    metrics.ASK_SECONDS.labels(label).observe(time.perf_counter() - started)
                    yield to_ask_response(event.outcome, params)
        except Exception:
            metrics.ASK_SECONDS.labels("failed").observe(time.perf_counter() - started)
            raise


def to_ask_response(outcome: AskOutcome, params: AskParams) -> gateway_pb2.AskResponse:
    answer = outcome.answer
    evidence = outcome.evidence
    cited = {c.number for c in answer.citations}
    response = gateway_pb2.AskResponse(
        answer=answer.text,
        answered=answer.answered,
        sentences=answer.sentences,
        contradictions=answer.contradictions,
        degradations=[_degradation_pb(d) for d in outcome.degradations],
        timings=[gateway_pb2.StageTiming(stage=stage, ms=ms) for stage, ms in outcome.timings.items()],
        plan=outcome.search.plan,
        mode=gateway_pb2.ANSWER_MODE_LLM
        if answer.mode == narrator_pb2.NARRATION_MODE_LLM
        else gateway_pb2.ANSWER_MODE_EXTRACTIVE,
        searched_query=outcome.search.plan.searched_query,
        unknown_terms=outcome.search.unknown_terms,
        novel_terms=outcome.search.novel_terms,
    )
    for citation in answer.citations:
        chunk = evidence[citation.number - 1].chunk
        response.citations.append(
            gateway_pb2.AnswerCitation(
                number=citation.number,
                doc_id=chunk.doc_id,
                chunk_id=chunk.chunk_id,
                title=chunk.title,
                snippet=citation.snippet,
                location=chunk.location,
                source_uri=chunk.source_uri,
                metadata=chunk.metadata,
            )
        )
    for number, item in enumerate(evidence, 1):
        response.sources.append(
            gateway_pb2.ExploredSource(
                chunk_id=item.chunk.chunk_id,
                doc_id=item.chunk.doc_id,
                title=item.chunk.title,
                preview=preview(item.chunk.text),
                rerank_score=item.result.rerank_score,
                cited=number in cited,
            )
        )
    if params.include_facts:
        response.facts.extend(outcome.facts)
    return response


def _result_pb(item: Fused, outcome: SearchOutcome, score: float) -> gateway_pb2.SearchResult:
    result = gateway_pb2.SearchResult(
        chunk_id=item.chunk_id,
        doc_id=item.doc_id,
        score=score,
        fused_score=item.score,
        fused_rank=item.fused_rank,
        rerank_score=item.rerank_score,
    )
    chunk = outcome.chunks.get(item.chunk_id)
    if chunk is not None:
        result.title = chunk.title
        result.text = chunk.text
        result.location.CopyFrom(chunk.location)
        result.source_uri = chunk.source_uri
        result.metadata.update(chunk.metadata)
    for rank in sorted(item.ranks, key=lambda r: LEG_ORDER.index(r.leg)):
        result.leg_ranks.append(gateway_pb2.LegRank(leg=LEG_PB[rank.leg], rank=rank.rank, score=rank.score))
    return result


def _degradation_pb(item: Degradation) -> gateway_pb2.Degradation:
    return gateway_pb2.Degradation(
        stage=STAGE_PB[item.stage],
        reason=REASON_PB[item.reason],
        message=item.message,
        legs=[LEG_PB[leg] for leg in item.legs],
        fallback=FALLBACK_PB.get(item.fallback, gateway_pb2.FALLBACK_UNSPECIFIED),
    )


def _leg_result_pb(leg: str, hits: list[Hit]) -> gateway_pb2.LegResult:
    return gateway_pb2.LegResult(
        leg=LEG_PB[leg],
        hits=[gateway_pb2.LegHit(chunk_id=h.chunk_id, doc_id=h.doc_id, score=h.score) for h in hits],
    )


def to_response(outcome: SearchOutcome, params: SearchParams) -> gateway_pb2.SearchResponse:
    response = gateway_pb2.SearchResponse(
        results=[
            _result_pb(item, outcome, score)
            for item, score in zip(outcome.results, ordering_scores(outcome.results), strict=True)
        ],
        plan=outcome.plan,
        degradations=[_degradation_pb(d) for d in outcome.degradations],
        timings=[gateway_pb2.StageTiming(stage=stage, ms=ms) for stage, ms in outcome.timings.items()],
        reranked=outcome.reranked,
        searched_query=outcome.plan.searched_query,
        unknown_terms=outcome.unknown_terms,
        novel_terms=outcome.novel_terms,
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
    # A calibration file that cannot be used stops the start, with the reason, not a later Ask.
    settings.calibration  # noqa: B018
    servicer = GatewayServicer(settings)
    return ServiceSpec(
        name="gateway",
        grpc_services=[gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name],
        register=lambda server: gateway_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server),
        on_start=[servicer.start],
        on_stop=[servicer.stop],
        multiprocess_safe=True,
        access=ACCESS,
        max_request_bytes=settings.gateway_max_request_bytes,
    )
