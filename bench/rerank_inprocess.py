"""The gateway's second stage run in this process for the reranker benchmarks: the fused
candidates fetched once from a gateway (rerank off), scored by a model, then ordered with the
reranker's selection and the gateway's own final order (``services.gateway.rerank``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from meshkit.settings import GatewaySettings, RerankerSettings
from ragmesh.gateway.v1 import gateway_pb2
from ragmesh_client import AsyncClient
from services.gateway.fusion import Fused
from services.gateway.rerank import final_order
from services.reranker.model import CrossEncoderModel
from services.reranker.selection import select

# Read once: the in-process second stage runs per query, and settings parse the environment.
RERANKER_DEFAULTS = RerankerSettings()
GATEWAY_DEFAULTS = GatewaySettings()


async def fused_candidates(
    address: str, collection: str, queries: dict[str, str], depth: int
) -> dict[str, list[gateway_pb2.SearchResult]]:
    """Each query's fused results (rerank off) as the gateway's messages, which the benchmarks
    cache as they are."""
    out: dict[str, list[gateway_pb2.SearchResult]] = {}
    async with AsyncClient(address) as client:
        for qid, text in queries.items():
            found = await client.search(
                collection, text, top_k=depth, collapse_documents=True, rerank=False, timeout=60
            )
            out[qid] = list(found.raw.results)
    return out


def rerank_scores(
    model: CrossEncoderModel, query: str, results: Sequence[gateway_pb2.SearchResult], count: int
) -> tuple[list[float], float]:
    """The model's scores of the first ``count`` candidates, and the milliseconds they took."""
    started = time.perf_counter()
    scores, _ = model.score(query, [r.text for r in results[:count]])
    return scores.tolist(), (time.perf_counter() - started) * 1000


def reranked_order(
    results: Sequence[gateway_pb2.SearchResult],
    count: int,
    scores: Sequence[float],
    weight: float,
    keep_fused_margin: float = 0.0,
) -> list[str]:
    """The gateway's second stage on scored candidates: the reranker's threshold and fallback
    (``services.reranker.selection``) and the gateway's final order
    (``services.gateway.rerank.final_order``), then the candidates not reranked."""
    head = results[:count]
    chosen = select(scores, RERANKER_DEFAULTS.reranker_min_score, len(head), 0)
    items = [Fused(r.chunk_id, r.doc_id, r.fused_score, fused_rank=i + 1) for i, r in enumerate(head)]
    scored = [items[i] for i in chosen.order]
    if not chosen.fallback:
        for i in chosen.order:
            items[i].rerank_score = scores[i]
    final = final_order(
        items,
        scored,
        chosen.fallback,
        fused_weight=weight,
        rrf_k=GATEWAY_DEFAULTS.gateway_rrf_k,
        keep_fused_margin=keep_fused_margin,
    )
    return [f.doc_id for f in final.results] + [r.doc_id for r in results[count:]]


def rerank_run(
    model: CrossEncoderModel,
    query: str,
    results: Sequence[gateway_pb2.SearchResult],
    count: int,
    weight: float,
) -> tuple[list[str], float]:
    """The gateway's second stage in process: score, threshold/fallback, blend, then the rest."""
    scores, elapsed = rerank_scores(model, query, results, count)
    margin = GATEWAY_DEFAULTS.calibration.rerank_keep_fused_margin
    return reranked_order(results, count, scores, weight, margin), elapsed
