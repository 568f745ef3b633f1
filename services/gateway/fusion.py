"""Rank fusion, pure and deterministic, so the gateway and offline benchmarks share one
implementation.

Weighted Reciprocal Rank Fusion: ``score(chunk) = sum over legs of w_leg / (k + rank_leg)``
with 1-based ranks. RRF only looks at ranks, so legs whose scores live on unrelated scales
(cosine, BM25, keyword counts) combine without calibration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Hit:
    """One entry of a leg's ranked list."""

    chunk_id: str
    doc_id: str
    score: float


@dataclass(frozen=True)
class LegRank:
    """Where a fused chunk stood in one leg's list."""

    leg: str
    rank: int
    score: float


@dataclass
class Fused:
    chunk_id: str
    doc_id: str
    score: float
    ranks: list[LegRank] = field(default_factory=list)
    # Set by the gateway: 1-based place in the fused list, and the cross-encoder's score.
    fused_rank: int = 0
    rerank_score: float | None = None
    # The score of the order the reranker's rules chose for it (None: the fused order holds).
    order_score: float | None = None

    @property
    def best_rank(self) -> int:
        return min(r.rank for r in self.ranks)


def _sort_key(item: Fused) -> tuple[float, int, str]:
    # Ties (equal fused score, common with symmetric ranks) go to the chunk one leg ranked
    # highest, then to the chunk id, so equal inputs always give the same order.
    return (-item.score, item.best_rank, item.chunk_id)


def rrf(ranked: Mapping[str, Sequence[Hit]], weights: Mapping[str, float], k: float) -> list[Fused]:
    """Fuse the legs' ranked lists. A leg with weight 0 is disabled: it neither scores nor
    shows in ``ranks``. A chunk listed twice in one leg counts once, at its best rank."""
    if k <= 0:
        raise ValueError(f"rrf k must be > 0, got {k}")
    fused: dict[str, Fused] = {}
    # Legs in a fixed order so float sums, and so ties, do not depend on mapping order.
    for leg in sorted(ranked):
        weight = weights[leg]
        if weight <= 0:
            continue
        seen: set[str] = set()
        for rank, hit in enumerate(ranked[leg], start=1):
            if hit.chunk_id in seen:
                continue
            seen.add(hit.chunk_id)
            item = fused.setdefault(hit.chunk_id, Fused(hit.chunk_id, hit.doc_id, 0.0))
            item.score += weight / (k + rank)
            item.ranks.append(LegRank(leg, rank, hit.score))
    return sorted(fused.values(), key=_sort_key)


def fuse(
    ranked: Mapping[str, Sequence[Hit]], weights: Mapping[str, float], k: float, collapse: bool
) -> list[Fused]:
    """The fused list a search answers from: ``rrf`` of the legs, one entry per document when
    ``collapse``, each entry numbered by its 1-based place (``fused_rank``, which the reranked
    order blends with and every result reports)."""
    fused = rrf(ranked, weights, k)
    if collapse:
        fused = collapse_documents(fused)
    for rank, entry in enumerate(fused, 1):
        entry.fused_rank = rank
    return fused


def merge_by_score(lists: Iterable[Sequence[Hit]], limit: int | None = None) -> list[Hit]:
    """Merge lists whose scores are comparable (one query over several index shards): best
    score first, a chunk found twice keeps its best score."""
    best: dict[str, Hit] = {}
    for hits in lists:
        for hit in hits:
            current = best.get(hit.chunk_id)
            if current is None or hit.score > current.score:
                best[hit.chunk_id] = hit
    return sorted(best.values(), key=lambda h: (-h.score, h.chunk_id))[:limit]


def merge_shard_lists(answers: Sequence[Sequence[Hit]], limit: int) -> list[Hit]:
    """One leg's list from its shards' lists; one shard's comes back as it ranked it."""
    return list(answers[0][:limit]) if len(answers) == 1 else merge_by_score(answers, limit)


def reported_everywhere(per_shard: Sequence[Sequence[str]]) -> list[str]:
    """The words every shard reported, in the first one's order (a word is unknown to the
    collection only when no shard holds it)."""
    if not per_shard:
        return []
    others = [set(words) for words in per_shard[1:]]
    return [word for word in per_shard[0] if all(word in seen for seen in others)]


def combine_variations(lists: Sequence[Sequence[Hit]], k: float, limit: int, mode: str = "rrf") -> list[Hit]:
    """One dense list out of the lists of several phrasings of the question.

    ``rrf`` (default) ranks by unweighted RRF over the phrasings: it rewards chunks several
    phrasings agree on, and no phrasing dominates by scale (a HyDE passage matches passages
    with systematically higher cosines than a short question does). ``max`` ranks by the best
    cosine of any phrasing. Either way a hit's score is its best cosine, and one list comes
    back unchanged."""
    if len(lists) == 1:
        return list(lists[0][:limit])
    best = {h.chunk_id: h for h in merge_by_score(lists)}
    if mode == "max":
        return list(best.values())[:limit]
    if mode != "rrf":
        raise ValueError(f"unknown variation combine mode {mode!r}")
    legs = {str(i): hits for i, hits in enumerate(lists)}
    fused = rrf(legs, dict.fromkeys(legs, 1.0), k)
    return [best[item.chunk_id] for item in fused[:limit]]


def collapse_documents(fused: Sequence[Fused]) -> list[Fused]:
    """One entry per document: its best-fused chunk, in fused order.

    Max-chunk rather than a sum over a document's chunks: a sum favours long documents
    (more chunks, more chances to score) over the one with the best passage, and the result
    shown is a chunk whose fused score must be its own."""
    seen: set[str] = set()
    kept: list[Fused] = []
    for item in fused:
        if item.doc_id not in seen:
            seen.add(item.doc_id)
            kept.append(item)
    return kept


def blend_reranked(reranked: Sequence[Fused], fused_weight: float, k: float) -> list[Fused]:
    """The final order of reranked results: RRF of the reranker's order (weight 1) and the fused
    order (``fused_weight``; 0 keeps the reranker's order). On SciFact train claims a cross-encoder
    trained on little data ranks better with the retrieval legs' vote than alone."""
    if fused_weight <= 0:
        for item in reranked:
            item.order_score = item.rerank_score
        return list(reranked)
    position = {item.chunk_id: i for i, item in enumerate(reranked)}
    for item in reranked:
        item.order_score = 1.0 / (k + position[item.chunk_id] + 1) + fused_weight / (k + item.fused_rank)
    return sorted(reranked, key=lambda item: (-(item.order_score or 0.0), position[item.chunk_id]))


def ordering_scores(results: Sequence[Fused]) -> list[float]:
    """The score each result is ordered by, non-increasing down the list: its ``order_score``
    where the reranker's rules set one, else its fused score; a result placed below by rule
    (no order score under ones that have it) carries the score of the one above it."""
    scores: list[float] = []
    ruled = False
    for item in results:
        if item.order_score is not None:
            value, ruled = item.order_score, True
        elif ruled:
            value = scores[-1]
        else:
            value = item.score
        scores.append(min(value, scores[-1]) if scores else value)
    return scores
