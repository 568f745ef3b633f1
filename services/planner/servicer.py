"""gRPC face of the planner: validates the request, asks the configured planner for a plan (or
the HyDE writer for a passage) and maps it to the wire (with the conversions of ``public.py``,
which the gateway's in-process planner shares). Planners know nothing of protobuf (see
``plan.py``); when HyDE is served, and what "an LLM is configured" means, is in ``hyde.py``."""

from __future__ import annotations

from collections.abc import Sequence

from grpc import aio

from meshkit.core.errors import failed_precondition, invalid_argument, unavailable
from meshkit.llm.factory import LLM, LLMError, make_llm
from meshkit.rpc.identity import GATEWAY, OPS, Callers, allow
from meshkit.rpc.server import Hook, ServiceSpec, text_request_bytes
from meshkit.settings import PlannerSettings
from ragmesh.planner.v1 import planner_pb2, planner_pb2_grpc
from services.planner import metrics
from services.planner.hyde import HydeWriter, WithHyde, resolve_hyde_mode
from services.planner.llm import LLMPlanner
from services.planner.plan import PlanInput, Planner, Turn
from services.planner.public import (
    HYDE_FROM_PB,
    STRATEGY_FROM_PB,
    deterministic_planner,
    llm_wanted,
    plan_to_pb,
)

_FROM_USER = {planner_pb2.TURN_ROLE_USER: True, planner_pb2.TURN_ROLE_ASSISTANT: False}
# Protobuf framing of one history turn (tag, length, role) over its text.
TURN_OVERHEAD_BYTES = 16


class PlannerServicer(planner_pb2_grpc.PlannerServiceServicer):
    def __init__(self, settings: PlannerSettings, planner: Planner, hyde: HydeWriter | None = None) -> None:
        self.settings = settings
        self.planner = planner
        # None: no LLM is configured.
        self.hyde = hyde

    async def Plan(
        self, request: planner_pb2.PlanRequest, context: aio.ServicerContext
    ) -> planner_pb2.PlanResponse:
        plan_input = self.validate(request)
        plan = await self.planner.plan(plan_input)
        source = "auto" if plan_input.strategy is None else "requested"
        metrics.PLANS.labels(plan.planner, plan.strategy.value, source).inc()
        metrics.VARIATIONS.observe(len(plan.variations))
        metrics.KEYWORDS.observe(len(plan.hard_keywords))
        response = planner_pb2.PlanResponse(plan=plan_to_pb(plan))
        if plan.fallback is not None:
            response.fallback_reason = plan.fallback.reason
            response.fallback_message = plan.fallback.message
        return response

    async def Hyde(
        self, request: planner_pb2.HydeRequest, context: aio.ServicerContext
    ) -> planner_pb2.HydeResponse:
        self.validate_query(request.query)
        if self.hyde is None:
            metrics.HYDE.labels("rpc", "no_llm").inc()
            raise failed_precondition(
                "no LLM is configured for HyDE (set RAGMESH_PLANNER_MODE=llm or RAGMESH_PLANNER_HYDE_MODE)"
            )
        try:
            passage = await self.hyde.write(request.query)
        except LLMError as exc:
            metrics.HYDE.labels("rpc", exc.reason).inc()
            # Whatever the reason, the caller's move is the same: search without HyDE, maybe retry later.
            raise unavailable(f"the LLM gave no HyDE passage ({exc.reason}): {exc.message}") from exc
        metrics.HYDE.labels("rpc", "ok").inc()
        return planner_pb2.HydeResponse(passage=passage)

    def validate_query(self, query: str) -> None:
        limit = self.settings.planner_max_query_chars
        if len(query) > limit:
            raise invalid_argument(f"query is {len(query)} chars, the limit is {limit}")
        if not query.strip():
            raise invalid_argument("query is empty")

    def validate(self, request: planner_pb2.PlanRequest) -> PlanInput:
        limits = self.settings
        query = request.query
        self.validate_query(query)
        if request.max_variations > limits.planner_max_variations:
            raise invalid_argument(
                f"max_variations is {request.max_variations}, the limit is {limits.planner_max_variations}"
            )
        if request.strategy not in STRATEGY_FROM_PB:
            raise invalid_argument(f"unknown strategy {request.strategy}")
        if request.hyde_mode not in HYDE_FROM_PB:
            raise invalid_argument(f"unknown hyde_mode {request.hyde_mode}")
        return PlanInput(
            query=query,
            strategy=STRATEGY_FROM_PB[request.strategy],
            max_variations=request.max_variations or default_variations(limits),
            hyde_mode=resolve_hyde_mode(
                HYDE_FROM_PB[request.hyde_mode],
                limits.planner_hyde_mode,
                llm_configured=self.hyde is not None,
            ),
            history=self.validate_history(request.history),
        )

    def validate_history(self, history: Sequence[planner_pb2.Turn]) -> tuple[Turn, ...]:
        limits = self.settings
        if len(history) > limits.planner_max_history_turns:
            raise invalid_argument(
                f"history has {len(history)} turns, the limit is {limits.planner_max_history_turns}"
            )
        total = sum(len(turn.content) for turn in history)
        if total > limits.planner_max_history_chars:
            raise invalid_argument(
                f"history is {total} characters, the limit is {limits.planner_max_history_chars}"
            )
        turns = []
        for i, turn in enumerate(history):
            if turn.role not in _FROM_USER:
                raise invalid_argument(f"history[{i}].role must be TURN_ROLE_USER or TURN_ROLE_ASSISTANT")
            if not turn.content.strip():
                raise invalid_argument(f"history[{i}].content is empty")
            turns.append(Turn(user=_FROM_USER[turn.role], content=turn.content))
        return tuple(turns)


