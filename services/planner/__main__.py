"""``python -m services.planner``: the query planner service."""

from __future__ import annotations

from meshkit.rpc.server import run_service
from meshkit.settings import PlannerSettings
from services.planner.servicer import build_spec


def main() -> None:
    settings = PlannerSettings()
    run_service(build_spec(settings), settings)


if __name__ == "__main__":
    main()
