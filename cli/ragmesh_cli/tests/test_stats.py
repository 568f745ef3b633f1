"""The one percentile function (ragmesh_cli.stats): nearest rank for the load test, linear
interpolation for the evals and benchmarks. These cases were test_loadtest's and test_search_eval's
when each module had its own copy."""

from __future__ import annotations

import numpy as np
import pytest

from ragmesh_cli.stats import latency_summary_ms, percentile


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 99.5) == 100.0
    assert percentile(values, 100) == 100.0
    assert percentile(values, 0) == 1.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_percentile_needs_no_sorted_input() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50, method="linear") == pytest.approx(2.5)


def test_percentile_matches_linear_interpolation() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50, method="linear", empty=0.0) == pytest.approx(50.5)
    assert percentile(values, 95, method="linear", empty=0.0) == pytest.approx(95.05)
    assert percentile([], 95, method="linear", empty=0.0) == 0.0
    with pytest.raises(ValueError):
        percentile(values, -1, method="linear")


@pytest.mark.parametrize("q", [0.0, 12.5, 50.0, 90.0, 99.0, 100.0])
def test_linear_percentile_is_numpys_default(q: float) -> None:
    """bench/rerank_bench used np.percentile; the shared function must give the same figures."""
    values = [float(v) for v in np.random.default_rng(7).exponential(size=37)]
    assert percentile(values, q, method="linear") == pytest.approx(float(np.percentile(values, q)))


def test_latency_summary_in_ms() -> None:
    summary = latency_summary_ms([0.003, 0.001, 0.002, 0.010])
    assert summary == {"p50": 2.0, "p95": 10.0, "p99": 10.0, "max": 10.0, "mean": 4.0}
    assert latency_summary_ms([])["p99"] is None
