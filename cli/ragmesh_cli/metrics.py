"""Information-retrieval metrics over ranked document lists, and a paired bootstrap.

Conventions (they match trec_eval / pytrec_eval, which the unit tests check against):

* A run for one query is a ranked list of unique doc ids, best first; the list order *is* the
  ranking, so ties in the system's scores must be broken before calling these functions.
* Qrels map doc id -> graded relevance; a document is relevant when its grade is > 0. Grades
  <= 0 contribute no gain.
* nDCG@k uses the grade itself as the gain (linear, as trec_eval's ``ndcg_cut``) with a log2(rank+1)
  discount; the ideal DCG comes from the qrels (every judged relevant document, best grades first),
  not from the retrieved list.
* Recall@k = relevant documents in the top k / all relevant documents in the qrels.
* MRR@k = 1 / rank of the first relevant document within the top k, else 0.
* Queries whose qrels hold no relevant document are skipped (every metric would be undefined or
  trivially 0 for them). A query with qrels but no run counts with an empty ranking (score 0), so a
  system cannot raise its mean by failing to answer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

Qrels = Mapping[str, Mapping[str, int]]
# query id -> ranked doc ids, best first
Run = Mapping[str, Sequence[str]]
MetricFn = Callable[[Sequence[str], Mapping[str, int]], float]

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20_240_601


def _relevant(rels: Mapping[str, int]) -> set[str]:
    return {doc for doc, grade in rels.items() if grade > 0}


def dcg_at_k(gains: Iterable[float], k: int) -> float:
    return sum(gain / math.log2(rank + 2) for rank, gain in enumerate(list(gains)[:k]))


def ndcg_at_k(ranked: Sequence[str], rels: Mapping[str, int], k: int) -> float:
    ideal = dcg_at_k(sorted((g for g in rels.values() if g > 0), reverse=True), k)
    if ideal == 0.0:
        return 0.0
    return dcg_at_k((max(rels.get(doc, 0), 0) for doc in ranked[:k]), k) / ideal


def recall_at_k(ranked: Sequence[str], rels: Mapping[str, int], k: int) -> float:
    relevant = _relevant(rels)
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranked[:k])) / len(relevant)


def mrr_at_k(ranked: Sequence[str], rels: Mapping[str, int], k: int) -> float:
    for rank, doc in enumerate(ranked[:k], start=1):
        if rels.get(doc, 0) > 0:
            return 1.0 / rank
    return 0.0


def _at(fn: Callable[[Sequence[str], Mapping[str, int], int], float], k: int) -> MetricFn:
    return lambda ranked, rels: fn(ranked, rels, k)


# The metrics ``ragmesh eval`` reports, by their output name.
STANDARD_METRICS: dict[str, MetricFn] = {
    "ndcg@10": _at(ndcg_at_k, 10),
    "recall@100": _at(recall_at_k, 100),
    "mrr@10": _at(mrr_at_k, 10),
}


def judged_queries(qrels: Qrels) -> list[str]:
    """Query ids with at least one relevant document, in qrels order: the ones that are scored."""
    return [qid for qid, rels in qrels.items() if _relevant(rels)]


def per_query(run: Run, qrels: Qrels, metric: MetricFn) -> dict[str, float]:
    """The metric for every scored query (see the module notes for skipped and missing queries)."""
    return {qid: metric(run.get(qid, ()), qrels[qid]) for qid in judged_queries(qrels)}


def mean(values: Iterable[float]) -> float:
    items = list(values)
    return sum(items) / len(items) if items else 0.0


def evaluate(
    run: Run, qrels: Qrels, metrics: Mapping[str, MetricFn] = STANDARD_METRICS
) -> dict[str, dict[str, float]]:
    """metric name -> {query id: score} for every scored query."""
    return {name: per_query(run, qrels, fn) for name, fn in metrics.items()}


def first_occurrence(doc_ids: Iterable[str]) -> list[str]:
    """Collapse a chunk-level ranking to documents: each document at its best (first) rank."""
    seen: set[str] = set()
    out: list[str] = []
    for doc in doc_ids:
        if doc not in seen:
            seen.add(doc)
            out.append(doc)
    return out


@dataclass(frozen=True)
class PairedBootstrap:
    """Mean of per-query ``b - a`` with a percentile bootstrap confidence interval."""

    queries: int
    mean_a: float
    mean_b: float
    mean_diff: float
    ci_low: float
    ci_high: float
    confidence: float
    resamples: int
    # Two-sided: twice the smaller share of resampled mean differences on either side of 0.
    p_value: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def paired_bootstrap(
    scores_a: Mapping[str, float],
    scores_b: Mapping[str, float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = 0.95,
    seed: int = BOOTSTRAP_SEED,
) -> PairedBootstrap:
    """Paired bootstrap over the queries both systems were scored on (queries are resampled with
    replacement, keeping each query's A and B scores together). Deterministic for a given seed."""
    import numpy as np

    common = sorted(set(scores_a) & set(scores_b))
    if not common:
        raise ValueError("the two systems share no scored queries")
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be between 0 and 1")
    a = np.array([scores_a[q] for q in common], dtype=np.float64)
    b = np.array([scores_b[q] for q in common], dtype=np.float64)
    diff = b - a
    rng = np.random.default_rng(seed)
    # Resample in blocks so a large query set does not build a resamples x queries matrix at once.
    means = np.empty(resamples, dtype=np.float64)
    block = max(1, 4_000_000 // len(diff))
    for start in range(0, resamples, block):
        stop = min(resamples, start + block)
        idx = rng.integers(0, len(diff), size=(stop - start, len(diff)))
        means[start:stop] = diff[idx].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    p_value = min(1.0, 2.0 * min(float(np.mean(means <= 0.0)), float(np.mean(means >= 0.0))))
    return PairedBootstrap(
        queries=len(common),
        mean_a=float(a.mean()),
        mean_b=float(b.mean()),
        mean_diff=float(diff.mean()),
        ci_low=float(low),
        ci_high=float(high),
        confidence=confidence,
        resamples=resamples,
        p_value=p_value,
    )