def default_variations(settings: PlannerSettings) -> int:
    """Dense queries a plan gets when the caller leaves the count to the planner."""
    if settings.planner_mode == "llm":
        return settings.planner_default_variations
    return settings.planner_deterministic_variations


def default_planner(settings: PlannerSettings, llm: LLM | None = None) -> Planner:
    deterministic = deterministic_planner(settings)
    if settings.planner_mode == "llm" and llm is not None:
        return LLMPlanner(llm, deterministic, settings.planner_max_keywords, settings.planner_llm_timeout_s)
    return deterministic


# Who may call the planner (RAGMESH_SERVICE_AUTH=mtls).
CALLERS: Callers = {"Plan": allow(GATEWAY, OPS), "Hyde": allow(GATEWAY, OPS)}


def build_spec(
    settings: PlannerSettings, planner: Planner | None = None, llm: LLM | None = None
) -> ServiceSpec:
    """``planner`` replaces the default planner; ``llm`` (tests: a fake) replaces the one the
    settings would build, and counts as configured whatever the settings say."""
    for name in ("planner_default_variations", "planner_deterministic_variations"):
        if getattr(settings, name) > settings.planner_max_variations:
            raise ValueError(
                f"{name} ({getattr(settings, name)}) exceeds "
                f"planner_max_variations ({settings.planner_max_variations})"
            )
    on_stop: list[Hook] = []
    if llm is None and llm_wanted(settings):
        llm = make_llm(settings)
        on_stop.append(llm.aclose)
    chosen = planner or default_planner(settings, llm)
    writer = HydeWriter(llm, settings.planner_llm_timeout_s) if llm is not None else None
    servicer = PlannerServicer(settings, WithHyde(chosen, writer) if writer else chosen, writer)
    return ServiceSpec(
        name="planner",
        grpc_services=[planner_pb2.DESCRIPTOR.services_by_name["PlannerService"].full_name],
        register=lambda server: planner_pb2_grpc.add_PlannerServiceServicer_to_server(servicer, server),
        on_stop=on_stop,
        multiprocess_safe=True,
        callers=CALLERS,
        # A query, a conversation and a few small fields.
        max_request_bytes=text_request_bytes(
            items=settings.planner_max_history_turns,
            item_overhead=TURN_OVERHEAD_BYTES,
            chars=settings.planner_max_query_chars + settings.planner_max_history_chars,
        ),
        max_concurrent_rpcs=512,
    )
