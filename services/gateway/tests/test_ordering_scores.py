"""The score a caller sees is the one that ordered the results: non-increasing down the list
whichever rule of the reranker chose the order."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from services.gateway.fusion import Fused, ordering_scores
from services.gateway.rerank import final_order


def fused(count: int) -> list[Fused]:
    return [Fused(f"c{i}", "d", 1.0 / (60 + i), fused_rank=i) for i in range(1, count + 1)]


def test_in_fused_order_the_score_is_the_fused_score() -> None:
    items = fused(4)
    assert ordering_scores(items) == [item.score for item in items]


def test_a_blended_order_carries_its_blend_scores_and_the_tail_the_last_one() -> None:
    candidates = fused(4)
    # The reranker passes c3 (best) and c1; c2 and c4 fall under its threshold.
    candidates[2].rerank_score, candidates[0].rerank_score = 2.0, 1.0
    order = final_order(
        candidates, [candidates[2], candidates[0]], False, fused_weight=0.5, rrf_k=60, keep_fused_margin=0.0
    )
    assert [item.chunk_id for item in order.results] == ["c3", "c1", "c2", "c4"]
    scores = ordering_scores(order.results)
    assert scores[0] == 1 / 61 + 0.5 / 63 and scores[1] == 1 / 62 + 0.5 / 61
    assert scores[2] == scores[3] == scores[1]


def test_without_the_blend_the_score_is_the_cross_encoders() -> None:
    candidates = fused(3)
    candidates[1].rerank_score, candidates[2].rerank_score = 3.0, -1.0
    order = final_order(
        candidates, [candidates[1], candidates[2]], False, fused_weight=0.0, rrf_k=60, keep_fused_margin=0.0
    )
    assert ordering_scores(order.results) == [3.0, -1.0, -1.0]


@given(
    rerank=st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=30),
    passed=st.data(),
    weight=st.sampled_from([0.0, 0.3, 1.0, 5.0]),
    margin=st.sampled_from([0.0, 0.5, 3.0]),
    fallback=st.booleans(),
)
def test_the_scores_never_rise_down_the_list(
    rerank: list[float], passed: st.DataObject, weight: float, margin: float, fallback: bool
) -> None:
    candidates = fused(len(rerank))
    for item, score in zip(candidates, rerank, strict=True):
        item.rerank_score = score
    keep = passed.draw(st.lists(st.booleans(), min_size=len(rerank), max_size=len(rerank)))
    scored = sorted(
        (c for c, k in zip(candidates, keep, strict=True) if k), key=lambda c: -(c.rerank_score or 0)
    )
    if fallback:
        scored = list(candidates)
    order = final_order(candidates, scored, fallback, fused_weight=weight, rrf_k=60, keep_fused_margin=margin)
    if not scored:
        return
    scores = ordering_scores(order.results)
    assert all(a >= b for a, b in itertools.pairwise(scores))
