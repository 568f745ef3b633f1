"""What other services may use of the planner (they import this module only, never its
servicer or internals): the deterministic planner built from the planner settings, the types a
plan is made of, whether the settings want an LLM, and the mapping of plans and strategies to and
from the wire (``ragmesh.planner.v1``).

The gateway plans requests without HyDE in-process with it (``services/gateway/planning.py``);
the planner's own servicer maps its replies with the same functions, so both give the same plan.
"""

from __future__ import annotations

from meshkit.settings import PlannerSettings
from ragmesh.planner.v1 import planner_pb2
from services.planner.deterministic import DeterministicPlanner, PoolSizes
from services.planner.plan import HydeMode, PlanInput, RetrievalPlan, Strategy, Turn

__all__ = [
    "HYDE_FROM_PB",
    "STRATEGY_FROM_PB",
    "DeterministicPlanner",
    "HydeMode",
    "PlanInput",
    "PoolSizes",
    "RetrievalPlan",
    "Strategy",
    "Turn",
    "deterministic_planner",
    "llm_wanted",
    "plan_to_pb",
    "strategy_from_pb",
]

# Known wire values -> what the planners take (None: unspecified, the planner or server decides).
STRATEGY_FROM_PB = {
    planner_pb2.STRATEGY_UNSPECIFIED: None,
    planner_pb2.STRATEGY_PRECISE: Strategy.PRECISE,
    planner_pb2.STRATEGY_EXHAUSTIVE: Strategy.EXHAUSTIVE,
}
HYDE_FROM_PB = {
    planner_pb2.HYDE_MODE_UNSPECIFIED: None,
    planner_pb2.HYDE_MODE_OFF: HydeMode.OFF,
    planner_pb2.HYDE_MODE_FUSION: HydeMode.FUSION,
    planner_pb2.HYDE_MODE_SUPPLEMENT: HydeMode.SUPPLEMENT,
}
_STRATEGY_TO_PB = {s: pb for pb, s in STRATEGY_FROM_PB.items() if s is not None}
_HYDE_TO_PB = {h: pb for pb, h in HYDE_FROM_PB.items() if h is not None}


def plan_to_pb(plan: RetrievalPlan) -> planner_pb2.Plan:
    return planner_pb2.Plan(
        strategy=_STRATEGY_TO_PB[plan.strategy],
        pool_size=plan.pool_size,
        variations=plan.variations,
        hard_keywords=plan.hard_keywords,
        hyde_passage=plan.hyde_passage,
        hyde_mode=_HYDE_TO_PB[plan.hyde_mode],
        planner=plan.planner,
        searched_query=plan.searched_query,
    )


def strategy_from_pb(strategy: planner_pb2.Strategy) -> Strategy | None:
    """A known wire strategy as the planners take it (None: the planner decides)."""
    return STRATEGY_FROM_PB[strategy]


def llm_wanted(settings: PlannerSettings) -> bool:
    """Whether the settings ask for an LLM; see ``hyde.py`` for what follows from it."""
    return settings.planner_mode == "llm" or settings.planner_hyde_mode != "off"


def deterministic_planner(settings: PlannerSettings) -> DeterministicPlanner:
    """The rule-based planner with the pool sizes and keyword limit of ``settings``."""
    pools = PoolSizes(settings.planner_precise_pool, settings.planner_exhaustive_pool)
    return DeterministicPlanner(pools, settings.planner_max_keywords)
