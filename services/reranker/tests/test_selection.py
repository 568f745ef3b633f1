from __future__ import annotations

import pytest

from services.reranker.selection import Selection, select

SCORES = [0.5, 3.0, -2.0, 3.0, 1.5, -9.0]


def test_threshold_keeps_passing_best_first_ties_in_input_order() -> None:
    assert select(SCORES, min_score=0.5, fallback_count=3, top_n=0) == Selection([1, 3, 4, 0], False)


def test_threshold_is_inclusive() -> None:
    assert select([1.0, 0.999], min_score=1.0, fallback_count=5, top_n=0).order == [0]


@pytest.mark.parametrize(("top_n", "order"), [(1, [1]), (2, [1, 3]), (3, [1, 3, 4]), (50, [1, 3, 4, 0])])
def test_top_n_cuts(top_n: int, order: list[int]) -> None:
    assert select(SCORES, min_score=0.5, fallback_count=3, top_n=top_n) == Selection(order, False)


def test_nothing_passing_falls_back_to_input_order() -> None:
    assert select(SCORES, min_score=10.0, fallback_count=3, top_n=0) == Selection([0, 1, 2], True)


@pytest.mark.parametrize(
    ("count", "top_n", "order"), [(4, 2, [0, 1]), (2, 4, [0, 1]), (99, 0, [0, 1, 2, 3, 4, 5])]
)
def test_fallback_is_capped_by_top_n_and_the_passages(count: int, top_n: int, order: list[int]) -> None:
    assert select(SCORES, min_score=10.0, fallback_count=count, top_n=top_n) == Selection(order, True)


@pytest.mark.parametrize("top_n", [0, 3])
def test_fallback_count_zero_returns_nothing(top_n: int) -> None:
    assert select(SCORES, min_score=10.0, fallback_count=0, top_n=top_n) == Selection([], True)


def test_every_score_passing_a_low_threshold() -> None:
    assert select(SCORES, min_score=-100.0, fallback_count=0, top_n=0).order == [1, 3, 4, 0, 2, 5]
