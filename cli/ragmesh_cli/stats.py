"""Summary statistics the commands and benchmarks report: one percentile function, two methods.

- ``nearest``: nearest rank, no interpolation, so every figure is a value some call actually had
  (``ragmesh loadtest``'s latencies).
- ``linear``: linear interpolation between closest ranks, numpy's default (``ragmesh eval``, the
  offline benchmarks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, overload

Method = Literal["nearest", "linear"]
# The latency percentiles a load test reports.
LATENCY_PERCENTILES = (50.0, 95.0, 99.0)


@overload
def percentile(
    values: Sequence[float], q: float, *, method: Method = ..., empty: None = ...
) -> float | None: ...


@overload
def percentile(values: Sequence[float], q: float, *, method: Method = ..., empty: float) -> float: ...


def percentile(
    values: Sequence[float], q: float, *, method: Method = "nearest", empty: float | None = None
) -> float | None:
    """The ``q``-th percentile (0..100) of ``values`` (in any order); ``empty`` when there are none."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside 0..100")
    if not values:
        return empty
    ordered = sorted(values)
    if method == "nearest":
        rank = max(1, math.ceil(q / 100.0 * len(ordered)))
        return ordered[rank - 1]
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def latency_summary_ms(latencies_s: Sequence[float]) -> dict[str, float | None]:
    """Nearest-rank p50/p95/p99, max and mean of latencies in seconds, in milliseconds (None for none)."""
    ordered = sorted(latencies_s)
    out: dict[str, float | None] = {}
    for q in LATENCY_PERCENTILES:
        value = percentile(ordered, q)
        out[f"p{q:g}"] = None if value is None else round(value * 1000.0, 3)
    out["max"] = round(ordered[-1] * 1000.0, 3) if ordered else None
    out["mean"] = round(sum(ordered) / len(ordered) * 1000.0, 3) if ordered else None
    return out
