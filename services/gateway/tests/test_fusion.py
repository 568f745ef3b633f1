from __future__ import annotations

import pytest

from services.gateway.fusion import (
    Fused,
    Hit,
    LegRank,
    blend_reranked,
    collapse_documents,
    combine_variations,
    merge_by_score,
    merge_shard_lists,
    reported_everywhere,
    rrf,
)


def hits(*ids: str, doc: str = "") -> list[Hit]:
    """A ranked list; each chunk's document is its id's first letter unless given."""
    return [Hit(c, doc or c[0], 1.0 - i / 10) for i, c in enumerate(ids)]


def test_rrf_sums_weighted_reciprocal_ranks() -> None:
    fused = rrf({"dense": hits("a1", "b1"), "bm25": hits("b1", "c1")}, {"dense": 1.0, "bm25": 2.0}, k=60)
    scores = {f.chunk_id: f.score for f in fused}
    assert scores["a1"] == pytest.approx(1 / 61)
    assert scores["b1"] == pytest.approx(1 / 62 + 2 / 61)
    assert scores["c1"] == pytest.approx(2 / 62)
    assert [f.chunk_id for f in fused] == ["b1", "c1", "a1"]
    b1 = fused[0]
    assert b1.ranks == [LegRank("bm25", 1, 1.0), LegRank("dense", 2, 0.9)]


def test_rrf_k_changes_how_much_top_ranks_dominate() -> None:
    # One leg puts x first only; the other ranks y second in both: small k favours x.
    ranked = {"dense": hits("x1", "y1"), "bm25": hits("z1", "y1")}
    weights = {"dense": 1.0, "bm25": 1.0}
    assert rrf(ranked, weights, k=1)[0].chunk_id == "y1"  # 1/3 + 1/3 > 1/2
    assert [f.score for f in rrf(ranked, weights, k=1)][:1] == [pytest.approx(2 / 3)]
    with pytest.raises(ValueError):
        rrf(ranked, weights, k=0)


def test_rrf_ties_are_deterministic_by_best_rank_then_chunk_id() -> None:
    weights = {"dense": 1.0, "bm25": 1.0}
    # a and b mirror each other across two equal-weight legs: same score, same best rank.
    ranked = {"dense": hits("b1", "a1"), "bm25": hits("a1", "b1")}
    assert [f.chunk_id for f in rrf(ranked, weights, k=60)] == ["a1", "b1"]
    assert [f.chunk_id for f in rrf(dict(reversed(ranked.items())), weights, k=60)] == ["a1", "b1"]
    # With k=1 the scores are exact binary fractions: z1 = 1/2 (rank 1), b1 = 1/4 + 1/4 (ranks 3
    # and 3), p1 = 1/2 (rank 1); q1 = x1 = 1/3 (rank 2). Best single-leg rank, then chunk id.
    tied = {"dense": hits("z1", "x1", "b1"), "bm25": hits("p1", "q1", "b1")}
    fused = rrf(tied, weights, k=1)
    assert [f.score for f in fused] == [0.5, 0.5, 0.5, pytest.approx(1 / 3), pytest.approx(1 / 3)]
    assert [f.chunk_id for f in fused] == ["p1", "z1", "b1", "q1", "x1"]


def test_disabled_leg_neither_scores_nor_ranks() -> None:
    ranked = {"dense": hits("a1"), "exact": hits("e1", "a1")}
    fused = rrf(ranked, {"dense": 1.0, "exact": 0.0}, k=60)
    assert [f.chunk_id for f in fused] == ["a1"]
    assert [r.leg for r in fused[0].ranks] == ["dense"]


def test_duplicate_in_one_leg_counts_once_at_its_best_rank() -> None:
    fused = rrf({"dense": hits("a1", "b1", "a1")}, {"dense": 1.0}, k=60)
    assert {f.chunk_id: f.score for f in fused} == {"a1": pytest.approx(1 / 61), "b1": pytest.approx(1 / 62)}


def test_merge_by_score_keeps_best_score_and_limit() -> None:
    shard0 = [Hit("a", "d", 0.5), Hit("b", "d", 0.2)]
    shard1 = [Hit("c", "d", 0.9), Hit("a", "d", 0.7)]
    merged = merge_by_score([shard0, shard1], limit=2)
    assert merged == [Hit("c", "d", 0.9), Hit("a", "d", 0.7)]


