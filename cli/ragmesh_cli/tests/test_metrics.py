"""IR metrics against pytrec_eval (the reference trec_eval implementation), and the paired bootstrap."""

from __future__ import annotations

import random

import pytest
import pytrec_eval

from ragmesh_cli import metrics

TOLERANCE = 1e-9


def _random_case(rng: random.Random, queries: int) -> tuple[dict[str, dict[str, int]], dict[str, list[str]]]:
    """Graded qrels and rankings drawn from scores with many ties (broken by doc id, as a system would)."""
    docs = [f"d{i}" for i in range(200)]
    qrels: dict[str, dict[str, int]] = {}
    run: dict[str, list[str]] = {}
    for q in range(queries):
        qid = f"q{q}"
        judged = rng.sample(docs, rng.randint(1, 30))
        qrels[qid] = {doc: rng.choice([0, 1, 1, 2, 3]) for doc in judged}
        if not any(qrels[qid].values()):
            qrels[qid][judged[0]] = 1
        retrieved = rng.sample(docs, rng.randint(0, 150))
        scores = {doc: float(rng.randint(0, 8)) for doc in retrieved}  # few values: many ties
        run[qid] = sorted(retrieved, key=lambda d: (-scores[d], d))
    return qrels, run


def _as_trec_run(ranked: list[str]) -> dict[str, float]:
    # Distinct decreasing scores, so trec_eval's tie-breaking cannot reorder our ranking.
    return {doc: float(len(ranked) - i) for i, doc in enumerate(ranked)}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_metrics_agree_with_pytrec_eval(seed: int) -> None:
    qrels, run = _random_case(random.Random(seed), 60)
    evaluator = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut_10", "recall_100"})
    reference = evaluator.evaluate({q: _as_trec_run(r) for q, r in run.items() if r})
    mrr_reference = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(
        {q: _as_trec_run(r[:10]) for q, r in run.items() if r[:10]}
    )
    ours = metrics.evaluate(run, qrels)
    for qid in qrels:
        expected_ndcg = reference[qid]["ndcg_cut_10"] if qid in reference else 0.0
        expected_recall = reference[qid]["recall_100"] if qid in reference else 0.0
        expected_mrr = mrr_reference[qid]["recip_rank"] if qid in mrr_reference else 0.0
        assert ours["ndcg@10"][qid] == pytest.approx(expected_ndcg, abs=TOLERANCE)
        assert ours["recall@100"][qid] == pytest.approx(expected_recall, abs=TOLERANCE)
        assert ours["mrr@10"][qid] == pytest.approx(expected_mrr, abs=TOLERANCE)


def test_hand_computed_values() -> None:
    rels = {"a": 2, "b": 1, "c": 0}
    ranked = ["x", "b", "a"]
    ideal = 2 + 1 / 1.584962500721156
    assert metrics.ndcg_at_k(ranked, rels, 10) == pytest.approx((1 / 1.584962500721156 + 2 / 2) / ideal)
    assert metrics.recall_at_k(ranked, rels, 2) == 0.5
    assert metrics.mrr_at_k(ranked, rels, 10) == 0.5
    assert metrics.mrr_at_k(ranked, rels, 1) == 0.0


def test_queries_without_relevant_documents_are_skipped_and_missing_runs_score_zero() -> None:
    qrels = {"judged": {"a": 1}, "all-zero": {"b": 0}, "unanswered": {"c": 1}}
    scores = metrics.evaluate({"judged": ["a"], "all-zero": ["b"]}, qrels)
    for per_query in scores.values():
        assert per_query == {"judged": 1.0, "unanswered": 0.0}
    assert metrics.judged_queries(qrels) == ["judged", "unanswered"]


def test_first_occurrence_keeps_each_document_at_its_best_rank() -> None:
    assert metrics.first_occurrence(["d2", "d1", "d2", "d3", "d1"]) == ["d2", "d1", "d3"]


def test_paired_bootstrap_finds_a_real_difference_and_is_deterministic() -> None:
    rng = random.Random(7)
    a = {f"q{i}": rng.random() * 0.5 for i in range(200)}
    b = {q: v + 0.1 + rng.gauss(0, 0.05) for q, v in a.items()}
    result = metrics.paired_bootstrap(a, b)
    assert result.queries == 200 and result.resamples == 10_000
    assert result.mean_diff == pytest.approx(sum(b[q] - a[q] for q in a) / 200)
    assert 0.08 < result.ci_low < result.mean_diff < result.ci_high < 0.12
    assert result.p_value < 0.001
    assert metrics.paired_bootstrap(a, b) == result


def test_paired_bootstrap_of_identical_systems_straddles_zero() -> None:
    rng = random.Random(8)
    a = {f"q{i}": rng.random() for i in range(100)}
    b = {q: v + rng.choice([-0.2, 0.2]) for q, v in a.items()}
    result = metrics.paired_bootstrap(a, b)
    assert result.ci_low < 0.0 < result.ci_high
    assert result.p_value > 0.05


def test_paired_bootstrap_pairs_on_common_queries_only() -> None:
    result = metrics.paired_bootstrap({"q1": 0.0, "q2": 1.0}, {"q2": 1.0, "q3": 0.5})
    assert result.queries == 1 and result.mean_diff == 0.0 and result.p_value == 1.0
    with pytest.raises(ValueError):
        metrics.paired_bootstrap({"q1": 0.0}, {"q2": 1.0})
