"""Prometheus metrics of the gateway's own work (RPC counts and client calls come from meshkit)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from prometheus_client import Counter, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

SEARCH_SECONDS = Histogram(
    "ragmesh_gateway_search_seconds",
    "End-to-end Search latency, by outcome (whole, degraded, failed).",
    ["outcome"],
    buckets=_LATENCY_BUCKETS,
)
STAGE_SECONDS = Histogram(
    "ragmesh_gateway_stage_seconds",
    "Time of one search or ask stage (planner, embed, dense, bm25, exact, fuse, hydrate, rerank, hyde, "
    "extract, narrate).",
    ["stage"],
    buckets=_LATENCY_BUCKETS,
)
DEGRADATIONS = Counter(
    "ragmesh_gateway_degradations_total",
    "Stages that did not contribute to a search, by stage and reason.",
    ["stage", "reason"],
)
ASK_SECONDS = Histogram(
    "ragmesh_gateway_ask_seconds",
    "End-to-end Ask latency, by outcome (whole, degraded, failed).",
    ["outcome"],
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120),
)


def ms(seconds: float) -> float:
    """A stage's time as reported in responses and logs: milliseconds, to the microsecond."""
    return round(seconds * 1000, 3)


@contextlib.contextmanager
def timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    """Records the time of the block as ``timings[stage]`` (in ``ms``) when it completes; a
    stage that raises reports no time (its search or ask fails whole)."""
    started = time.perf_counter()
    yield
    timings[stage] = ms(time.perf_counter() - started)
