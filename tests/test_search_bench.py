"""bench/search_bench.py's summary: the side-by-side ratios its --json line carries."""

from __future__ import annotations

import json

import pytest

from bench.search_bench import LoadRun, comparison, summary


def cell(p50_ms: float, searches_per_s: float) -> dict[str, float]:
    return {
        "searches": 100,
        "p50_ms": p50_ms,
        "p95_ms": 2 * p50_ms,
        "mean_ms": p50_ms,
        "searches_per_s": searches_per_s,
    }


RESULTS = {
    "in-process c=1": cell(20.0, 50.0),
    "gateway c=1": cell(22.0, 45.0),
    "in-process c=8": cell(80.0, 100.0),
    "gateway c=8": cell(100.0, 90.0),
}


def test_comparison_is_gateway_over_in_process() -> None:
    out = comparison(RESULTS)
    assert out["p50_ratio_c1"] == pytest.approx(1.1)
    assert out["p50_ratio_c8"] == pytest.approx(1.25)
    assert out["throughput_ratio_c8"] == pytest.approx(0.9)
    assert (out["gateway_p50_ms_c1"], out["inproc_p50_ms_c1"]) == (22.0, 20.0)
    assert (out["gateway_p50_ms_c8"], out["inproc_p50_ms_c8"]) == (100.0, 80.0)
    assert (out["gateway_searches_per_s_c8"], out["inproc_searches_per_s_c8"]) == (90.0, 100.0)
    # One line of JSON, as the benchmark prints last.
    assert "\n" not in json.dumps(out)


def test_comparison_needs_both_sides_at_both_concurrencies() -> None:
    with pytest.raises(KeyError):
        comparison({k: v for k, v in RESULTS.items() if k != "gateway c=8"})


def test_summary_of_runs_feeds_the_comparison() -> None:
    fast = LoadRun([0.01] * 10, wall_s=0.1, answers=[])
    slow = LoadRun([0.02] * 10, wall_s=0.2, answers=[])
    results = {
        "in-process c=1": summary([fast]),
        "gateway c=1": summary([slow]),
        "in-process c=8": summary([fast]),
        "gateway c=8": summary([slow]),
    }
    out = comparison(results)
    assert out["p50_ratio_c1"] == pytest.approx(2.0)
    assert out["throughput_ratio_c8"] == pytest.approx(0.5)
