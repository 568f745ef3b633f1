"""Plans made in the gateway process: the deterministic planner is a few linear passes over the
query (about a millisecond), cheaper than the network hop to the planner service and back.

The planner service stays for what needs a language model: the LLM planner and HyDE. Which one
plans a request is ``gateway_planner`` (see ``meshkit.settings``): with ``auto`` the gateway reads
the same RAGMESH_PLANNER_* settings the planner service does, so a mesh configured for the LLM
planner keeps planning there without a second switch.
"""

from __future__ import annotations

from meshkit.settings import GatewaySettings, PlannerSettings
from ragmesh.narrator.v1 import narrator_pb2
from ragmesh.planner.v1 import planner_pb2
from services.planner.public import (
    DeterministicPlanner,
    HydeMode,
    PlanInput,
    Turn,
    deterministic_planner,
    llm_wanted,
    plan_to_pb,
    strategy_from_pb,
)

# HyDE modes only the planner service can serve (they need its LLM).
NEEDS_SERVICE = frozenset({planner_pb2.HYDE_MODE_FUSION, planner_pb2.HYDE_MODE_SUPPLEMENT})


class LocalPlanner:
    """The deterministic planner with the planner service's limits and defaults."""

    def __init__(self, settings: PlannerSettings) -> None:
        self.settings = settings
        self.planner: DeterministicPlanner = deterministic_planner(settings)

    def serves(self, hyde_mode: planner_pb2.HydeMode) -> bool:
        """Whether a request asking for ``hyde_mode`` can be planned here."""
        return hyde_mode not in NEEDS_SERVICE

    def plan(
        self,
        query: str,
        strategy: planner_pb2.Strategy,
        max_variations: int,
        history: tuple[narrator_pb2.ChatTurn, ...],
    ) -> planner_pb2.Plan:
        """The plan the planner service would give for a request without HyDE (the gateway has
        validated the query, strategy and history against its own limits)."""
        limits = self.settings
        wanted = max_variations or limits.planner_deterministic_variations
        request = PlanInput(
            query=query,
            strategy=strategy_from_pb(strategy),
            max_variations=min(wanted, limits.planner_max_variations),
            hyde_mode=HydeMode.OFF,
            history=tuple(Turn(user=t.role == narrator_pb2.ROLE_USER, content=t.content) for t in history),
        )
        return plan_to_pb(self.planner.plan_sync(request))


def local_planner(settings: GatewaySettings, planner: PlannerSettings | None = None) -> LocalPlanner | None:
    """The in-process planner ``settings`` ask for; None: every plan comes from the service.
    ``planner``: the planner settings (default: read from the environment, as the service does)."""
    if settings.gateway_planner == "service":
        return None
    planner = planner if planner is not None else PlannerSettings()
    if settings.gateway_planner == "auto" and llm_wanted(planner):
        return None
    return LocalPlanner(planner)
