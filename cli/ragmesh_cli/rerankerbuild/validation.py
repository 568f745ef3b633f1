"""Held-out numbers for the build: train claims the model never saw, ranked the way the gateway ranks
(RRF of the BM25 and dense legs, documents collapsed), then reranked."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ragmesh_cli import metrics
from ragmesh_cli.rerankerbuild.mining import Mined, Passage

# (queries, passages) -> one score per pair; the torch model while training, ONNX after export.
Scorer = Callable[[Sequence[str], Sequence[str]], np.ndarray]

RRF_K = 10.0
BLEND_WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0)


@dataclass(frozen=True)
class Candidate:
    doc_id: str
    passage: int


def first_stage(item: Mined, passages: Sequence[Passage], depth: int) -> list[Candidate]:
    """Documents by RRF over the two legs' document orders; each stands for its best chunk (the
    first one either leg ranked)."""
    scores: dict[str, float] = {}
    chosen: dict[str, int] = {}
    for ranked in (item.bm25, item.dense):
        seen: set[str] = set()
        for index in ranked:
            doc = passages[index].doc_id
            if doc in seen:
                continue
            seen.add(doc)
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (RRF_K + len(seen))
            chosen.setdefault(doc, index)
    order = sorted(scores, key=lambda d: (-scores[d], d))[:depth]
    return [Candidate(doc, chosen[doc]) for doc in order]


def blend(reranked: Sequence[str], fused: Sequence[str], weight: float) -> list[str]:
    """RRF of the reranker's order and the first stage's, the first stage weighted."""
    score: dict[str, float] = {}
    for rank, doc in enumerate(reranked, 1):
        score[doc] = score.get(doc, 0.0) + 1.0 / (RRF_K + rank)
    for rank, doc in enumerate(fused, 1):
        score[doc] = score.get(doc, 0.0) + weight / (RRF_K + rank)
    return sorted(score, key=lambda d: (-score[d], reranked.index(d) if d in reranked else 0))


def evaluate(
    items: Sequence[Mined], passages: Sequence[Passage], scorer: Scorer, depth: int
) -> dict[str, float]:
    """nDCG@10 of the first stage, the reranked order and its blends with the first stage."""
    runs: dict[str, dict[str, list[str]]] = {"fused": {}, "reranked": {}}
    runs.update({f"blend_{w}": {} for w in BLEND_WEIGHTS if w})
    qrels: dict[str, dict[str, int]] = {}
    pairs_q: list[str] = []
    pairs_p: list[str] = []
    stages = []
    for item in items:
        stage = first_stage(item, passages, depth)
        stages.append(stage)
        for candidate in stage:
            pairs_q.append(item.query)
            pairs_p.append(passages[candidate.passage].text)
    scores = scorer(pairs_q, pairs_p)
    offset = 0
    for item, stage in zip(items, stages, strict=True):
        qrels[item.query_id] = {d: 1 for d in item.positive_docs}
        fused = [c.doc_id for c in stage]
        mine = scores[offset : offset + len(stage)]
        offset += len(stage)
        reranked = [fused[i] for i in sorted(range(len(stage)), key=lambda i: (-mine[i], i))]
        runs["fused"][item.query_id] = fused
        runs["reranked"][item.query_id] = reranked
        for weight in BLEND_WEIGHTS:
            if weight:
                runs[f"blend_{weight}"][item.query_id] = blend(reranked, fused, weight)
    ndcg = metrics.STANDARD_METRICS["ndcg@10"]
    return {
        name: round(metrics.mean(metrics.per_query(run, qrels, ndcg).values()), 4)
        for name, run in runs.items()
    }
