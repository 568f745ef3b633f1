"""The second stage: the fused candidates, hydrated with their text, reordered by the reranker.

Reranking is optional by design: a reranker that is down, refuses, or does not answer within what
is left of the caller's deadline leaves the fused order and a ``reranker`` degradation; the search
still answers. Passages that pass the reranker's threshold come first, in the blend of the
reranker's and the fused order; those under it follow in fused order, unscored. When none passes,
the reranker returns them all in fused order (its fallback) and so does the gateway.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from meshkit.rpc.client import Downstream, DownstreamError
from meshkit.settings import GatewaySettings
from ragmesh.planner.v1 import planner_pb2
from ragmesh.reranker.v1 import reranker_pb2, reranker_pb2_grpc
from ragmesh.sparse.v1 import sparse_pb2
from services.gateway.degradations import ERROR, Degradations
from services.gateway.fusion import Fused, blend_reranked
from services.gateway.validation import SearchParams

RERANKER = "reranker"


@dataclass
class Reranked:
    results: list[Fused]
    # The reranker judged the results (those passing carry their scores), in its order or, when
    # it found the fused first as good as its best, in fused order. False: fused order, unjudged
    # (reranking off, failed, or no passage passed the threshold).
    reranked: bool


def candidate_count(settings: GatewaySettings, requested: int, strategy: int) -> int:
    """Candidates to rerank: the caller's number, else the seeds' per-strategy default."""
    if requested:
        return requested
    if strategy == planner_pb2.STRATEGY_EXHAUSTIVE:
        return settings.gateway_rerank_candidates_exhaustive
    return settings.gateway_rerank_candidates_precise


async def rerank_top(
    reranker: Downstream[reranker_pb2_grpc.RerankerServiceStub],
    params: SearchParams,
    top: list[Fused],
    count: int,
    chunks: dict[str, sparse_pb2.ChunkText],
    degradations: Degradations,
    *,
    deadline: float,
    fused_weight: float,
) -> tuple[list[Fused], bool]:
    """The rerank stage of a search: the first ``count`` results of ``top`` reordered by the
    reranker, the rest after them in fused order, and whether the reranker judged them. On any
    reranker failure ``top`` stays as it was, unscored, with a degradation: the search still
    answers in fused order."""
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
            deadline=deadline,
            fused_weight=fused_weight,
            rrf_k=params.rrf_k,
            keep_fused_margin=params.keep_fused_margin,
        )
    except DownstreamError as exc:
        degradations.add_error(RERANKER, exc)
        for item in candidates:
            item.rerank_score = None
        return top, False
    return [*outcome.results, *rest], outcome.reranked


def _request(
    query: str, candidates: Sequence[Fused], chunks: dict[str, sparse_pb2.ChunkText]
) -> reranker_pb2.RerankRequest:
    # On a fallback the gateway keeps every candidate in fused order, so it asks for all of them
    # back (the reranker's own default returns only the first 20).
    return reranker_pb2.RerankRequest(
        query=query,
        fallback_count=len(candidates),
        passages=[
            reranker_pb2.Passage(id=item.chunk_id, text=chunks[item.chunk_id].text) for item in candidates
        ],
    )


async def rerank(
    reranker: Downstream[reranker_pb2_grpc.RerankerServiceStub],
    query: str,
    candidates: list[Fused],
    chunks: dict[str, sparse_pb2.ChunkText],
    *,
    deadline: float,
    fused_weight: float,
    rrf_k: float,
    keep_fused_margin: float = 0.0,
) -> Reranked:
    """Rerank ``candidates`` (all hydrated). Raises DownstreamError when the reranker fails.
    Every candidate that passes keeps its score; the order is the fused one when the reranker
    finds the fused first candidate within ``keep_fused_margin`` of its best."""
    request = _request(query, candidates, chunks)
    reply = await reranker.call(
        reranker.stub.Rerank, request, timeout=deadline - time.monotonic(), idempotent=True
    )
    by_id = {item.chunk_id: item for item in candidates}
    ordered = []
    for result in reply.results:
        item = by_id.get(result.id)
        if item is None:
            raise DownstreamError(
                reranker.target, "error", None, f"unknown passage id {result.id!r} in the reply"
            )
        item.rerank_score = result.score
        ordered.append(item)
    return final_order(
        candidates,
        ordered,
        reply.fallback,
        fused_weight=fused_weight,
        rrf_k=rrf_k,
        keep_fused_margin=keep_fused_margin,
    )


def final_order(
    candidates: Sequence[Fused],
    scored: list[Fused],
    fallback: bool,
    *,
    fused_weight: float,
    rrf_k: float,
    keep_fused_margin: float,
) -> Reranked:
    """The order a search answers with, from the reranker's reply: ``scored`` are the passing
    candidates best first (their ``rerank_score`` set), or on a ``fallback`` every candidate in
    fused order. Pure, so the offline benchmarks apply exactly these rules."""
    if fallback:
        return Reranked(scored, reranked=False)
    if _fused_first_holds(candidates[0], scored, keep_fused_margin):
        # Judged, and the judgement is that fusion had it right.
        return Reranked(list(candidates), reranked=True)
    # Candidates under the threshold are not dropped but placed after those that pass, in fused
    # order: a search still answers top_k results (dropping them cost 0.05 Recall@100 on SciFact).
    passed = {item.chunk_id for item in scored}
    failed = [item for item in candidates if item.chunk_id not in passed]
    return Reranked([*blend_reranked(scored, fused_weight, rrf_k), *failed], reranked=True)


def _fused_first_holds(first: Fused, scored: Sequence[Fused], margin: float) -> bool:
    """The reranker does not clearly disagree with retrieval's first pick: it scored it within
    ``margin`` log-odds of its best. Out of the reranker's training domain its confident
    reorderings help and its near ties mostly shuffle what fusion had right (grpc-docs)."""
    if margin <= 0 or first.rerank_score is None or not scored:
        return False
    best = max(item.rerank_score for item in scored if item.rerank_score is not None)
    return best - first.rerank_score <= margin
