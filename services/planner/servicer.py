"""gRPC face of the planner: validates the request, asks the configured planner for a plan and
maps it to the wire. Planners know nothing of protobuf (see ``plan.py``)."""

from __future__ import annotations

from grpc import aio

from meshkit.errors import invalid_argument
from meshkit.server import ServiceSpec
from meshkit.settings import PlannerSettings
from ragmesh.planner.v1 import planner_pb2, planner_pb2_grpc
from services.planner import metrics
from services.planner.deterministic import DeterministicPlanner, PoolSizes
from services.planner.plan import HydeMode, PlanInput, Planner, RetrievalPlan, Strategy

_STRATEGY_FROM_PB = {
    planner_pb2.STRATEGY_UNSPECIFIED: None,
    planner_pb2.STRATEGY_PRECISE: Strategy.PRECISE,
    planner_pb2.STRATEGY_EXHAUSTIVE: Strategy.EXHAUSTIVE,
}
_STRATEGY_TO_PB = {s: pb for pb, s in _STRATEGY_FROM_PB.items() if s is not None}
_HYDE_FROM_PB = {
    planner_pb2.HYDE_MODE_UNSPECIFIED: None,
    planner_pb2.HYDE_MODE_OFF: HydeMode.OFF,
    planner_pb2.HYDE_MODE_FUSION: HydeMode.FUSION,
    planner_pb2.HYDE_MODE_SUPPLEMENT: HydeMode.SUPPLEMENT,
}
_HYDE_TO_PB = {h: pb for pb, h in _HYDE_FROM_PB.items() if h is not None}


class PlannerServicer(planner_pb2_grpc.PlannerServiceServicer):
    def __init__(self, settings: PlannerSettings, planner: Planner) -> None:
        self.settings = settings
        self.planner = planner

    async def Plan(
        self, request: planner_pb2.PlanRequest, context: aio.ServicerContext
    ) -> planner_pb2.PlanResponse:
        plan_input = self.validate(request)
        plan = await self.planner.plan(plan_input)
        source = "auto" if plan_input.strategy is None else "requested"
        metrics.PLANS.labels(plan.planner, plan.strategy.value, source).inc()
        metrics.VARIATIONS.observe(len(plan.variations))
        metrics.KEYWORDS.observe(len(plan.hard_keywords))
        return planner_pb2.PlanResponse(plan=plan_to_pb(plan))

    def validate(self, request: planner_pb2.PlanRequest) -> PlanInput:
        limits = self.settings
        query = request.query
        if len(query) > limits.planner_max_query_chars:
            raise invalid_argument(
                f"query is {len(query)} chars, the limit is {limits.planner_max_query_chars}"
            )
        if not query.strip():
            raise invalid_argument("query is empty")
        if request.max_variations > limits.planner_max_variations:
            raise invalid_argument(
                f"max_variations is {request.max_variations}, the limit is {limits.planner_max_variations}"
            )
        if request.strategy not in _STRATEGY_FROM_PB:
            raise invalid_argument(f"unknown strategy {request.strategy}")
        if request.hyde_mode not in _HYDE_FROM_PB:
            raise invalid_argument(f"unknown hyde_mode {request.hyde_mode}")
        return PlanInput(
            query=query,
            strategy=_STRATEGY_FROM_PB[request.strategy],
            max_variations=request.max_variations or limits.planner_default_variations,
            hyde_mode=_HYDE_FROM_PB[request.hyde_mode],
        )


def plan_to_pb(plan: RetrievalPlan) -> planner_pb2.Plan:
    return planner_pb2.Plan(
        strategy=_STRATEGY_TO_PB[plan.strategy],
        pool_size=plan.pool_size,
        variations=plan.variations,
        hard_keywords=plan.hard_keywords,
        hyde_passage=plan.hyde_passage,
        hyde_mode=_HYDE_TO_PB[plan.hyde_mode],
        planner=plan.planner,
    )


def default_planner(settings: PlannerSettings) -> Planner:
    pools = PoolSizes(settings.planner_precise_pool, settings.planner_exhaustive_pool)
    return DeterministicPlanner(pools, settings.planner_max_keywords)


def build_spec(settings: PlannerSettings, planner: Planner | None = None) -> ServiceSpec:
    if settings.planner_default_variations > settings.planner_max_variations:
        raise ValueError(
            f"planner_default_variations ({settings.planner_default_variations}) exceeds "
            f"planner_max_variations ({settings.planner_max_variations})"
        )
    servicer = PlannerServicer(settings, planner or default_planner(settings))
    return ServiceSpec(
        name="planner",
        grpc_services=[planner_pb2.DESCRIPTOR.services_by_name["PlannerService"].full_name],
        register=lambda server: planner_pb2_grpc.add_PlannerServiceServicer_to_server(servicer, server),
    )
