"""Prometheus metrics of the planner's own work (RPC counts come from meshkit)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

PLANS = Counter(
    "ragmesh_planner_plans_total",
    "Plans made, by planner, strategy, and whether the caller chose the strategy (requested) or not (auto).",
    ["planner", "strategy", "source"],
)
VARIATIONS = Histogram(
    "ragmesh_planner_variations",
    "Dense queries in one plan, the original included.",
    buckets=(1, 2, 3, 4, 6, 8),
)
KEYWORDS = Histogram(
    "ragmesh_planner_hard_keywords", "Hard keywords in one plan.", buckets=(0, 1, 2, 3, 4, 6, 8, 16, 32)
)
FALLBACKS = Counter(
    "ragmesh_planner_llm_fallbacks_total",
    "LLM plans replaced by the deterministic plan, by LLMError reason.",
    ["reason"],
)
HYDE = Counter(
    "ragmesh_planner_hyde_total",
    "HyDE passages asked for, by source (plan: fusion plans; rpc: the Hyde RPC) and outcome "
    "(ok, skipped: the LLM was known down or out of time, no_llm, or the LLMError reason).",
    ["source", "outcome"],
)