def test_combine_variations_rrf_rewards_agreement_and_keeps_best_cosine() -> None:
    original = [Hit("a", "d", 0.60), Hit("b", "d", 0.55)]
    hyde = [Hit("c", "d", 0.95), Hit("b", "d", 0.90)]
    combined = combine_variations([original, hyde], k=60, limit=10)
    assert [h.chunk_id for h in combined] == ["b", "a", "c"]
    assert combined[0].score == pytest.approx(0.90)
    assert [h.chunk_id for h in combine_variations([original, hyde], 60, 10, mode="max")] == ["c", "b", "a"]
    assert combine_variations([original], k=60, limit=1) == original[:1]
    with pytest.raises(ValueError):
        combine_variations([original, hyde], 60, 10, mode="sum")


def test_collapse_keeps_each_documents_best_chunk_in_order() -> None:
    fused = rrf({"dense": hits("a1", "b1", "a2", "c1", "b2")}, {"dense": 1.0}, k=60)
    assert [(f.doc_id, f.chunk_id) for f in collapse_documents(fused)] == [
        ("a", "a1"),
        ("b", "b1"),
        ("c", "c1"),
    ]


def reranked(*fused_ranks: int) -> list[Fused]:
    """A reranker's order, best first: the chunk at each place is named after its fused rank."""
    return [Fused(f"f{rank}", "d", 0.0, fused_rank=rank) for rank in fused_ranks]


def ids(items: list[Fused]) -> list[str]:
    return [item.chunk_id for item in items]


def test_blend_with_weight_zero_keeps_the_reranker_order() -> None:
    order = reranked(3, 1, 2)
    blended = blend_reranked(order, 0.0, k=60)
    assert ids(blended) == ["f3", "f1", "f2"]
    assert blended is not order  # a new list: the caller's is left alone
    assert blend_reranked([], 1.0, k=60) == []


def test_blend_scores_reciprocal_ranks_of_both_orders() -> None:
    # k=1, weight 1: f4 = 1/2 + 1/5 = 0.7, f1 = 1/3 + 1/2 = 0.83, f2 = 1/4 + 1/3 = 0.58.
    assert ids(blend_reranked(reranked(4, 1, 2), 1.0, k=1)) == ["f1", "f4", "f2"]
    # A smaller weight leaves the reranker's first: f4 = 1/2 + 0.2/5 = 0.54 > f1 = 1/3 + 0.1.
    assert ids(blend_reranked(reranked(4, 1, 2), 0.2, k=1)) == ["f4", "f1", "f2"]


def test_blend_with_a_large_weight_moves_to_the_fused_order() -> None:
    assert ids(blend_reranked(reranked(5, 3, 1, 4, 2), 1000.0, k=60)) == ["f1", "f2", "f3", "f4", "f5"]


def test_blend_ties_keep_the_reranker_order() -> None:
    # k=1, weight 1: first in one order and second in the other, 1/2 + 1/3 both ways.
    assert ids(blend_reranked(reranked(2, 1), 1.0, k=1)) == ["f2", "f1"]
    # f3 = 1/2 + 1/4 and f1 = 1/4 + 1/2 tie (exact binary fractions) above f2 = 1/3 + 1/3.
    assert ids(blend_reranked(reranked(3, 2, 1), 1.0, k=1)) == ["f3", "f1", "f2"]


def test_shard_lists_merge_by_score_and_one_shard_keeps_its_order() -> None:
    shard0 = [Hit("a1", "a", 3.0), Hit("b1", "b", 1.0)]
    shard1 = [Hit("c1", "c", 2.0), Hit("d1", "d", 0.5)]
    assert [h.chunk_id for h in merge_shard_lists([shard0, shard1], 3)] == ["a1", "c1", "b1"]
    # Ties within one shard stay as that shard ranked them (BM25's own order).
    tied = [Hit("z1", "z", 1.0), Hit("a1", "a", 1.0)]
    assert [h.chunk_id for h in merge_shard_lists([tied], 10)] == ["z1", "a1"]


def test_a_word_is_unknown_only_when_every_shard_says_so() -> None:
    assert reported_everywhere([["zork", "basalt"], ["basalt", "zork", "x"]]) == ["zork", "basalt"]
    assert reported_everywhere([["zork", "basalt"], ["basalt"]]) == ["basalt"]
    assert reported_everywhere([]) == []
