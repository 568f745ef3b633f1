"""Which scored passages a Rerank call returns: the threshold and fallback rules.

Passages scoring at least ``min_score`` come back best first (ties keep request order). When none
passes, the caller's own order is the better guess than a cross-encoder that found nothing
convincing, so the first ``fallback_count`` passages come back as they were sent."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Selection:
    # Indexes into the request's passages, in the order to return them.
    order: list[int]
    fallback: bool


def select(scores: Sequence[float], min_score: float, fallback_count: int, top_n: int) -> Selection:
    passing = [i for i, score in enumerate(scores) if score >= min_score]
    if passing:
        order = sorted(passing, key=lambda i: (-scores[i], i))
        return Selection(order[:top_n] if top_n else order, fallback=False)
    count = min(fallback_count, top_n) if top_n else fallback_count
    return Selection(list(range(min(count, len(scores)))), fallback=True)
